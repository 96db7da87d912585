"""recsys_common.prepare_clicks: a raw click log (header, string ids, label, time) -> a DLRM dataset.

The Avazu sample (real rows: 24 columns, hex ids, ``click`` label) is checked against an independent count written
with the csv module; small generated files cover time splits, transforms, formats and bad input.
"""
import csv
import json
import math
import os
import subprocess
import sys
from collections import Counter

import numpy as np
import pytest

pytest.importorskip("polars")

from recsys_common import prepare_clicks as pc  # noqa: E402
from recsys_common.datasets import read_columns  # noqa: E402
from recsys_common.feature_spec import FeatureSpec  # noqa: E402
from recsys_testing import shared_data_path  # noqa: E402

COMMON = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
AVAZU_CATEGORICAL = ["C1", "banner_pos", "site_id", "site_domain", "site_category", "app_id", "app_domain",
                     "app_category", "device_id", "device_model", "device_type", "device_conn_type", "C14", "C17",
                     "C18", "C19", "C20", "C21"]
AVAZU_NUMERICAL = ["C15", "C16"]


def avazu_path():
    return shared_data_path("avazu", "avazu-train-head999.csv")


def avazu_args(output, *extra):
    return ["--input", avazu_path(), "--output", str(output), "--label", "click",
            "--categorical", *AVAZU_CATEGORICAL, "--numerical", *AVAZU_NUMERICAL, *extra]


def write_csv(path, header, rows, delimiter=","):
    with open(path, "w", newline="") as f:
        writer = csv.writer(f, delimiter=delimiter)
        writer.writerow(header)
        writer.writerows(rows)
    return str(path)


def independent_ids(values, frequency_limit):
    """The documented rule, written again: ids 2.. by decreasing count, ties by value; rare -> 1; missing -> 0."""
    counts = Counter(v for v in values if v != "")
    kept = sorted((v for v, n in counts.items() if n >= frequency_limit), key=lambda v: (-counts[v], v))
    ids = {v: i + 2 for i, v in enumerate(kept)}
    return ids, len(kept) + 2


def test_avazu_matches_an_independent_implementation(tmp_path, capsys):
    out = tmp_path / "avazu"
    result = pc.main(avazu_args(out, "--frequency_limit", "2", "--dictionary_source", "all", "--no_shuffle_train",
                                "--split_fractions", "0.7", "0.1", "0.2", "--seed", "5"))
    with open(avazu_path(), newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 999
    # Split membership from the numpy form of the row hash (the job evaluates the Polars form).
    u = pc.random_unit(np.arange(len(rows), dtype=np.int64), 5)
    members = {"train": np.flatnonzero(u < 0.7), "validation": np.flatnonzero((u >= 0.7) & (u < 0.8)),
               "test": np.flatnonzero(u >= 0.8)}
    assert 600 < len(members["train"]) < 800 and len(members["test"]) > 150
    spec = result["spec"]
    assert spec.metadata["num_samples"] == {k: len(v) for k, v in members.items()}
    assert spec.channel_spec == {"categorical": AVAZU_CATEGORICAL, "numerical": AVAZU_NUMERICAL, "label": ["label"]}
    for split, index in members.items():
        columns = read_columns(spec, split)
        np.testing.assert_array_equal(columns["label"], [rows[i]["click"] == "1" for i in index])
        for name in AVAZU_CATEGORICAL:
            ids, cardinality = independent_ids([r[name] for r in rows], 2)
            assert spec.cardinality(name) == cardinality, name
            expected = [ids.get(rows[i][name], 1) for i in index]
            np.testing.assert_array_equal(columns[name], expected, err_msg=f"{split}/{name}")
        for name in AVAZU_NUMERICAL:
            expected = np.log(np.array([float(rows[i][name]) for i in index]) + 3).astype(np.float16)
            np.testing.assert_array_equal(columns[name], expected)
    # site_id: 122 distinct values in the sample; the dictionary keeps those seen twice or more.
    assert spec.cardinality("site_id") < 122
    report = json.loads((out / "prepare_clicks.json").read_text())
    assert report["values_seen"]["site_id"] == 122 and report["rows"] == 999
    printed = capsys.readouterr().out     # progress: rows done of total, rate, time left
    assert "pass 1 (count): 999 of 999 rows (100.0 %)" in printed and "rows/s" in printed and " left" in printed
    assert "pass 2 (map and write): 999 of 999 rows (100.0 %)" in printed


def test_header_with_a_byte_order_mark(tmp_path):
    path = small_log(tmp_path)
    bom = tmp_path / "bom.csv"
    bom.write_bytes(b"\xef\xbb\xbf" + open(path, "rb").read())
    spec = pc.main(["--input", str(bom), "--output", str(tmp_path / "o"), "--label", "clicked", "--categorical",
                    "day", "ad", "--frequency_limit", "1", "--split_fractions", "0.5", "0", "0.5"])["spec"]
    # The first column is found under its name (without the mark) and read: its dates became ids.
    assert spec.cardinality("day") > 2 and read_columns(spec, "train")["day"].min() >= 2


def test_train_dictionary_makes_values_outside_train_unseen(tmp_path):
    out = tmp_path / "avazu"
    spec = pc.main(avazu_args(out, "--frequency_limit", "1", "--split_fractions", "0.6", "0", "0.4"))["spec"]
    with open(avazu_path(), newline="") as f:
        rows = list(csv.DictReader(f))
    train = pc.random_unit(np.arange(999, dtype=np.int64), 0) < 0.6
    train_ips = {rows[i]["device_model"] for i in np.flatnonzero(train)}
    assert spec.cardinality("device_model") == len(train_ips) + 2
    test_models = [rows[i]["device_model"] for i in np.flatnonzero(~train)]
    unseen = sum(m not in train_ips for m in test_models)
    assert unseen > 10                          # the sample has many rare device models
    test = read_columns(spec, "test")
    assert int((test["device_model"] == 1).sum()) == unseen
    assert "validation" not in spec.source_spec


def test_random_split_is_the_same_for_any_block_size_and_shuffles_train_only(tmp_path):
    a = pc.main(avazu_args(tmp_path / "a", "--block_rows", "100000"))["spec"]
    b = pc.main(avazu_args(tmp_path / "b", "--block_rows", "64", "--no_shuffle_train"))["spec"]
    for split in ("validation", "test"):
        ca, cb = read_columns(a, split), read_columns(b, split)
        for name in ["label"] + AVAZU_CATEGORICAL:
            np.testing.assert_array_equal(ca[name], cb[name])
    ta, tb = read_columns(a, "train"), read_columns(b, "train")
    assert not np.array_equal(ta["site_id"], tb["site_id"])                   # shuffled ...
    assert sorted(ta["site_id"].tolist()) == sorted(tb["site_id"].tolist())   # ... the same rows


def small_log(tmp_path, name="log.csv", delimiter=","):
    """20 rows over 10 days (2 a day, ISO dates), label, a categorical and a numerical column."""
    rows = []
    for i in range(20):
        day = f"2026-01-{1 + i // 2:02d}"
        rows.append([day, i % 2, ["a", "b", "c", "d"][i % 4] if i != 3 else "", str(i * 10)])
    return write_csv(tmp_path / name, ["day", "clicked", "ad", "price"], rows, delimiter)


def test_time_split_keeps_train_before_validation_before_test(tmp_path):
    path = small_log(tmp_path)
    spec = pc.main(["--input", path, "--output", str(tmp_path / "o"), "--label", "clicked", "--categorical", "ad",
                    "--numerical", "price", "--numerical_transform", "none", "--split", "time", "--time_column",
                    "day", "--split_fractions", "0.6", "0.2", "0.2", "--frequency_limit", "1",
                    "--no_shuffle_train"])["spec"]
    price = {s: read_columns(spec, s)["price"] for s in ("train", "validation", "test")}
    assert price["train"].tolist() == [float(10 * i) for i in range(12)]
    assert price["validation"].tolist() == [120.0, 130.0, 140.0, 150.0]
    assert price["test"].tolist() == [160.0, 170.0, 180.0, 190.0]
    ad = read_columns(spec, "train")["ad"]
    assert ad[3] == 0                       # the empty field: id 0 (missing)
    assert spec.metadata["split"]["train_until"] == "2026-01-06"


def test_numerical_transforms(tmp_path):
    path = small_log(tmp_path)
    common = ["--input", path, "--label", "clicked", "--categorical", "ad", "--numerical", "price"]
    logged = pc.main(common + ["--output", str(tmp_path / "log"), "--split_fractions", "0.5", "0", "0.5"])["spec"]
    values = np.concatenate([read_columns(logged, s)["price"] for s in ("train", "test")]).astype(np.float64)
    np.testing.assert_allclose(np.sort(values), np.log(np.arange(20) * 10.0 + 3), rtol=1e-3)
    assert logged.numpy_dtype("price") == np.float16
    std = pc.main(common + ["--output", str(tmp_path / "std"), "--numerical_transform", "standardize",
                            "--split_fractions", "0.5", "0", "0.5"])["spec"]
    train = read_columns(std, "train")["price"].astype(np.float64)
    assert abs(train.mean()) < 1e-6 and abs(train.std() - 1) < 1e-6
    assert std.numpy_dtype("price") == np.float32


def test_tsv_parquet_input_parquet_output_and_several_files(tmp_path):
    import polars as pl
    tsv = small_log(tmp_path, "log.tsv", delimiter="\t")
    frame = pl.read_csv(tsv, separator="\t", infer_schema=False)
    frame.head(7).write_parquet(tmp_path / "part0.parquet")
    frame.slice(7).write_parquet(tmp_path / "part1.parquet")
    flags = ["--label", "clicked", "--categorical", "ad", "--numerical", "price", "--frequency_limit", "1",
             "--no_shuffle_train"]
    a = pc.main(["--input", tsv, "--output", str(tmp_path / "a"), *flags])["spec"]
    b = pc.main(["--input", str(tmp_path / "part0.parquet"), str(tmp_path / "part1.parquet"), "--output",
                 str(tmp_path / "b"), "--output_format", "parquet", *flags])["spec"]
    assert b.source_spec["train"][0]["type"] == "parquet"
    for split in a.source_spec:
        ca, cb = read_columns(a, split), read_columns(b, split)
        for name in ("label", "ad"):
            np.testing.assert_array_equal(ca[name], cb[name])
        np.testing.assert_allclose(ca["price"], cb["price"], rtol=1e-3)   # float16 split-binary, float32 parquet


# ----------------------------------------------------------------------------------------------- inference mapping
def test_apply_and_encoder_map_new_rows_as_training_did(tmp_path):
    dataset = tmp_path / "avazu"
    spec = pc.main(avazu_args(dataset, "--no_shuffle_train", "--split_fractions", "0.7", "0", "0.3"))["spec"]
    applied = pc.main(["apply", "--dataset", str(dataset), "--input", avazu_path(), "--output",
                       str(tmp_path / "applied")])["spec"]
    everything = read_columns(applied, "test")
    test_rows = np.flatnonzero(pc.random_unit(np.arange(999, dtype=np.int64), 0) >= 0.7)
    written = read_columns(spec, "test")
    for name in ["label"] + AVAZU_CATEGORICAL + AVAZU_NUMERICAL:
        np.testing.assert_array_equal(everything[name][test_rows], written[name], err_msg=name)
    assert applied.cardinality("site_id") == spec.cardinality("site_id")

    encoder = pc.ClickEncoder.load(str(dataset))
    with open(avazu_path(), newline="") as f:
        first = next(csv.DictReader(f))
    new = {k: [first[k], first[k]] for k in AVAZU_CATEGORICAL + AVAZU_NUMERICAL}
    new["site_id"] = ["never-seen", ""]
    encoded = encoder.encode(new)
    site = AVAZU_CATEGORICAL.index("site_id")
    assert encoded["categorical"][:, site].tolist() == [1, 0]      # unseen -> 1, missing -> 0
    row0 = {k: v[0] for k, v in everything.items()}
    others = [i for i in range(len(AVAZU_CATEGORICAL)) if i != site]
    assert encoded["categorical"][0, others].tolist() == [int(row0[AVAZU_CATEGORICAL[i]]) for i in others]
    np.testing.assert_allclose(encoded["numerical"][0], [math.log(float(first[c]) + 3) for c in AVAZU_NUMERICAL],
                               rtol=1e-6)
    served = encoder.served_inputs(new)
    assert served["numerical"].shape == (2, 2) and served[f"cat_{site}"].tolist() == [[1], [0]]
    assert len(served) == 1 + len(AVAZU_CATEGORICAL)


# ----------------------------------------------------------------------------------------------- bad input
def test_bad_input_is_named_and_nothing_is_written(tmp_path):
    path = small_log(tmp_path)
    out = tmp_path / "out"
    base = ["--input", path, "--output", str(out), "--label", "clicked", "--frequency_limit", "1"]
    with pytest.raises(pc.ClickLogError, match=r"log\.csv: categorical column\(s\) \['adx'\] not in the header"):
        pc.main(base + ["--categorical", "adx"])
    lines = open(path).read().splitlines()
    lines[5] = lines[5].replace(",40", ",4o")      # data row 4 is line 6
    bad = tmp_path / "bad.csv"
    bad.write_text("\n".join(lines) + "\n")
    with pytest.raises(pc.ClickLogError, match=r"bad\.csv:6: column 'price': '4o' is not a number"):
        pc.main(["--input", str(bad), *base[2:], "--categorical", "ad", "--numerical", "price"])
    lines = open(path).read().splitlines()
    lines[9] = lines[9].replace(",0,", ",yes,", 1)
    bad.write_text("\n".join(lines) + "\n")
    with pytest.raises(pc.ClickLogError, match=r"bad\.csv:10: column 'clicked': 'yes' is not a 0/1 label"):
        pc.main(["--input", str(bad), *base[2:], "--categorical", "ad"])
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    with pytest.raises(pc.ClickLogError, match=r"empty\.csv: the file is empty"):
        pc.main(["--input", str(empty), *base[2:], "--categorical", "ad"])
    header_only = tmp_path / "header.csv"
    header_only.write_text("day,clicked,ad,price\n")
    with pytest.raises(pc.ClickLogError, match="no data rows"):
        pc.main(["--input", str(header_only), *base[2:], "--categorical", "ad"])
    lines = open(path).read().splitlines()
    truncated = tmp_path / "truncated.csv"
    truncated.write_text("\n".join(lines[:8] + [lines[8].rsplit(",", 1)[0]] + lines[9:]) + "\n")
    with pytest.raises(pc.ClickLogError, match=r"truncated\.csv:9: 3 field\(s\), but the header has 4"):
        pc.main(["--input", str(truncated), *base[2:], "--categorical", "ad"])
    truncated.write_text("\n".join(lines[:12] + [lines[12] + ",7"] + lines[13:]))     # no final newline either
    with pytest.raises(pc.ClickLogError, match=r"truncated\.csv:13: 5 field\(s\)"):
        pc.main(["--input", str(truncated), *base[2:], "--categorical", "ad"])
    truncated.write_text("\n".join(lines[:3] + ['2026-01-02,1,"b,20']) + "\n")
    with pytest.raises(pc.ClickLogError, match=r"truncated\.csv: cannot be read as CSV"):
        pc.main(["--input", str(truncated), *base[2:], "--categorical", "ad"])
    assert not out.exists() and sorted(os.listdir(tmp_path)) == ["bad.csv", "empty.csv", "header.csv", "log.csv",
                                                                 "truncated.csv"]


def test_avazu_time_split_on_one_hour_is_refused(tmp_path):
    """The sample's 999 rows all have hour 14102100: a time split cannot give validation/test rows."""
    with pytest.raises(pc.ClickLogError, match=r"validation split would have no rows .* 'hour' has 1 distinct"):
        pc.main(avazu_args(tmp_path / "o", "--split", "time", "--time_column", "hour"))
    assert not (tmp_path / "o").exists()


def test_output_directory_refused_unless_overwrite_and_cli_exit_status(tmp_path):
    path = small_log(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    args = ["--input", path, "--output", str(out), "--label", "clicked", "--categorical", "ad", "--frequency_limit",
            "1", "--split_fractions", "0.5", "0", "0.5"]
    env = dict(os.environ, PYTHONPATH=COMMON)
    proc = subprocess.run([sys.executable, "-m", "recsys_common.prepare_clicks", *args], env=env,
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "output directory is not empty (notes.txt)" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    pc.main(args + ["--overwrite"])
    pc.main(args + ["--overwrite", "--seed", "3"])      # replaces its own earlier outputs, keeps the user's file
    assert (out / "notes.txt").read_text() == "mine"
    assert FeatureSpec.from_yaml(str(out / "feature_spec.yaml")).metadata["split"]["seed"] == 3


def test_a_run_stopped_in_pass_2_does_not_count_again(tmp_path, monkeypatch):
    out, clean = tmp_path / "out", tmp_path / "clean"
    args = avazu_args(out, "--split_fractions", "0.7", "0.1", "0.2")

    class Killed(Exception):
        pass

    class DiesInPass2(pc.DatasetWriter):
        def write(self, columns):
            raise Killed("stopped in pass 2")

    monkeypatch.setattr(pc, "DatasetWriter", DiesInPass2)
    with pytest.raises(Killed):
        pc.main(args)
    work = str(out) + ".prepare_clicks.work"
    assert not out.exists() and sorted(os.listdir(work))[-1] == "pass1.json"
    monkeypatch.undo()

    def no_counting(*a, **k):
        raise AssertionError("pass 1 ran again")
    monkeypatch.setattr(pc, "count_values", no_counting)
    spec = pc.main(args)["spec"]
    assert not os.path.exists(work)                     # removed once the output is complete
    monkeypatch.undo()
    reference = pc.main(avazu_args(clean, "--split_fractions", "0.7", "0.1", "0.2"))["spec"]
    for split in ("train", "validation", "test"):
        a, b = read_columns(spec, split), read_columns(reference, split)
        for name in ["label"] + AVAZU_CATEGORICAL + AVAZU_NUMERICAL:
            np.testing.assert_array_equal(a[name], b[name])
    # Other settings: the saved counts are not reused.
    with pytest.raises(Killed):
        monkeypatch.setattr(pc, "DatasetWriter", DiesInPass2)
        pc.main(avazu_args(tmp_path / "o2", "--seed", "1"))
    monkeypatch.undo()
    monkeypatch.setattr(pc, "count_values", no_counting)
    with pytest.raises(AssertionError, match="pass 1 ran again"):
        pc.main(avazu_args(tmp_path / "o2", "--seed", "2"))
