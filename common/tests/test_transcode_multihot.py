"""Multi-hot CSV cells (NVIDIA's gen_csv list text) through recsys_common.transcode, streamed in --chunk_size blocks,
and the bad input the issue names: a cell that is not a list of integers, a list longer than max_hotness."""
import os

import numpy as np
import pytest
import yaml

from recsys_common.datasets import DatasetError, parse_list_cells, read_columns
from recsys_common.feature_spec import FeatureSpec
from recsys_common.transcode import main as transcode_main

SPEC = {
    "feature_spec": {"label": {"dtype": "int8"}, "num_0": {"dtype": "float32"},
                     "cat_0": {"dtype": "int32", "cardinality": "auto"},
                     "tags": {"dtype": "int32", "cardinality": "auto", "max_hotness": 3}},
    # two chunks per mapping, so the streamed blocks of two files are zipped row by row
    "source_spec": {"train": [{"type": "csv", "features": ["label", "num_0", "tags"], "files": ["a.csv"]},
                              {"type": "csv", "features": ["cat_0"], "files": ["b.csv"]}]},
    "channel_spec": {"label": ["label"], "numerical": ["num_0"], "categorical": ["cat_0", "tags"]},
    "metadata": {},
}
TAGS = [[4, 1], [], [7], [0, 9, 2], [3]] * 7   # 35 rows: the blocks of 4 rows do not divide it


def _write(tmp_path, tags_cells=None):
    raw = tmp_path / "raw"
    raw.mkdir()
    cells = tags_cells or [f'"[{", ".join(map(str, t))}]"' for t in TAGS]
    with open(raw / "a.csv", "w") as f:
        for i, cell in enumerate(cells):
            f.write(f"{i % 2},{i / 10},{cell}\n")
    with open(raw / "b.csv", "w") as f:
        f.write("".join(f"{(i * 7) % 11}\n" for i in range(len(cells))))
    with open(raw / "feature_spec.yaml", "w") as f:
        yaml.safe_dump(SPEC, f)
    return raw


@pytest.mark.parametrize("fmt", ["split_binary", "parquet"])
def test_multi_hot_cells_round_trip_in_small_blocks(tmp_path, fmt):
    raw = _write(tmp_path)
    out = transcode_main(["--input", str(raw), "--output", str(tmp_path / "out"), "--format", fmt,
                          "--chunk_size", "4"])
    assert out.cardinality("tags") == 10 and out.cardinality("cat_0") == 11 and out.max_hotness("tags") == 3
    cols = read_columns(FeatureSpec.from_yaml(out.origin), "train")
    expected = np.full((len(TAGS), 3), -1)
    for i, t in enumerate(TAGS):
        expected[i, :len(t)] = t
    np.testing.assert_array_equal(cols["tags"], expected)
    np.testing.assert_array_equal(cols["cat_0"], [(i * 7) % 11 for i in range(len(TAGS))])


def test_list_cells_accept_nvidia_separators():
    got = parse_list_cells(["[1, 2, 3]", "[4 5]", " [ 6 ,7 ] ", "[]"], 3, "f.csv", "tags")
    np.testing.assert_array_equal(got, [[1, 2, 3], [4, 5, -1], [6, 7, -1], [-1, -1, -1]])


@pytest.mark.parametrize("cell,why", [
    ('"[3, x]"', "not a list of non-negative integers"),
    ('"[3, 1.5]"', "not a list of non-negative integers"),
    ('"[3, -1]"', "not a list of non-negative integers"),
    ("7", "not a list of integers"),
    ('"[1, 2, 3, 4]"', "4 ids, more than the spec's max_hotness 3"),
])
def test_bad_multi_hot_cell_names_file_line_and_column_and_writes_nothing(tmp_path, cell, why):
    cells = [f'"[{", ".join(map(str, t))}]"' for t in TAGS]
    cells[22] = cell
    raw = _write(tmp_path, cells)
    out = tmp_path / "out"
    with pytest.raises(DatasetError) as e:
        transcode_main(["--input", str(raw), "--output", str(out), "--chunk_size", "4"])
    assert f"{raw / 'a.csv'}: line 23, column 'tags': {why}" in str(e.value)
    assert not out.exists() and not [n for n in os.listdir(tmp_path) if n != "raw"]   # no output, no staging left


def test_unconvertible_scalar_names_its_line(tmp_path):
    raw = _write(tmp_path)
    lines = (raw / "b.csv").read_text().splitlines()
    lines[30] = "seven"
    (raw / "b.csv").write_text("\n".join(lines) + "\n")
    with pytest.raises(DatasetError, match=r"b\.csv: cannot read .*line 31, column 'cat_0' \(value 'seven'\)"):
        transcode_main(["--input", str(raw), "--output", str(tmp_path / "out"), "--chunk_size", "4"])


def test_an_empty_list_of_a_max_hotness_1_feature_is_refused_in_split_binary(tmp_path):
    spec = {**SPEC, "feature_spec": {**SPEC["feature_spec"],
                                     "tags": {"dtype": "int32", "cardinality": "auto", "max_hotness": 1}}}
    cells = ['"[3]"'] * 10 + ['"[]"'] + ['"[1]"'] * 4
    raw = _write(tmp_path, cells)
    with open(raw / "feature_spec.yaml", "w") as f:
        yaml.safe_dump(spec, f)
    with pytest.raises(DatasetError, match="feature 'tags' row 10 has no id.*max_hotness 2 or more"):
        transcode_main(["--input", str(raw), "--output", str(tmp_path / "out"), "--chunk_size", "4"])
    out = transcode_main(["--input", str(raw), "--output", str(tmp_path / "pq"), "--format", "parquet"])
    assert read_columns(FeatureSpec.from_yaml(out.origin), "train")["tags"][10].tolist() == [-1]   # parquet: fine
