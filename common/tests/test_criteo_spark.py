"""Criteo raw TSV -> Spark -> parquet -> split binary, checked against an independent Python reading of the raw rows.

One local Spark session (2 cores) is shared by the module: each start costs ~10-20 s.
"""
import json
import math
import os
import subprocess
import sys
from collections import Counter

import numpy as np
import pytest

from recsys_common.criteo import layout as criteo_layout
from recsys_common.criteo import spark_preprocess, to_split_binary
from recsys_common.datasets import open_reader, read_columns
from recsys_testing import local_spark_session, shared_data_path

pytest.importorskip("pyspark", reason="pyspark is needed for the Criteo Spark job (ci/requirements.txt)")

N_NUM, N_CAT = 13, 26


# ------------------------------------------------------------------------------------------- independent reference
def parse_raw(line):
    """label, [13 ints or None], [26 strings or None]; rows with < 40 fields padded; None if malformed."""
    fields = line.rstrip("\n").rstrip("\r").split("\t")
    if len(fields) > 40 or fields[0] not in ("0", "1"):
        return None
    fields += [""] * (40 - len(fields))
    try:
        ints = [int(f) if f else None for f in fields[1:14]]
    except ValueError:
        return None
    return int(fields[0]), ints, [f if f else None for f in fields[14:]]


def read_raw(path):
    with open(path, encoding="utf-8") as f:
        return [parse_raw(line) for line in f.read().split("\n") if line != ""]


def expected_numerical(ints):
    # Spark computes log in double, stores float32; the binary holds float16.
    return np.array([np.float16(np.float32(math.log(x + 3))) if x is not None and x > -3 else np.float16(0)
                     for x in ints], dtype=np.float16)


def expected_dictionaries(rows, frequency_limit):
    """Per column: value -> id (2.. by decreasing count, ties by value); rare values absent (-> 1)."""
    dictionaries = []
    for c in range(N_CAT):
        counts = Counter(r[2][c] for r in rows if r is not None and r[2][c] is not None)
        frequent = sorted((v for v, n in counts.items() if n >= max(frequency_limit, 1)), key=lambda v: (-counts[v], v))
        dictionaries.append({v: i + 2 for i, v in enumerate(frequent)})
    return dictionaries


def expected_ids(row, dictionaries):
    return [0 if v is None else dictionaries[c].get(v, 1) for c, v in enumerate(row[2])]


def binary_rows(spec, split):
    """label [N], numerical float16 [N, 13], categorical [N, 26] from the split-binary files."""
    cols = read_columns(spec, split)
    label = cols["label"].astype(np.int64)
    numerical = np.stack([cols[f"num_{i}"] for i in range(N_NUM)], axis=1) if len(label) else np.zeros((0, N_NUM))
    categorical = (np.stack([cols[f"cat_{i}.bin"].astype(np.int64) for i in range(N_CAT)], axis=1)
                   if len(label) else np.zeros((0, N_CAT), np.int64))
    return label, numerical, categorical


# ------------------------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def spark():
    with local_spark_session("test-criteo") as session:
        yield session


def run_pipeline(spark, input_path, work, *extra):
    out, binary = os.path.join(work, "spark_out"), os.path.join(work, "binary")
    report = spark_preprocess.main(["--input_path", str(input_path), "--output_path", out, *extra], spark=spark)
    spec = to_split_binary.main(["--input", out, "--output", binary])
    return report, spec, out


@pytest.fixture(scope="module")
def kaggle_1999(spark, tmp_path_factory):
    """The 1999 real rows as a Kaggle train.txt: 1714 train, 143 test, 142 validation; dictionaries from train rows
    only (the other runs use the default, all rows)."""
    raw_path = shared_data_path("criteo", "kaggle-train-head1999.tsv")
    work = tmp_path_factory.mktemp("kaggle")
    (work / "in").mkdir()
    os.symlink(raw_path, work / "in" / "train.txt")
    report, spec, out = run_pipeline(spark, work / "in", str(work), "--frequency_limit", "2",
                                     "--dictionary_source", "train")
    return read_raw(raw_path), report, spec, out


@pytest.fixture(scope="module")
def terabyte_stripped(spark, tmp_path_factory):
    """Terabyte layout: day_0 = the 1999 rows (train, input order), day_1 = the same first 1000 rows with trailing
    empty fields stripped (test = its first 500 lines, validation = the last 500)."""
    work = tmp_path_factory.mktemp("stripped")
    (work / "in").mkdir()
    os.symlink(shared_data_path("criteo", "kaggle-train-head1999.tsv"), work / "in" / "day_0")
    os.symlink(shared_data_path("criteo", "kaggle-train-head1000.stripped-trailing-tabs.txt"), work / "in" / "day_1")
    return run_pipeline(spark, work / "in", str(work), "--frequency_limit", "2", "--train_ordering", "input")


def _row(label, ints, cats):
    return "\t".join([label] + ints + cats)


def _cats(first="", rest="x"):
    return [first] + [rest] * (N_CAT - 1)


TINY_DAYS = {
    # C1 values: aa x3, bb x2, dd x2, cc x1 -> with frequency limit 2: aa=2, bb=3, dd=4 (tie with bb, by value), cc=1.
    "day_0": [
        _row("1", ["0", "-1", "-2", "-3", "5"] + [""] * 8, _cats("aa")),
        _row("0", ["7"] + [""] * 12, _cats("bb")),
        _row("2", ["1"] * 13, _cats("aa")),                              # malformed: label
        _row("0", ["1", "1.5"] + ["1"] * 11, _cats("aa")),               # malformed: I2 not an integer
        _row("1", ["1"] * 13, _cats("zz") + ["extra"]),                  # malformed: 41 fields
        "1\t3",                                                          # padded: 38 missing fields
    ],
    "day_1": [
        _row("0", [""] * 13, _cats("dd")),
        _row("1", ["100"] + [""] * 12, _cats("cc")),
        "",                                                              # malformed: empty line
    ],
    "day_2": [                                                           # split day: 4 lines -> test 2, validation 2
        _row("1", ["2"] * 13, _cats("aa")),
        _row("0", [""] * 13, _cats("dd")),
        _row("1", ["x"] + [""] * 12, _cats("aa")),                       # malformed (validation): I1
        _row("0", ["4"] * 13, _cats("bb")),
    ],
}


@pytest.fixture(scope="module")
def tiny_days(tmp_path_factory):
    directory = tmp_path_factory.mktemp("tiny") / "in"
    directory.mkdir()
    for name, lines in TINY_DAYS.items():
        (directory / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return directory


@pytest.fixture(scope="module")
def tiny_terabyte(spark, tiny_days, tmp_path_factory):
    work = tmp_path_factory.mktemp("tiny_out")
    return run_pipeline(spark, tiny_days, str(work), "--frequency_limit", "2", "--train_ordering", "input",
                        "--max_malformed_fraction", "0.5")


# ------------------------------------------------------------------------------------------- Kaggle 1999 rows
def test_kaggle_split_sizes_and_report(kaggle_1999):
    raw, report, spec, out = kaggle_1999
    assert len(raw) == 1999 and all(r is not None for r in raw)
    assert report["input"]["kind"] == "kaggle"
    assert report["rows_written"] == {"train": 1714, "test": 143, "validation": 142}
    assert report["rows_malformed"] == {"train": {}, "test": {}, "validation": {}}
    for split, n in report["rows_written"].items():
        reader = open_reader(spec, split, batch_size=512)
        assert reader.num_samples == n
        assert sum(len(b["label"]) for b in reader) == n
    assert spec.metadata["num_samples"] == report["rows_written"]
    saved = json.load(open(os.path.join(out, "preprocess_report.json")))
    assert saved["rows_written"] == report["rows_written"]


def test_kaggle_held_out_rows_match_raw_in_order(kaggle_1999):
    raw, report, spec, _ = kaggle_1999
    dictionaries = expected_dictionaries(raw[:1714], 2)
    for split, rows in (("test", raw[1714:1857]), ("validation", raw[1857:])):
        label, numerical, categorical = binary_rows(spec, split)
        np.testing.assert_array_equal(label, [r[0] for r in rows])
        expected = np.stack([expected_numerical(r[1]) for r in rows])
        np.testing.assert_allclose(numerical.astype(np.float32), expected.astype(np.float32), rtol=1e-3, atol=0)
        np.testing.assert_array_equal(categorical, [expected_ids(r, dictionaries) for r in rows])
    # missing -> 0, in both channels
    label, numerical, categorical = binary_rows(spec, "test")
    missing_num = np.array([[x is None for x in r[1]] for r in raw[1714:1857]])
    missing_cat = np.array([[v is None for v in r[2]] for r in raw[1714:1857]])
    assert missing_num.any() and missing_cat.any()
    assert np.all(numerical[missing_num] == 0) and np.all(categorical[missing_cat] == 0)
    assert np.all(categorical[~missing_cat] >= 1)
    # values of the held-out rows never seen (twice) in train map to the rare id 1
    dictionaries = expected_dictionaries(raw[:1714], 2)
    unseen = np.array([[v is not None and v not in d for v, d in zip(r[2], dictionaries)] for r in raw[1714:1857]])
    assert unseen.any() and np.all(categorical[unseen] == 1)


def test_kaggle_dictionaries_and_train_rows(kaggle_1999):
    raw, report, spec, out = kaggle_1999
    dictionaries = expected_dictionaries(raw[:1714], 2)
    cardinalities = [len(d) + 2 for d in dictionaries]
    assert report["cardinalities"] == cardinalities
    assert [spec.cardinality(f"cat_{i}.bin") for i in range(N_CAT)] == cardinalities
    for i, card in enumerate(cardinalities):
        assert spec.numpy_dtype(f"cat_{i}.bin") == (np.int8 if card < 127 else np.int16)
    assert spec.numpy_dtype("num_0") == np.float16 and spec.numpy_dtype("label") == np.bool_
    model_size = json.load(open(os.path.join(out, "model_size.json")))
    assert model_size["_c14"] == cardinalities[0] - 1 and len(model_size) == N_CAT
    # train: the first 1714 rows, shuffled: same rows as a multiset, not in input order
    label, numerical, categorical = binary_rows(spec, "train")
    expected = np.array([[r[0]] + expected_ids(r, dictionaries) for r in raw[:1714]])
    got = np.concatenate([label[:, None], categorical], axis=1)
    assert not np.array_equal(got, expected), "train rows should be shuffled (--train_ordering random)"
    np.testing.assert_array_equal(got[np.lexsort(got.T[::-1])], expected[np.lexsort(expected.T[::-1])])


def test_both_engines_save_equal_dictionaries_of_the_real_sample(kaggle_1999, tmp_path):
    """The single-machine engine on the same 1999 real rows and flags saves the Spark path's dictionaries, and they
    are the independent reading's (train rows, frequency limit 2)."""
    import polars as pl
    from recsys_common.criteo import polars_preprocess
    from recsys_common.criteo.dictionaries import load_criteo_rule, load_dictionaries
    raw, report, spec, out = kaggle_1999
    spark_dataset = spec.base_directory
    polars_preprocess.main(["--input_path", os.path.join(os.path.dirname(out), "in"),
                            "--output_path", str(tmp_path / "ours"), "--frequency_limit", "2",
                            "--dictionary_source", "train"])
    for i in range(N_CAT):
        name = os.path.join("dictionaries", f"{i}.parquet")
        ours = pl.read_parquet(tmp_path / "ours" / name)
        assert ours.equals(pl.read_parquet(os.path.join(spark_dataset, name))), name
        assert ours.schema == {"value": pl.Utf8, "count": pl.UInt64, "id": pl.Int64}
    assert load_criteo_rule(str(tmp_path / "ours")) == load_criteo_rule(spark_dataset)
    assert load_criteo_rule(spark_dataset)["frequency_limit"] == 2
    expected = expected_dictionaries(raw[:1714], 2)
    saved = load_dictionaries(spark_dataset, N_CAT)
    assert [dict(zip(d["value"].to_list(), d["id"].to_list())) for d in saved] == expected


# ------------------------------------------------------------------------------------------- stripped trailing tabs
def test_stripped_rows_are_padded_and_agree_with_full_rows(terabyte_stripped):
    report, spec, _ = terabyte_stripped
    assert report["input"] == {"kind": "terabyte", "train_files": ["day_0"], "split_file": "day_1"}
    assert report["rows_written"] == {"train": 1999, "test": 500, "validation": 500}
    assert report["rows_malformed"] == {"train": {}, "test": {}, "validation": {}}
    # 502 of the 1000 stripped lines keep 40 fields (data README); the others were padded.
    assert report["rows_padded"]["train"] == 0
    assert report["rows_padded"]["test"] + report["rows_padded"]["validation"] == 1000 - 502
    train = binary_rows(spec, "train")
    for split, start in (("test", 0), ("validation", 500)):
        held_out = binary_rows(spec, split)
        for got, full in zip(held_out, train):
            np.testing.assert_array_equal(got, full[start:start + 500])


# ------------------------------------------------------------------------------------------- public CSV copies
CSV_HEADER = ",".join(["label"] + [f"I{i}" for i in range(1, 14)] + [f"C{i}" for i in range(1, 27)])


def _as_public_csv(line, row_number):
    """A raw TSV line as public CSV copies write it: commas, integer features as floats (pandas writes an integer
    column with missing values as float: 260 -> 260.0); every 7th row spells one in exponent form (2.6e2)."""
    fields = line.split("\t")
    for i in range(1, min(14, len(fields))):
        if fields[i]:
            fields[i] = f"{int(fields[i]):.3e}" if (row_number % 7 == 0 and abs(int(fields[i])) < 1000) \
                else f"{int(fields[i])}.0"
    return ",".join(fields)


def _csv_copy(source, target, malformed_at=()):
    """``source`` (TSV) rewritten as a CSV with a header line; ``malformed_at``: {line index: (field, value)} rows
    inserted before those data lines, copies of the row with one integer field made non-integral."""
    lines = open(source, encoding="utf-8").read().split("\n")
    lines = [line for line in lines if line != ""]
    out = [CSV_HEADER]
    inserted = {}
    for index, line in enumerate(lines):
        if index in malformed_at:
            field, value = malformed_at[index]
            bad = _as_public_csv(line, index).split(",")
            bad[field] = value
            out.append(",".join(bad))
            inserted[index] = len(out)      # its 1-based line number in the file
        out.append(_as_public_csv(line, index))
    with open(target, "w", encoding="utf-8") as f:
        f.write("\n".join(out) + "\n")
    return inserted


def test_public_csv_copy_with_header_and_float_integers_equals_the_tsv_result(spark, terabyte_stripped, tmp_path):
    """The TSV run above (day_0 = 1999 rows, day_1 = the stripped 1000), rewritten as public CSV copies are: commas,
    a header line, integers as 260.0 / 2.600e+02, plus two malformed rows (I3 = 2.5, I5 = abc) late in day_0.
    Small Spark blocks (64 KiB) put them past the first block, so their reported line numbers are counted."""
    (tmp_path / "in").mkdir()
    inserted = _csv_copy(shared_data_path("criteo", "kaggle-train-head1999.tsv"), tmp_path / "in" / "day_0",
                         {1500: (3, "2.5"), 1900: (5, "abc")})
    _csv_copy(shared_data_path("criteo", "kaggle-train-head1000.stripped-trailing-tabs.txt"), tmp_path / "in" / "day_1")
    assert open(tmp_path / "in" / "day_0").readline().startswith("label,I1,I2")
    previous = spark.conf.get("spark.sql.files.maxPartitionBytes")
    spark.conf.set("spark.sql.files.maxPartitionBytes", str(64 * 1024))
    try:
        report, spec, _ = run_pipeline(spark, tmp_path / "in", str(tmp_path), "--frequency_limit", "2",
                                       "--train_ordering", "input")
    finally:
        spark.conf.set("spark.sql.files.maxPartitionBytes", previous)
    assert report["input_format"] == {"day_0": {"delimiter": "comma", "header": True},
                                      "day_1": {"delimiter": "comma", "header": True}}
    assert report["split"]["lines_in_split_file"] == 1000 and report["split"]["split_file_header"] is True
    assert report["rows_malformed"] == {"train": {"bad_numerical_I3": 1, "bad_numerical_I5": 1},
                                        "test": {}, "validation": {}}
    examples = sorted((e["file"], e["line"], e["reason"]) for e in report["malformed_examples"])
    assert examples == [("day_0", inserted[1500], "bad_numerical_I3"), ("day_0", inserted[1900], "bad_numerical_I5")]
    assert inserted[1500] > 300    # a later block than the first (64 KiB is ~300 rows)
    tsv_report, tsv_spec, _ = terabyte_stripped
    assert report["rows_written"] == tsv_report["rows_written"] and report["cardinalities"] == tsv_report["cardinalities"]
    for split in ("train", "test", "validation"):
        for got, expected in zip(binary_rows(spec, split), binary_rows(tsv_spec, split)):
            np.testing.assert_array_equal(got, expected)


def test_integral_values_in_any_float_spelling(spark):
    values = ["260", "260.0", "2.6e2", "2.600e+02", "1e3", "-0.0", "+7", ".5e1", "007", "-3",
              "260.", "123456789012345678.000",
              "2.5", "abc", "nan", "inf", "1e300", "9007199254740993.0", "12345678901234567890", "1,0", " 5",
              "4503599627370496.5", "1.0000000000000000001", "1e-400", "1.5e0", "123456789012345e-1",
              "1234567890123456e-1", '"5"',
              # the fast path (a long that prints back as the text) stops at _INTEGER_RE's 18 digits
              "999999999999999999", "-999999999999999999", "1000000000000000000", "9223372036854775807", "-0"]
    df = spark.createDataFrame([(v,) for v in values], "t string")
    got = [r["v"] for r in df.select(spark_preprocess.integral_value(df["t"]).alias("v")).collect()]
    assert dict(zip(values, got)) == {
        "260": 260, "260.0": 260, "2.6e2": 260, "2.600e+02": 260, "1e3": 1000, "-0.0": 0, "+7": 7, ".5e1": 5,
        "007": 7, "-3": -3, "260.": 260, "123456789012345678.000": 123456789012345678,
        "2.5": None, "abc": None, "nan": None, "inf": None, "1e300": None,
        "9007199254740993.0": 9007199254740993,        # no exponent: read exactly, not through a double
        "12345678901234567890": None, "1,0": None, " 5": None,
        "4503599627370496.5": None, "1.0000000000000000001": None, "1e-400": None, "1.5e0": None,
        "123456789012345e-1": None, "1234567890123456e-1": None, '"5"': None,
        "999999999999999999": 999999999999999999, "-999999999999999999": -999999999999999999,
        "1000000000000000000": None, "9223372036854775807": None, "-0": 0}


def test_header_and_delimiter_detection(tmp_path):
    sniff = criteo_layout.sniff_format
    tsv = shared_data_path("criteo", "kaggle-train-head1999.tsv")
    assert sniff(tsv) == criteo_layout.FileFormat("\t", False)
    cases = {
        "label,I1,I2\n": (",", True), "Label\tI1\tI2\n": ("\t", True), "\ufeffclick,_c1,_c2\n": (",", True),
        "y,a,b\n": (",", True),                       # a label name is enough
        "x,I1,I2,C1\n": (",", True),                  # column names are enough
        "1,260.0,,68fd1e64\n": (",", False),          # data
        "1.0,260.0\n": (",", False),                  # a numeric label field is never a header
        "2,5,7\n": (",", False),                      # not 0/1 but numeric: data (reported as bad_label)
        "garbage,here,now\n": (",", False),           # neither a label name nor column names: data (malformed)
        "": ("\t", False),
    }
    for i, (text, (sep, header)) in enumerate(cases.items()):
        path = tmp_path / f"f{i}"
        path.write_text(text, encoding="utf-8")
        assert sniff(str(path)) == criteo_layout.FileFormat(sep, header), text
    gz = tmp_path / "day_0.gz"
    import gzip
    with gzip.open(gz, "wt") as f:
        f.write("label,I1\n1,2\n")
    assert sniff(str(gz)) == criteo_layout.FileFormat(",", True)
    # explicit flags win over detection
    path = tmp_path / "f1"
    assert sniff(str(path), header="no") == criteo_layout.FileFormat("\t", False)
    assert sniff(str(path), header="yes", delimiter="comma") == criteo_layout.FileFormat(",", True)
    with pytest.raises(criteo_layout.CriteoInputError, match="--header must be one of"):
        sniff(str(path), header="maybe")


# ------------------------------------------------------------------------------------------- tiny generated days
def test_tiny_days_malformed_rows_counted_reported_and_excluded(tiny_terabyte):
    report, spec, _ = tiny_terabyte
    assert report["rows_read"] == {"train": 9, "test": 2, "validation": 2}
    assert report["rows_malformed"] == {
        "train": {"bad_label": 1, "bad_numerical_I2": 1, "too_many_fields": 1, "empty_line": 1},
        "test": {}, "validation": {"bad_numerical_I1": 1}}
    assert report["rows_written"] == {"train": 5, "test": 2, "validation": 1}
    assert report["rows_padded"]["train"] == 1
    examples = {(e["file"], e["reason"]): e for e in report["malformed_examples"]}
    assert examples[("day_2", "bad_numerical_I1")]["line"] == 3          # the split day's lines are numbered
    assert examples[("day_0", "bad_label")]["text"].startswith("2\t1\t1")
    assert ("day_0", "too_many_fields") in examples and ("day_1", "empty_line") in examples
    label, numerical, categorical = binary_rows(spec, "validation")
    np.testing.assert_array_equal(label, [0])                            # only the good last line is left
    assert categorical[0, 0] == 3                                        # "bb"


def test_tiny_days_frequency_limit_and_numerical_transform(tiny_terabyte):
    report, spec, _ = tiny_terabyte
    # C1 over the good rows of all days: aa 2 (day_0 row 1, day_2 row 1), bb 2, dd 2, cc 1 -> limit 2:
    # ids by count then value: aa=2, bb=3, dd=4; cc rare=1. The other columns: "x" everywhere but the padded row.
    assert report["cardinalities"][0] == 5 and report["cardinalities"][1] == 3
    label, numerical, categorical = binary_rows(spec, "train")             # input order
    np.testing.assert_array_equal(label, [1, 0, 1, 0, 1])
    np.testing.assert_array_equal(categorical[:, 0], [2, 3, 0, 4, 1])      # aa, bb, (padded row) missing, dd, cc
    np.testing.assert_array_equal(categorical[2], np.zeros(N_CAT))         # padded row: every categorical missing
    assert np.all(categorical[[0, 1, 3, 4], 1:] == 2)                       # "x" is the only frequent value
    f = lambda x: np.float16(np.float32(math.log(x + 3)))
    np.testing.assert_array_equal(numerical[0, :5], [f(0), f(-1), f(-2), 0, f(5)])  # -3: log(0) undefined -> 0
    assert np.all(numerical[0, 5:] == 0) and np.all(numerical[3] == 0)            # missing -> 0
    np.testing.assert_array_equal(numerical[2], [f(3)] + [0] * 12)                # padded row "1\t3"
    np.testing.assert_array_equal(numerical[4, 0], f(100))
    test_label, test_num, test_cat = binary_rows(spec, "test")
    np.testing.assert_array_equal(test_label, [1, 0])
    np.testing.assert_array_equal(test_cat[:, 0], [2, 4])
    np.testing.assert_array_equal(test_num[0], [f(2)] * 13)


def test_too_many_malformed_rows_fail_without_output(spark, tiny_days, tmp_path):
    out = tmp_path / "out"
    with pytest.raises(spark_preprocess.CriteoPreprocessError, match=r"5 of 13 rows are malformed"):
        spark_preprocess.main(["--input_path", str(tiny_days), "--output_path", str(out),
                               "--max_malformed_fraction", "0.1"], spark=spark)
    assert not out.exists()
    assert os.listdir(tmp_path) == [], "temporary output left behind"


# ------------------------------------------------------------------------------------------- no Spark needed
def test_layout_discovery_and_errors(tmp_path):
    assert criteo_layout.split_boundaries("kaggle", 45_840_617) == (39_291_958, 42_566_288)
    assert criteo_layout.split_boundaries("terabyte", 5) == (0, 3)
    for name in ("day_0", "day_1", "day_2.gz"):
        (tmp_path / name).write_text("")
    found = criteo_layout.discover_input(str(tmp_path))
    assert found.kind == "terabyte" and [os.path.basename(p) for p in found.train_files] == ["day_0", "day_1"]
    assert os.path.basename(found.split_file) == "day_2.gz"
    (tmp_path / "day_4").write_text("")
    with pytest.raises(criteo_layout.CriteoInputError, match="missing day_3"):
        criteo_layout.discover_input(str(tmp_path))
    (tmp_path / "day_3").write_text("")
    (tmp_path / "day_3.gz").write_text("")
    with pytest.raises(criteo_layout.CriteoInputError, match="day 3 is present twice"):
        criteo_layout.discover_input(str(tmp_path))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(criteo_layout.CriteoInputError, match="neither day_0"):
        criteo_layout.discover_input(str(empty))
    (empty / "train.txt").write_text("")
    assert criteo_layout.discover_input(str(empty)).kind == "kaggle"


def test_converter_rejects_non_spark_output(tmp_path):
    with pytest.raises(to_split_binary.ConversionError, match="cardinalities.json: not found"):
        to_split_binary.main(["--input", str(tmp_path), "--output", str(tmp_path / "bin")])
    assert not (tmp_path / "bin").exists()


def test_entry_points_help_and_light_imports():
    code = ("import sys, recsys_common.criteo.spark_preprocess, recsys_common.criteo.to_split_binary;"
            "bad = [m for m in ('pyspark', 'torch', 'tensorflow') if m in sys.modules]; print(bad); sys.exit(bool(bad))")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).returncode == 0
    for module in ("spark_preprocess", "to_split_binary"):
        result = subprocess.run([sys.executable, "-m", f"recsys_common.criteo.{module}", "--help"],
                                capture_output=True, text=True)
        assert result.returncode == 0 and "--" in result.stdout
    result = subprocess.run([sys.executable, "-m", "recsys_common.criteo.spark_preprocess",
                             "--input_path", "/nonexistent/criteo", "--output_path", "/tmp/never"],
                            capture_output=True, text=True)
    assert result.returncode == 2 and "/nonexistent/criteo: input path does not exist" in result.stderr


# ------------------------------------------------------------------------------------------- outputs keep user files
def _tree_bytes(directory):
    return {os.path.relpath(os.path.join(r, n), directory): open(os.path.join(r, n), "rb").read()
            for r, _, names in os.walk(directory) for n in names if not n.startswith(".recsys_outputs")}


def test_spark_output_into_the_input_directory_keeps_the_input_and_the_users_notes(spark, tmp_path):
    """The issue's scenario: --output_path is the directory holding the raw days and notes.txt; the split-binary
    conversion then writes into the same directory."""
    for name, lines in TINY_DAYS.items():
        (tmp_path / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    (tmp_path / "notes.txt").write_text("my notes")
    inputs = _tree_bytes(tmp_path)
    job = ["--input_path", str(tmp_path), "--output_path", str(tmp_path), "--frequency_limit", "2",
           "--max_malformed_fraction", "0.5"]
    with pytest.raises(FileExistsError, match="not empty"):
        spark_preprocess.main(job, spark=spark)
    spark_preprocess.main(job + ["--overwrite"], spark=spark)
    assert {k: v for k, v in _tree_bytes(tmp_path).items() if k in inputs} == inputs
    first = _tree_bytes(tmp_path)
    # A re-run that fails part-way (too many malformed rows) leaves the finished output as it was.
    with pytest.raises(spark_preprocess.CriteoPreprocessError):
        spark_preprocess.main(job[:-1] + ["0.1", "--overwrite"], spark=spark)
    assert _tree_bytes(tmp_path) == first
    convert = ["--input", str(tmp_path), "--output", str(tmp_path)]
    with pytest.raises(FileExistsError, match="not empty"):
        to_split_binary.main(convert)
    spec = to_split_binary.main(convert + ["--overwrite"])
    assert len(read_columns(spec, "train")["label"]) == 5 and len(read_columns(spec, "test")["label"]) == 2
    after = _tree_bytes(tmp_path)
    assert {k: v for k, v in after.items() if k in first} == first    # the Spark output (its input) is untouched
    # Re-running the job replaces only its own files: the conversion's files, the input and the notes stay.
    spark_preprocess.main(job + ["--overwrite"], spark=spark)
    again = _tree_bytes(tmp_path)
    assert {k: again[k] for k in inputs} == inputs and (tmp_path / "train" / "label.bin").exists()
    assert sorted(k for k in again if k.endswith(".parquet")) and "cardinalities.json" in again


def test_split_binary_conversion_refuses_to_replace_a_file_it_did_not_write(tmp_path):
    spark_out = tmp_path / "spark"
    (spark_out / "train").mkdir(parents=True)
    (spark_out / "cardinalities.json").write_text(json.dumps([3] * N_CAT))
    binary = tmp_path / "binary"
    binary.mkdir()
    (binary / "feature_spec.yaml").write_text("the user's own spec\n")
    with pytest.raises(FileExistsError, match="feature_spec.yaml: exists and was not written by this tool"):
        to_split_binary.main(["--input", str(spark_out), "--output", str(binary), "--splits", "train", "--overwrite"])
    assert _tree_bytes(binary) == {"feature_spec.yaml": b"the user's own spec\n"}


def test_split_binary_conversion_prints_rows_done_of_total(tmp_path, capsys):
    """Long conversions show progress: rows done of the total (read from the parquet footers), rate, time left."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from recsys_common.criteo import CATEGORICAL_COLUMNS, LABEL_COLUMN, NUMERICAL_COLUMNS
    spark_out = tmp_path / "spark"
    (spark_out / "train").mkdir(parents=True)
    (spark_out / "cardinalities.json").write_text(json.dumps([3] * N_CAT))
    rows = 1000
    table = {LABEL_COLUMN: pa.array(np.arange(rows) % 2, pa.int8())}
    table.update({name: pa.array(np.full(rows, 0.5), pa.float32()) for name in NUMERICAL_COLUMNS})
    table.update({name: pa.array(np.arange(rows) % 3, pa.int32()) for name in CATEGORICAL_COLUMNS})
    for part in range(2):
        pq.write_table(pa.table(table), spark_out / "train" / f"part-{part}.parquet")
    spec = to_split_binary.main(["--input", str(spark_out), "--output", str(tmp_path / "binary"), "--splits", "train",
                                 "--block_rows", "300"])
    assert len(read_columns(spec, "train")["label"]) == 2 * rows
    out = capsys.readouterr().out
    assert "[criteo] train: 2,000 of 2,000 rows (100.0 %)" in out and " left" in out


def test_local_master_runs_the_throughput_collector_unless_the_user_sets_java_options():
    """The driver JVM of a local run gets ParallelGC (spark_settings' measured choice); a cluster's executors keep
    their own settings; a user's --spark_conf for the driver's options replaces the job's."""
    settings = lambda *argv: spark_preprocess.spark_settings(
        spark_preprocess.parse_args(["--input_path", "in", "--output_path", "out", *argv]))
    assert settings()["spark.driver.extraJavaOptions"] == "-XX:+UseParallelGC"
    assert settings("--master", "local[2]")["spark.driver.extraJavaOptions"] == "-XX:+UseParallelGC"
    cluster = settings("--master", "spark://head:7077")
    assert "spark.driver.extraJavaOptions" not in cluster and "spark.executor.extraJavaOptions" not in cluster
    mine = settings("--spark_conf", "spark.driver.extraJavaOptions=-Xss4m")
    assert mine["spark.driver.extraJavaOptions"] == "-Xss4m"
