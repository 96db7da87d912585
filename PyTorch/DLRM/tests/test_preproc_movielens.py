"""MovieLens-1M -> CTR split-binary dataset (preproc/movielens_ctr.py) and the logistic-regression floor on it."""
import gzip
import os

import numpy as np
import pytest

from recsys_common.datasets import open_reader, read_columns
from recsys_common.feature_spec import FeatureSpec
from recsys_testing import shared_data_path

from preproc import logistic_baseline, movielens_ctr

RATINGS_IN_SHARED_FILE = 487_650


@pytest.fixture(scope="module")
def ml1m_dir():
    return shared_data_path("movielens", "ml-1m")


@pytest.fixture(scope="module")
def ctr_dataset(ml1m_dir, tmp_path_factory):
    output = str(tmp_path_factory.mktemp("ml1m") / "ctr")
    spec = movielens_ctr.main(["--input_dir", ml1m_dir, "--output", output])
    return output, spec


def _raw_ratings(ml1m_dir):
    with gzip.open(os.path.join(ml1m_dir, "ratings.users-1-2999.dat.gz"), "rt", encoding="latin-1") as f:
        return np.array([line.strip().split("::") for line in f if line.strip()], dtype=np.int64)


def test_layout_and_channels(ctr_dataset):
    output, spec = ctr_dataset
    assert set(spec.channel_spec) == {"categorical", "numerical", "label"}
    assert spec.channel_spec["categorical"][:2] == ["user_id", "movie_id"]
    assert spec.cardinality("user_id") == 6040 and spec.cardinality("movie_id") == 3883
    assert spec.cardinality("age") == 7 and spec.cardinality("occupation") == 21 and spec.cardinality("gender") == 2
    assert spec.numpy_dtype("movie_year") == np.float16 and spec.numpy_dtype("label") == np.bool_
    assert spec.numpy_dtype("user_id") == np.int16
    for split in ("train", "test"):
        for name in ("label.bin", "numerical.bin", "user_id.bin", "genre_2.bin"):
            assert os.path.isfile(os.path.join(output, split, name))
    reader = open_reader(spec, "train", batch_size=4096)
    batch = next(iter(reader))
    assert batch["categorical"].shape == (4096, 9) and batch["categorical"].dtype == np.int64
    assert batch["numerical"].shape == (4096, 3) and batch["label"].shape == (4096,)
    assert set(np.unique(batch["label"])) == {0.0, 1.0}


def test_time_ordered_split_and_labels_match_raw(ctr_dataset, ml1m_dir):
    output, spec = ctr_dataset
    raw = _raw_ratings(ml1m_dir)
    assert len(raw) == RATINGS_IN_SHARED_FILE
    train = read_columns(spec, "train")
    test = read_columns(spec, "test")
    num_train = int(round(len(raw) * 0.9))
    assert len(train["label"]) == num_train and len(test["label"]) == len(raw) - num_train
    # The test split is the latest 10 % of ratings in time order (ties in file order).
    order = np.argsort(raw[:, 3], kind="stable")
    expected_test = raw[order[num_train:]]
    np.testing.assert_array_equal(test["user_id"], expected_test[:, 0] - 1)      # ml-1m user ids are 1..6040
    np.testing.assert_array_equal(test["label"], expected_test[:, 2] >= 4)
    assert spec.metadata["train_cutoff_timestamp"] <= expected_test[:, 3].min()
    # Train holds exactly the other ratings (shuffled): same labels and users as a multiset.
    expected_train = raw[order[:num_train]]
    assert train["label"].sum() == (expected_train[:, 2] >= 4).sum()
    np.testing.assert_array_equal(np.bincount(train["user_id"], minlength=6040),
                                  np.bincount(expected_train[:, 0] - 1, minlength=6040))
    assert not np.all(np.diff(train["user_id"].astype(np.int64)) >= 0), "train rows should be shuffled"


def test_side_features_join(ctr_dataset, ml1m_dir):
    _, spec = ctr_dataset
    test = read_columns(spec, "test")
    # movies.dat: MovieID 1 = Toy Story (1995), Animation|Children's|Comedy.
    users = {int(line.split("::")[0]): line.strip().split("::")
             for line in open(os.path.join(ml1m_dir, "users.dat"), encoding="latin-1")}
    some_user = int(test["user_id"][0]) + 1
    gender, age, occupation = users[some_user][1], int(users[some_user][2]), int(users[some_user][3])
    assert test["gender"][0] == (0 if gender == "F" else 1)
    assert test["age"][0] == movielens_ctr.AGE_BUCKETS.index(age)
    assert test["occupation"][0] == occupation
    movie_ids = sorted(int(line.split("::")[0]) for line in open(os.path.join(ml1m_dir, "movies.dat"), encoding="latin-1"))
    toy_story_row = movie_ids.index(1)
    toy = np.flatnonzero(test["movie_id"] == toy_story_row)
    assert toy.size > 0, "Toy Story is rated in the test period of the shared file"
    i = toy[0]
    genres = movielens_ctr.GENRES
    assert [test["genre_0"][i], test["genre_1"][i], test["genre_2"][i]] == [
        genres.index("Animation") + 1, genres.index("Children's") + 1, genres.index("Comedy") + 1]
    assert test["genre_count"][i] == np.float16(3 / 6)
    assert np.all(np.isfinite(test["movie_year"].astype(np.float32)))
    assert abs(float(test["movie_year"].astype(np.float32).mean())) < 2.0
    assert test["movie_age"].astype(np.float32).min() >= 0


def test_bad_users_file_names_line_and_leaves_no_output(ml1m_dir, tmp_path):
    bad_dir = tmp_path / "ml-1m-bad"
    bad_dir.mkdir()
    for name in ("movies.dat", "ratings.users-1-2999.dat.gz"):
        os.symlink(os.path.join(ml1m_dir, name), bad_dir / name)
    lines = open(os.path.join(ml1m_dir, "users.dat"), encoding="latin-1").read().splitlines()
    lines[2] = "3::X::25::15::55117"
    (bad_dir / "users.dat").write_text("\n".join(lines) + "\n", encoding="latin-1")
    output = tmp_path / "out"
    with pytest.raises(movielens_ctr.MovieLensFormatError, match=r"users.dat:3: Gender must be 'F' or 'M'"):
        movielens_ctr.main(["--input_dir", str(bad_dir), "--output", str(output)])
    assert not output.exists()
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".out")], "temporary output left behind"


def test_logistic_baseline_auc(ctr_dataset):
    output, _ = ctr_dataset
    # Measured 0.7740 (lbfgs converges in ~320 iterations); a broken join or label would fall towards 0.5-0.7.
    auc = logistic_baseline.main(["--dataset", output])
    assert 0.765 < auc < 0.80
