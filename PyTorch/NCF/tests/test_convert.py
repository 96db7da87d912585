import os

import numpy as np
import pandas as pd
import pytest

import convert
from convert import ConversionError
from dataloading import load_dataset

ML100K_LINES = [  # user item rating timestamp, tab-separated like u.data
    (10, 5, 3, 100), (10, 6, 4, 300), (10, 7, 5, 200), (10, 6, 1, 50),  # (10, 6) twice: earliest kept
    (20, 5, 2, 10), (20, 8, 3, 20),
    (30, 9, 4, 5), (30, 5, 4, 7), (30, 6, 4, 6),
]


def write(path, text):
    with open(path, "w") as f:
        f.write(text)
    return str(path)


@pytest.fixture
def udata(tmp_path):
    d = tmp_path / "ml-100k"
    d.mkdir()
    return write(d / "u.data", "".join("\t".join(map(str, r)) + "\n" for r in ML100K_LINES))


def test_leave_one_out_protocol(udata):
    split = convert.convert_ratings(udata, valid_negative=3, seed=1)
    # ids factorised in order of first appearance: users 10,20,30 -> 0,1,2; items 5,6,7,8,9 -> 0..4
    assert (split.num_users, split.num_items) == (3, 5)
    # user 10: (6) at t=50, (5) t=100, (7) t=200, latest is (6, t=300) but (10,6) was already seen at t=50 -> dropped;
    # so the latest distinct interaction is item 7 (t=200)
    test = dict(zip(split.test_users.tolist(), split.test_candidates[:, 0].tolist()))
    assert test == {0: 2, 1: 3, 2: 0}
    train = sorted(zip(split.train_users.tolist(), split.train_items.tolist()))
    assert train == [(0, 0), (0, 1), (1, 0), (2, 1), (2, 4)]
    # negatives never among the user's training items; seeded
    train_set = set(train)
    for u, row in zip(split.test_users, split.test_candidates):
        assert all((int(u), int(i)) not in train_set for i in row[1:])
    again = convert.convert_ratings(udata, valid_negative=3, seed=1)
    np.testing.assert_array_equal(split.test_candidates, again.test_candidates)


def test_written_dataset_round_trips_through_the_feature_spec(udata, tmp_path):
    split = convert.convert_ratings(udata, valid_negative=4, seed=1)
    out = str(tmp_path / "out")
    convert.write_split(split, out)
    data = load_dataset(out)
    assert data.samples_per_series == 5 and data.num_items == 5
    np.testing.assert_array_equal(data.test_items.reshape(-1, 5), split.test_candidates)
    assert data.test_labels.reshape(-1, 5)[:, 0].tolist() == [1, 1, 1]
    assert sorted(os.listdir(out)) == ["feature_spec.yaml", "test.parquet", "train.parquet"]


def test_byo_csv_and_ml20m_layouts(tmp_path):
    byo = write(tmp_path / "mine.csv", "user_id,item_id,timestamp\n1,2,3\n1,3,4\n2,2,1\n2,4,2\n")
    assert convert.convert_ratings(byo, valid_negative=1).num_items == 3
    d = tmp_path / "ml-20m"
    d.mkdir()
    ml20 = write(d / "ratings.csv", "userId,movieId,rating,timestamp\n1,2,3.5,3\n1,3,4.0,4\n2,2,1.0,1\n2,4,5,2\n")
    assert convert.detect_format(ml20) == "ml-20m"
    assert convert.convert_ratings(ml20, valid_negative=1).num_users == 2


def test_ml1m_double_colon_layout(tmp_path):
    path = write(tmp_path / "ratings.dat", "1::1193::5::978300760\n1::661::3::978302109\n2::1193::4::978300000\n"
                                           "2::3408::4::978300001\n")
    split = convert.convert_ratings(path, valid_negative=0)
    assert split.test_candidates.shape == (2, 1)


@pytest.mark.parametrize("text, message", [
    ("1\t2\t3\t4\n5\t6\t7\n", r"line 2: expected 4 '\\t'-separated fields .* found 3"),
    ("1\t2\t3\t4\n5\t6\t7\t8\t9\n", r"line 2: expected 4 .* found 5"),
    ("1\t2\t3\t4\nabc\t6\t7\t8\n", r"line 2: column 'user_id' must be an integer, got 'abc'"),
    ("1\t2\t3\t4\n1\t2.5\t3\t4\n", r"line 2: column 'item_id' must be an integer, got '2.5'"),
    ("", r"empty file"),
    ("1\t2\t3\t4\n1\t3\t3\t5\n2\t2\t3\t4\n", r"1 user\(s\) have a single distinct interaction \(user id\(s\) 2\)"),
])
def test_bad_input_names_file_and_line_and_writes_nothing(tmp_path, text, message):
    d = tmp_path / "ml-100k"
    d.mkdir()
    path = write(d / "u.data", text)
    out = tmp_path / "out"
    with pytest.raises(ConversionError, match=message) as err:
        split = convert.convert_ratings(path, valid_negative=1)
        convert.write_split(split, str(out))
    assert str(path) in str(err.value)
    assert not out.exists() and os.listdir(tmp_path) == ["ml-100k"]


def test_cli_exits_non_zero_with_the_message(tmp_path, capsys):
    bad = write(tmp_path / "mine.csv", "user_id,item_id,timestamp\n1,2\n")
    assert convert.main(["--path", bad, "--output", str(tmp_path / "out")]) == 2
    assert "mine.csv: line 2: expected 3" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_paper_split_files(tmp_path):
    prefix = str(tmp_path / "toy")
    write(prefix + ".train.rating", "0\t1\t5\t10\n0\t2\t4\t11\n1\t0\t3\t12\n")
    write(prefix + ".test.rating", "0\t3\t5\t20\n1\t2\t4\t21\n")
    write(prefix + ".test.negative", "(0,3)\t0\t4\n(1,2)\t1\t3\n")
    split = convert.convert_paper_split(prefix)
    assert split.test_candidates.tolist() == [[3, 0, 4], [2, 1, 3]]
    assert (split.num_users, split.num_items) == (2, 5)
    write(prefix + ".test.negative", "(0,3)\t0\t4\n(1,2)\t1\n")
    with pytest.raises(ConversionError, match=r"toy.test.negative: line 2: expected 2 negatives"):
        convert.convert_paper_split(prefix)
