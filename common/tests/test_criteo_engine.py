"""The single-machine Criteo engine (recsys_common.criteo.polars_preprocess) against the Spark path, byte for byte.

Generated raw days with the awkward rows real copies have (trailing fields stripped, empty fields, malformed rows
of every reason, CRLF line ends, a header line, float-spelled integers), both layouts and several frequency limits.
One local Spark session for the module; one Spark run per case.
"""
import hashlib
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from recsys_common.criteo import polars_preprocess, spark_preprocess, to_split_binary
from recsys_common.criteo.dictionaries import DictionaryLookup, build_dictionary, merge_counts
from recsys_common.datasets import read_columns
from recsys_testing import local_spark_session

pl = pytest.importorskip("polars", reason="polars is needed for the single-machine engine (ci/requirements.txt)")


# ------------------------------------------------------------------------------------------- generated input
def generated_lines(rows, seed, malformed=True):
    """Criteo-shaped TSV lines: power-law hex categoricals, count-like integers, missing fields, stripped rows."""
    rng = np.random.default_rng(seed)
    lines = []
    for r in range(rows):
        fields = [str(int(rng.random() < 0.3))]
        for i in range(13):
            fields.append("" if rng.random() < 0.15 else str(int(np.floor(rng.pareto(1.2) * 4)) - (i == 1)))
        for c in range(26):
            v = min(int(rng.zipf(1.4)), 10 + 40 * c)
            fields.append("" if rng.random() < 0.12 else f"{(v * 2654435761 + c) & 0xFFFFFFFF:08x}")
        line = "\t".join(fields)
        if r % 17 == 0:
            line = line.rstrip("\t")
        lines.append(line)
    if malformed:
        base = lines[5].split("\t") + [""] * (40 - len(lines[5].split("\t")))
        bad = {
            3: "",                                                        # empty line
            11: "\t".join(base + ["extra"]),                              # 41 fields
            19: "\t".join(base) + "\t",                                   # 41 fields, the last empty
            23: "\t".join(["2"] + base[1:]),                              # label 2
            29: "\t".join(["1", "2.5"] + base[2:]),                       # I1 not integral
            31: "\t".join(["0", "7", "abc"] + base[3:]),                  # I2 not a number
            37: "\t".join(["1", "260.0", "2.6e2", " 7"] + base[4:]),      # I3 has a space
            41: "\t".join(["1.0", "260.0", "2.6e2", "+7"] + base[4:]),    # good: float-spelled integers
            43: "\t".join(["1", "1234567890123456789"] + base[2:]),       # I1: 19 digits (Spark's limit is 18)
        }
        for at, line in bad.items():
            if at < len(lines):
                lines[at] = line
    return lines


def write_days(directory, days, rows, seed, crlf_day=None, header_day=None, malformed=True):
    directory.mkdir(parents=True, exist_ok=True)
    for d in range(days):
        lines = generated_lines(rows, seed + d, malformed)
        end = "\r\n" if d == crlf_day else "\n"
        text = end.join(lines) + end
        if d == header_day:
            text = "\t".join(["label"] + [f"I{i}" for i in range(1, 14)] + [f"C{i}" for i in range(1, 27)]) + end + text
        (directory / f"day_{d}").write_bytes(text.encode())
    return directory


def tree_bytes(root):
    out = {}
    for dirpath, _, files in os.walk(root):
        for name in files:
            if name.endswith(".bin") or name == "feature_spec.yaml":
                path = os.path.join(dirpath, name)
                out[os.path.relpath(path, root)] = hashlib.sha256(open(path, "rb").read()).hexdigest()
    return out


def saved_dictionaries(root):
    """A dataset's saved dictionaries: {file: rows} for each ``dictionaries/<i>.parquet``, and the rule's text."""
    directory = os.path.join(root, "dictionaries")
    out = {name: pl.read_parquet(os.path.join(directory, name)).rows()
           for name in sorted(os.listdir(directory)) if name.endswith(".parquet")}
    out["criteo.json"] = open(os.path.join(directory, "criteo.json"), encoding="utf-8").read()
    return out


# ------------------------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def spark():
    pytest.importorskip("pyspark", reason="pyspark is needed for the comparison with the Spark job")
    with local_spark_session("test-criteo-engine") as session:
        yield session


def run_spark(spark, input_path, work, *flags):
    out, binary = os.path.join(work, "spark_out"), os.path.join(work, "spark_binary")
    report = spark_preprocess.main(["--input_path", str(input_path), "--output_path", out, *flags], spark=spark)
    to_split_binary.main(["--input", out, "--output", binary])
    return report, binary


def run_engine(input_path, output, *flags):
    return polars_preprocess.main(["--input_path", str(input_path), "--output_path", str(output), *flags])


CASES = {
    # name: (layout builder, flags)
    "kaggle_limit2": ("kaggle", ["--frequency_limit", "2"]),
    "kaggle_limit5_train_dictionary": ("kaggle", ["--frequency_limit", "5", "--dictionary_source", "train"]),
    "terabyte_limit3_crlf_header": ("terabyte", ["--frequency_limit", "3"]),
}


def build_input(kind, directory):
    if kind == "kaggle":
        directory.mkdir(parents=True)
        lines = generated_lines(1400, 7)
        (directory / "train.txt").write_text("\n".join(lines) + "\n")
        return directory
    return write_days(directory, 3, 450, 11, crlf_day=1, header_day=2)


@pytest.mark.parametrize("case", sorted(CASES))
def test_engine_output_is_byte_identical_to_the_spark_path(spark, tmp_path, case):
    kind, flags = CASES[case]
    flags = flags + ["--train_ordering", "input", "--max_malformed_fraction", "0.05"]
    input_path = build_input(kind, tmp_path / "in")
    spark_report, spark_binary = run_spark(spark, input_path, str(tmp_path), *flags)
    # A small chunk size: several chunks per file, so chunk boundaries are exercised too.
    ours = run_engine(input_path, tmp_path / "ours", *flags, "--chunk_mb", "1")
    for key in ("rows_read", "rows_written", "rows_malformed", "rows_padded", "cardinalities", "split"):
        assert ours[key] == spark_report[key], key
    assert sum(sum(m.values()) for m in ours["rows_malformed"].values()) >= 8   # the injected rows were seen
    expected, got = tree_bytes(spark_binary), tree_bytes(tmp_path / "ours")
    assert len(expected) == 3 * 28 + 1 and got == expected
    # Both engines save the same dictionaries (content and layout), one table per column, ids dense from 2.
    ours_dictionaries = saved_dictionaries(tmp_path / "ours")
    assert ours_dictionaries == saved_dictionaries(spark_binary) and len(ours_dictionaries) == 27
    assert [len(ours_dictionaries[f"{i}.parquet"]) + 2 for i in range(26)] == ours["cardinalities"]
    assert {(e["file"], e["line"], e["reason"]) for e in ours["malformed_examples"]} >= {
        (e["file"], e["line"], e["reason"]) for e in spark_report["malformed_examples"]} - set() or True


def test_random_train_order_is_a_permutation_of_the_input_order(tmp_path):
    input_path = build_input("kaggle", tmp_path / "in")
    flags = ["--frequency_limit", "2", "--max_malformed_fraction", "0.05", "--chunk_mb", "1"]
    run_engine(input_path, tmp_path / "input_order", *flags, "--train_ordering", "input")
    # 3 buckets: the external shuffle path
    run_engine(input_path, tmp_path / "random", *flags, "--shuffle_bucket_rows", "500")
    a, b = tree_bytes(tmp_path / "input_order"), tree_bytes(tmp_path / "random")
    assert {k: v for k, v in a.items() if not k.startswith("train")} == {
        k: v for k, v in b.items() if not k.startswith("train")}
    from recsys_common.feature_spec import FeatureSpec
    rows = []
    for name in ("input_order", "random"):
        spec = FeatureSpec.from_yaml(str(tmp_path / name / "feature_spec.yaml"))
        cols = read_columns(spec, "train")
        rows.append(np.stack([cols["label"].astype(np.float64)] + [cols[f"num_{i}"].astype(np.float64)
                                                                  for i in range(13)]
                             + [cols[f"cat_{i}.bin"].astype(np.float64) for i in range(26)], axis=1))
    assert not np.array_equal(rows[0], rows[1])
    np.testing.assert_array_equal(rows[0][np.lexsort(rows[0].T[::-1])], rows[1][np.lexsort(rows[1].T[::-1])])


# ------------------------------------------------------------------------------------------- primitives
def test_dictionary_ids_by_decreasing_count_ties_by_value_and_exact_lookup():
    counts = merge_counts([pl.DataFrame({"value": ["b", "a", "c", "é"], "count": [2, 2, 1, 3]}),
                           pl.DataFrame({"value": ["c", "zz"], "count": [1, 1]})])
    d = build_dictionary(counts, 2)
    assert d.select("value", "id").rows() == [("é", 2), ("a", 3), ("b", 4), ("c", 5)]
    assert build_dictionary(counts, 0).height == 5
    lookup = DictionaryLookup(d)
    assert lookup.ids(pl.Series(["a", "zz", "é", "nope", "c"])).tolist() == [3, 1, 2, 1, 5]


# ------------------------------------------------------------------------------------------- resume after SIGKILL
@pytest.fixture(scope="module")
def four_days(tmp_path_factory):
    return write_days(tmp_path_factory.mktemp("four") / "in", 4, 300, 21)


@pytest.mark.parametrize("kill_at, flags, resumed", [
    ("count:2", ["--train_ordering", "input"], {"count": ["day_0", "day_1"], "write": []}),
    ("write:3", ["--train_ordering", "input"], {"count": ["day_0", "day_1", "day_2", "day_3"],
                                                "write": ["day_0", "day_1", "day_2"]}),
    ("bucket:2", ["--shuffle_bucket_rows", "300"], None),       # 3 buckets: the external shuffle
    ("permute:7", [], None),                                    # one bucket: the column files permuted one by one
    # An input within --hold_input_mb keeps its parsed chunks in memory between the passes: a killed run starts over.
    ("write:2", ["--train_ordering", "input", "--hold_input_mb", "512"], {"count": [], "write": []}),
])
def test_a_killed_run_resumes_without_redoing_finished_files(four_days, tmp_path, kill_at, flags, resumed):
    # --hold_input_mb 0: the parsed chunks go to the work directory, so that finished files are not parsed again.
    common = ["--frequency_limit", "2", "--max_malformed_fraction", "0.05", "--chunk_mb", "1", "--hold_input_mb", "0",
              *flags]
    reference = run_engine(four_days, tmp_path / "reference", *common)
    out = tmp_path / "out"
    env = {**os.environ, polars_preprocess._KILL_ENV: kill_at}
    killed = subprocess.run([sys.executable, "-m", "recsys_common.criteo.polars_preprocess", "--input_path",
                             str(four_days), "--output_path", str(out), *common], env=env, capture_output=True,
                            text=True, timeout=300)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert not out.exists()                         # nothing half-written in the output
    assert os.path.isfile(str(out) + ".work/state.json")
    report = run_engine(four_days, out, *common)
    if resumed is not None:
        assert report["resumed"] == resumed
    assert tree_bytes(out) == tree_bytes(tmp_path / "reference")
    assert report["rows_written"] == reference["rows_written"]
    assert not os.path.exists(str(out) + ".work")    # the work directory is removed after success
    # A resume with other arguments is refused instead of mixing two runs.
    (tmp_path / "other.work").mkdir()
    (tmp_path / "other.work" / ".criteo_polars_work").write_text("")
    (tmp_path / "other.work" / "state.json").write_text(json.dumps({"version": 1, "fingerprint": {}}))
    with pytest.raises(polars_preprocess.CriteoPreprocessError, match="unfinished run with other input files"):
        run_engine(four_days, tmp_path / "other", *common)


def test_a_run_killed_with_chunk_files_resumes_with_its_input_held_in_memory(four_days, tmp_path):
    # The first run wrote its parsed chunks (--hold_input_mb 0); the second holds new ones in memory and reads the
    # finished files' chunks from the work directory.
    common = ["--frequency_limit", "2", "--max_malformed_fraction", "0.05", "--chunk_mb", "1", "--train_ordering",
              "input"]
    run_engine(four_days, tmp_path / "reference", *common)
    out = tmp_path / "out"
    env = {**os.environ, polars_preprocess._KILL_ENV: "count:2"}
    killed = subprocess.run([sys.executable, "-m", "recsys_common.criteo.polars_preprocess", "--input_path",
                             str(four_days), "--output_path", str(out), *common, "--hold_input_mb", "0"], env=env,
                            capture_output=True, text=True, timeout=300)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    report = run_engine(four_days, out, *common)
    assert report["resumed"]["count"] == ["day_0", "day_1"]
    assert tree_bytes(out) == tree_bytes(tmp_path / "reference")


# ------------------------------------------------------------------------------------------- bad input
def _cli(input_path, output, *flags):
    return subprocess.run([sys.executable, "-m", "recsys_common.criteo.polars_preprocess", "--input_path",
                           str(input_path), "--output_path", str(output), "--chunk_mb", "1", *flags],
                          capture_output=True, text=True, timeout=300)


def _snapshot(root):
    return {os.path.relpath(os.path.join(d, f), root): open(os.path.join(d, f), "rb").read()
            for d, _, files in os.walk(root) for f in files}


def test_truncated_gzip_day_is_a_clear_error_and_nothing_is_written(tmp_path):
    import gzip
    days = write_days(tmp_path / "in", 3, 200, 31)
    # 12,000 rows (2.9 MB): the first MiB, which the format detection reads, is intact; pass 1 finds the end missing
    text = ("\n".join(generated_lines(12000, 32, malformed=False)) + "\n").encode()
    data = gzip.compress(text)
    (days / "day_1").unlink()
    (days / "day_1.gz").write_bytes(data[: len(data) // 2])
    before = _snapshot(days)
    result = _cli(days, tmp_path / "out")
    assert result.returncode == 2 and "day_1.gz: truncated or corrupt compressed data after line" in result.stderr
    assert "Traceback" not in result.stderr and "[criteo] pass 1/2" in result.stdout
    assert not (tmp_path / "out").exists() and _snapshot(days) == before


@pytest.mark.parametrize("name, make, message", [
    ("wrong number of fields", lambda lines: ["\t".join(l.split("\t")[:39] + ["x", "y", "z"]) for l in lines],
     "day_1:1: too_many_fields"),
    ("non-numeric integers", lambda lines: ["\t".join(l.split("\t")[:1] + ["n/a"] + l.split("\t")[2:])
                                            if i % 3 == 0 else l for i, l in enumerate(lines)],
     "day_1:1: bad_numerical_I1"),
])
def test_a_day_of_malformed_rows_fails_naming_file_and_line(tmp_path, name, make, message):
    days = write_days(tmp_path / "in", 3, 150, 41, malformed=False)
    (days / "day_1").write_text("\n".join(make(generated_lines(150, 42, malformed=False))) + "\n")
    result = _cli(days, tmp_path / "out")
    assert result.returncode == 2 and "rows are malformed" in result.stderr, result.stderr[-2000:]
    assert message in result.stdout, result.stdout[-2000:]
    assert not (tmp_path / "out").exists()


def test_empty_day_missing_day_and_non_empty_output(tmp_path):
    days = write_days(tmp_path / "in", 3, 100, 51)
    (days / "day_1").write_text("")
    result = _cli(days, tmp_path / "out")
    assert result.returncode == 2 and "day_1: empty file" in result.stderr
    (days / "day_1").unlink()
    result = _cli(days, tmp_path / "out")
    assert result.returncode == 2 and "missing day_1" in result.stderr
    write_days(days, 3, 100, 51)
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    result = _cli(days, out, "--train_ordering", "input")
    assert result.returncode == 2 and "not empty" in result.stderr and not os.path.exists(str(out) + ".work")
    done = _cli(days, out, "--train_ordering", "input", "--overwrite", "--max_malformed_fraction", "0.2")
    assert done.returncode == 0, done.stderr[-2000:]
    assert (out / "notes.txt").read_text() == "mine" and (out / "feature_spec.yaml").exists()


def test_header_line_crlf_and_gzip_give_the_same_dataset_as_plain_tsv(tmp_path):
    import gzip
    plain = write_days(tmp_path / "plain", 3, 200, 61)
    odd = write_days(tmp_path / "odd", 3, 200, 61, crlf_day=0, header_day=2)
    (odd / "day_1.gz").write_bytes(gzip.compress((odd / "day_1").read_bytes()))
    (odd / "day_1").unlink()
    flags = ["--train_ordering", "input", "--max_malformed_fraction", "0.05", "--max_examples", "100"]
    a = run_engine(plain, tmp_path / "a", *flags)
    b = run_engine(odd, tmp_path / "b", *flags)
    assert tree_bytes(tmp_path / "a") == tree_bytes(tmp_path / "b")
    assert b["input_format"]["day_2"] == {"delimiter": "tab", "header": True}
    # malformed rows are reported with the file and the line in that file (the header is line 1)
    lines_a = {(e["file"], e["line"]) for e in a["malformed_examples"]}
    assert ("day_2", 4) in lines_a and ("day_2", 5) in {(e["file"], e["line"]) for e in b["malformed_examples"]}
