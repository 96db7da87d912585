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


def write_days(directory, days, rows, seed, crlf_day=None, header_day=None):
    directory.mkdir(parents=True, exist_ok=True)
    for d in range(days):
        lines = generated_lines(rows, seed + d)
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


# ------------------------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def spark():
    pytest.importorskip("pyspark", reason="pyspark is needed for the comparison with the Spark job")
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession
    session = (SparkSession.builder.master("local[2]").appName("test-criteo-engine")
               .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", "2").config("spark.driver.memory", "1g")
               .config("spark.driver.extraJavaOptions", "-XX:TieredStopAtLevel=1")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


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
