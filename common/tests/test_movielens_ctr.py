"""recsys_common.movielens_ctr (both genre layouts) and recsys_common.logistic_baseline on a tiny MovieLens-format
directory written here, plus the multi-hot layout on the shared MovieLens-1M ratings (skipped when absent)."""
import json
import os

import numpy as np
import pytest

from recsys_common import logistic_baseline, movielens_ctr
from recsys_common.datasets import open_reader, read_columns
from recsys_testing import shared_data_path

MOVIES = [  # id, title, genres
    (1, "Toy Story (1995)", "Animation|Children's|Comedy"),
    (2, "Heat (1995)", "Action|Crime|Thriller"),
    (5, "Many (1990)", "Action|Adventure|Comedy|Drama|Romance"),
    (7, "Solo (1980)", "Drama"),
]
USERS = [(1, "F", 1, 10, "48067"), (2, "M", 56, 16, "70072"), (3, "M", 25, 15, "ab"), (4, "F", 35, 7, "02460")]


@pytest.fixture
def tiny_ml(tmp_path):
    """A 4-user, 4-movie, 400-rating directory in the ml-1m layout; users 1 and 3 like everything, every user likes
    movie 1, the rest is disliked (an additive pattern a logistic regression can fit)."""
    d = tmp_path / "ml"
    d.mkdir()
    (d / "movies.dat").write_text("".join(f"{m}::{t}::{g}\n" for m, t, g in MOVIES), encoding="latin-1")
    (d / "users.dat").write_text("".join(f"{u}::{g}::{a}::{o}::{z}\n" for u, g, a, o, z in USERS))
    rng = np.random.default_rng(0)
    lines = []
    for i in range(400):
        user = USERS[i % 4][0]
        movie = MOVIES[(i // 4) % 4][0]
        liked = user in (1, 3) or movie == 1
        rating = int(rng.integers(4, 6) if liked else rng.integers(1, 4))
        lines.append(f"{user}::{movie}::{rating}::{978300000 + i * 60}\n")
    (d / "ratings.dat").write_text("".join(lines))
    return str(d)


def test_slots_layout_is_split_binary_with_three_genre_features(tiny_ml, tmp_path):
    spec = movielens_ctr.main(["--input_dir", tiny_ml, "--output", str(tmp_path / "out")])
    assert spec.channel_spec["categorical"] == ["user_id", "movie_id", "gender", "age", "occupation", "zip_prefix",
                                                "genre_0", "genre_1", "genre_2"]
    assert sorted(os.listdir(tmp_path / "out" / "test")) == sorted(
        [f"{f}.bin" for f in spec.channel_spec["categorical"]] + ["label.bin", "numerical.bin"])
    test = read_columns(spec, "test")
    assert len(test["label"]) == 40      # the latest 10 % of 400 ratings, in time order
    # Movie 5 (row 2) has five genres: the slots keep the first three, 1-based (Action=1, Adventure=2, Comedy=5).
    rows = test["movie_id"] == 2
    assert rows.any()
    assert (test["genre_0"][rows] == 1).all() and (test["genre_1"][rows] == 2).all()
    assert (test["genre_2"][rows] == 5).all()


def test_multi_hot_layout_is_one_padded_feature_in_parquet(tiny_ml, tmp_path):
    spec = movielens_ctr.main(["--input_dir", tiny_ml, "--output", str(tmp_path / "out"), "--genres", "multi_hot"])
    assert spec.channel_spec["categorical"][-1] == "genres"
    assert not any(f.startswith("genre_") for f in spec.channel_spec["categorical"])
    assert spec.max_hotness("genres") == 5 and spec.cardinality("genres") == 18   # the widest movie has 5 genres
    assert sorted(os.listdir(tmp_path / "out" / "train")) == ["data.parquet"]
    batch = next(iter(open_reader(spec, "train", batch_size=400)))
    genres = batch["categorical"][-1]            # multi-hot: one [B, max_hotness] array per feature, -1 padded
    movie = batch["categorical"][1][:, 0]           # movie_id, [B, 1]
    assert genres.shape == (360, 5)
    expected = {0: [2, 3, 4], 1: [0, 5, 15], 2: [0, 1, 4, 7, 13], 3: [7]}   # 0-based GENRES ids, in file order
    for row, ids in expected.items():
        got = genres[movie == row]
        assert (got[:, :len(ids)] == ids).all() and (got[:, len(ids):] == -1).all()
    # Everything else equals the split-binary layout, row for row.
    other = movielens_ctr.main(["--input_dir", tiny_ml, "--output", str(tmp_path / "slots")])
    a, b = read_columns(spec, "train"), read_columns(other, "train")
    for name in ("user_id", "movie_id", "zip_prefix", "label"):
        assert (a[name] == b[name]).all()
    assert np.allclose(a["movie_age"], b["movie_age"], atol=1e-2)   # float32 vs float16


def test_logistic_baseline_reads_multi_hot_features(tiny_ml, tmp_path):
    spec = movielens_ctr.main(["--input_dir", tiny_ml, "--output", str(tmp_path / "out"), "--genres", "multi_hot"])
    train = logistic_baseline.load_mapping(spec, "train", None)
    assert train["categorical"].shape == (360, 6) and train["multi_hot"]["genres"].shape == (360, 5)
    matrix = logistic_baseline.multi_hot_matrix(np.array([[2, 0, -1], [-1, -1, -1]]), 4)
    assert matrix.toarray().tolist() == [[1, 0, 1, 0], [0, 0, 0, 0]]
    # The labels are an OR of a user and a movie indicator: separable by one-hot user + movie features.
    auc = logistic_baseline.main(["--dataset", str(tmp_path / "out"), "--C", "100", "--output_json",
                                  str(tmp_path / "baseline.json")])
    assert auc > 0.9
    result = json.loads((tmp_path / "baseline.json").read_text())
    assert result["test_auc"] == round(auc, 6)
    # NE and calibration next to AUC and log loss: a separable problem fits far below the background rate's entropy
    assert 0 < result["test_normalized_entropy"] < 0.5 and 0.5 < result["test_calibration"] < 2, result


def test_bad_input_names_file_and_line(tiny_ml, tmp_path):
    with open(os.path.join(tiny_ml, "movies.dat"), "a", encoding="latin-1") as f:
        f.write("9::Odd (1999)::Comedy|Cooking\n")
    with pytest.raises(movielens_ctr.MovieLensFormatError, match=r"movies.dat:5: unknown genre\(s\) \['Cooking'\]"):
        movielens_ctr.main(["--input_dir", tiny_ml, "--output", str(tmp_path / "out"), "--genres", "multi_hot"])
    assert not os.path.exists(tmp_path / "out")
    with pytest.raises(SystemExit):
        movielens_ctr.main(["--input_dir", tiny_ml, "--output", str(tmp_path / "x"), "--genres", "bag"])


def test_multi_hot_genres_on_shared_movielens(tmp_path):
    ml1m = shared_data_path("movielens", "ml-1m")
    spec = movielens_ctr.main(["--input_dir", ml1m, "--output", str(tmp_path / "out"), "--genres", "multi_hot"])
    assert spec.max_hotness("genres") == 6             # the most genres any movie of movies.dat has
    test = read_columns(spec, "test")
    assert len(test["label"]) == 48_765 and test["genres"].shape == (48_765, 6)
    # Every row's genre ids equal movies.dat's genre list of its movie.
    names = {}
    with open(os.path.join(ml1m, "movies.dat"), encoding="latin-1") as f:
        for line in f:
            movie, _, genres = line.rstrip("\n").split("::")
            names[int(movie)] = [movielens_ctr.GENRES.index(g) for g in genres.split("|")]
    movie_ids = sorted(names)
    for row in range(0, 48_765, 997):
        ids = names[movie_ids[test["movie_id"][row]]]
        assert test["genres"][row, :len(ids)].tolist() == ids and (test["genres"][row, len(ids):] == -1).all()


@pytest.mark.parametrize("text, message", [
    ("1::2::5::10\n1::3::6::11\n", r"ratings.dat: line 2: column 'Rating': rating 6 is outside the ml-1m range"),
    ("1::2::5::10\n1::3::4\n", r"ratings.dat: line 2: expected 4 '::'-separated fields"),
    ("1::2::5::10\n\n1::3::4::11\n", r"ratings.dat: line 2: .*found a blank line"),
    ("1::2::5::10\n1::3:4::11\n", r"ratings.dat: line 2: expected 4 '::'-separated fields .* found 3"),
])
def test_read_ratings_streams_and_names_line_and_column(tmp_path, text, message):
    path = tmp_path / "ratings.dat"
    path.write_text(text)
    with pytest.raises(movielens_ctr.MovieLensFormatError, match=message):
        movielens_ctr.read_ratings(str(path))
    path.write_text("1::2::5::10\n7::3::1::11\n")
    got = movielens_ctr.read_ratings(str(path))
    assert {k: v.tolist() for k, v in got.items()} == {"user": [1, 7], "movie": [2, 3], "rating": [5, 1],
                                                       "timestamp": [10, 11]}
