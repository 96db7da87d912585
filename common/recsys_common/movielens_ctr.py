"""MovieLens-1M -> a click-through-rate dataset (NVIDIA's split-binary layout, or parquet with multi-hot genres).

A small, real CTR dataset that trains in minutes on a CPU, so that a recipe (PyTorch DLRM, TensorFlow2 DLRM/DCNv2)
can be checked for accuracy without the Criteo Terabyte files. Framework-free (numpy; pyarrow for parquet). It goes
through the bring-your-own (BYO) path: the features are described by a FeatureSpec (``feature_spec.yaml``) and
written with ``recsys_common.datasets``, so a trainer reads it exactly as it reads the preprocessed Criteo dataset.

Input (``--input_dir``, the GroupLens ml-1m directory):
    ratings.dat (or ratings.dat.gz, or ratings.users-*.dat.gz)   UserID::MovieID::Rating::Timestamp
    users.dat                                                     UserID::Gender::Age::Occupation::Zip-code
    movies.dat (latin-1)                                          MovieID::Title (Year)::Genre|Genre|...

Output (``--output``), ``--genres slots`` (default; the layout the PyTorch recipe trains on)::

    feature_spec.yaml
    train/{user_id,movie_id,gender,age,occupation,zip_prefix,genre_0,genre_1,genre_2}.bin  label.bin  numerical.bin
    test/ (the same files)
    raw_features/users.parquet, movies.parquet, movielens_ctr.json   the features by raw UserID / MovieID, with
                 which serving maps a raw rating (``recsys_common.serving.raw_features``; also with multi_hot)

``--genres multi_hot``: the genres are ONE multi-hot categorical feature ``genres`` (ids 0..17 in the order of
``GENRES``, ``max_hotness`` = the most genres any movie of movies.dat has: 6 in MovieLens-1M), which split-binary
cannot hold, so every feature of a split goes into one parquet file (list column for ``genres``; numericals
float32)::

    feature_spec.yaml
    train/data.parquet  test/data.parquet

``recsys_common.datasets`` reads it back with ``genres`` as an int64 ``[B, max_hotness]`` array padded with -1.

One row per rating:
    label        rating >= --positive_threshold (default 4), stored as bool
    categorical  user_id, movie_id (row of users.dat / movies.dat, ordered by id), gender, age (7 buckets),
                 occupation (21), zip_prefix (first 3 characters of the zip code; 0 = unknown), genre_0..genre_2
                 (the movie's first three genres, 1..18; 0 = none), or ``genres`` (multi-hot, see above). Each
                 is stored in the smallest integer type that holds its cardinality.
    numerical    movie_year (z-score over movies.dat), movie_age (rating year - release year, in decades,
                 clipped at 0), genre_count / 6; float16, row-major in numerical.bin.
Split: all ratings ordered by timestamp (ties by file order); the first 90 % are ``train`` (rows shuffled with
``--seed`` unless ``--no_shuffle_train``), the last 10 % are ``test`` (time order kept). No statistic is
computed from ratings, so nothing from the test period leaks into the features.

Usage::

    python -m recsys_common.movielens_ctr --input_dir /data/ml-1m --output /data/ml-1m-ctr
    python -m recsys_common.movielens_ctr --input_dir /data/ml-1m --output /data/ml-1m-mh --genres multi_hot

``main(argv)`` returns the written FeatureSpec; ``build_dataset(...)`` does the same from explicit arguments.
"""
from __future__ import annotations

import argparse
import glob
import gzip
import io
import json
import os
import re
import sys
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from recsys_common.cli import InputError
from .datasets import PAD, DatasetWriter
from .feature_spec import FeatureSpec, smallest_int_dtype
from .io import atomic_directory, check_output_directory

GENRES = ("Action", "Adventure", "Animation", "Children's", "Comedy", "Crime", "Documentary", "Drama", "Fantasy",
          "Film-Noir", "Horror", "Musical", "Mystery", "Romance", "Sci-Fi", "Thriller", "War", "Western")
AGE_BUCKETS = (1, 18, 25, 35, 45, 50, 56)
NUM_OCCUPATIONS = 21
CATEGORICAL_FEATURES = ("user_id", "movie_id", "gender", "age", "occupation", "zip_prefix", "genre_0", "genre_1", "genre_2")
NUMERICAL_FEATURES = ("movie_year", "movie_age", "genre_count")
LABEL_FEATURE = "label"
SPLITS = ("train", "test")
GENRE_LAYOUTS = ("slots", "multi_hot")
MULTI_HOT_GENRES = "genres"
BASE_CATEGORICAL = ("user_id", "movie_id", "gender", "age", "occupation", "zip_prefix")
_YEAR_RE = re.compile(r"\((\d{4})\)\s*$")


class MovieLensFormatError(InputError):
    """A line of a MovieLens file that does not have the documented layout (names file, line and field)."""


def _open_text(path: str, encoding: str):
    if path.endswith(".gz"):
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding=encoding)
    return open(path, "r", encoding=encoding)


def _split_line(path: str, line_number: int, line: str, expected_fields: int) -> List[str]:
    fields = line.rstrip("\r\n").split("::")
    if len(fields) != expected_fields:
        raise MovieLensFormatError(f"{path}:{line_number}: expected {expected_fields} '::'-separated fields, "
                                   f"found {len(fields)}: {line.rstrip()!r}")
    return fields


def _to_int(path: str, line_number: int, name: str, text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise MovieLensFormatError(f"{path}:{line_number}: field {name} must be an integer, got {text!r}") from None


def find_ratings_file(input_dir: str) -> str:
    """ratings.dat, ratings.dat.gz, or a partial ``ratings.*.dat.gz`` (as in the shared test data)."""
    for name in ("ratings.dat", "ratings.dat.gz"):
        path = os.path.join(input_dir, name)
        if os.path.isfile(path):
            return path
    partial = sorted(glob.glob(os.path.join(input_dir, "ratings.*.dat.gz")))
    if len(partial) == 1:
        return partial[0]
    if partial:
        raise FileNotFoundError(f"{input_dir}: several partial ratings files {partial}; pass --ratings_file")
    raise FileNotFoundError(f"{input_dir}: no ratings.dat, ratings.dat.gz or ratings.*.dat.gz")


def read_users(path: str) -> Dict[str, np.ndarray]:
    """users.dat -> arrays indexed by user row (users ordered by UserID), plus the id -> row lookup."""
    ids, gender, age, occupation, zips = [], [], [], [], []
    with _open_text(path, "latin-1") as f:
        for n, line in enumerate(f, start=1):
            if not line.strip():
                continue
            user, g, a, occ, zip_code = _split_line(path, n, line, 5)
            ids.append(_to_int(path, n, "UserID", user))
            if g not in ("F", "M"):
                raise MovieLensFormatError(f"{path}:{n}: Gender must be 'F' or 'M', got {g!r}")
            gender.append(0 if g == "F" else 1)
            a = _to_int(path, n, "Age", a)
            if a not in AGE_BUCKETS:
                raise MovieLensFormatError(f"{path}:{n}: Age must be one of {AGE_BUCKETS}, got {a}")
            age.append(AGE_BUCKETS.index(a))
            occ = _to_int(path, n, "Occupation", occ)
            if not 0 <= occ < NUM_OCCUPATIONS:
                raise MovieLensFormatError(f"{path}:{n}: Occupation must be in [0, {NUM_OCCUPATIONS}), got {occ}")
            occupation.append(occ)
            zips.append(zip_code.strip())
    order = np.argsort(np.asarray(ids), kind="stable")
    ids = np.asarray(ids, dtype=np.int64)[order]
    if len(np.unique(ids)) != len(ids):
        raise MovieLensFormatError(f"{path}: duplicate UserID")
    # zip prefix dictionary: 0 = unknown (not three leading digits), then the prefixes in sorted order.
    prefixes = [z[:3] if len(z) >= 3 and z[:3].isdigit() else None for z in (zips[i] for i in order)]
    vocabulary = sorted({p for p in prefixes if p is not None})
    zip_index = {p: i + 1 for i, p in enumerate(vocabulary)}
    return {
        "ids": ids,
        "gender": np.asarray(gender, dtype=np.int64)[order],
        "age": np.asarray(age, dtype=np.int64)[order],
        "occupation": np.asarray(occupation, dtype=np.int64)[order],
        "zip_prefix": np.asarray([zip_index.get(p, 0) for p in prefixes], dtype=np.int64),
        "zip_cardinality": np.int64(len(vocabulary) + 1),
    }


def read_movies(path: str, genre_slots: int) -> Dict[str, np.ndarray]:
    """movies.dat (latin-1) -> arrays indexed by movie row (movies ordered by MovieID)."""
    ids, years, genres = [], [], []
    with _open_text(path, "latin-1") as f:
        for n, line in enumerate(f, start=1):
            if not line.strip():
                continue
            movie, title, genre_text = _split_line(path, n, line, 3)
            ids.append(_to_int(path, n, "MovieID", movie))
            match = _YEAR_RE.search(title)
            years.append(float(match.group(1)) if match else np.nan)
            names = [g for g in genre_text.strip().split("|") if g]
            unknown = [g for g in names if g not in GENRES]
            if unknown:
                raise MovieLensFormatError(f"{path}:{n}: unknown genre(s) {unknown}; expected one of {GENRES}")
            genres.append([GENRES.index(g) + 1 for g in names])
    order = np.argsort(np.asarray(ids), kind="stable")
    ids = np.asarray(ids, dtype=np.int64)[order]
    if len(np.unique(ids)) != len(ids):
        raise MovieLensFormatError(f"{path}: duplicate MovieID")
    years = np.asarray(years, dtype=np.float64)[order]
    genre_slots_array = np.zeros((len(ids), genre_slots), dtype=np.int64)
    genre_count = np.zeros(len(ids), dtype=np.float64)
    for row, source in enumerate(order):
        names = genres[source]
        genre_count[row] = len(names)
        for slot, genre in enumerate(names[:genre_slots]):
            genre_slots_array[row, slot] = genre
    known = ~np.isnan(years)
    mean, std = years[known].mean(), max(years[known].std(), 1e-6)
    # Multi-hot: every genre of a movie, as 0-based ids padded with PAD to the widest movie.
    max_hotness = max(1, int(genre_count.max()) if len(ids) else 1)
    genre_lists = np.full((len(ids), max_hotness), PAD, dtype=np.int64)
    for row, source in enumerate(order):
        names = genres[source]
        genre_lists[row, :len(names)] = np.asarray(names, dtype=np.int64) - 1
    return {
        "ids": ids,
        "year": years,
        "year_z": np.where(known, (years - mean) / std, 0.0),
        "genres": genre_slots_array,
        "genre_lists": genre_lists,
        "genre_count": genre_count,
    }


def read_ratings(path: str) -> Dict[str, np.ndarray]:
    """ratings.dat[.gz] -> int64 arrays user, movie, rating, timestamp in file order.

    Streamed by :func:`iter_delimited_columns` (memory: the arrays, not the file's text); a malformed line, a
    non-integer field or a rating outside 1..5 raises MovieLensFormatError naming the file, line and column.
    """
    parts = {"user": [], "movie": [], "rating": [], "timestamp": []}
    for first_line, batch in iter_delimited_columns(path, "::", ("UserID", "MovieID", "Rating", "Timestamp"),
                                                    ["UserID", "MovieID", "Timestamp"], ["Rating"]):
        check_rating_range(path, first_line, "Rating", batch["Rating"], (1, 5, 1), "ml-1m")
        parts["user"].append(batch["UserID"])
        parts["movie"].append(batch["MovieID"])
        parts["rating"].append(batch["Rating"].astype(np.int64))
        parts["timestamp"].append(batch["Timestamp"])
    return {name: np.concatenate(values) for name, values in parts.items()}


def _lookup(ids: np.ndarray, queries: np.ndarray, what: str, path: str) -> np.ndarray:
    rows = np.searchsorted(ids, queries)
    rows = np.minimum(rows, len(ids) - 1)
    missing = np.flatnonzero(ids[rows] != queries)
    if missing.size:
        raise MovieLensFormatError(f"{path}:{missing[0] + 1}: {what} {queries[missing[0]]} is not in the "
                                   f"{what.split('ID')[0].lower()}s file ({missing.size} rating(s) affected)")
    return rows


def build_columns(input_dir: str, ratings_file: Optional[str], positive_threshold: int,
                  genre_slots: int = 3, genres: str = "slots") -> Dict[str, object]:
    """Join ratings with users and movies; return per-feature arrays (file order), cardinalities and hotness.

    ``genres``: ``slots`` -> ``genre_0..genre_<genre_slots-1>`` single-hot features; ``multi_hot`` -> one feature
    ``genres`` (int64 ``[N, max_hotness]`` padded with -1).
    """
    if genres not in GENRE_LAYOUTS:
        raise ValueError(f"genres must be one of {GENRE_LAYOUTS}, got {genres!r}")
    ratings_path = ratings_file or find_ratings_file(input_dir)
    users = read_users(os.path.join(input_dir, "users.dat"))
    movies = read_movies(os.path.join(input_dir, "movies.dat"), genre_slots)
    ratings = read_ratings(ratings_path)
    user_row = _lookup(users["ids"], ratings["user"], "UserID", ratings_path)
    movie_row = _lookup(movies["ids"], ratings["movie"], "MovieID", ratings_path)

    rating_year = 1970.0 + ratings["timestamp"] / (365.2425 * 86400.0)
    release_year = movies["year"][movie_row]
    movie_age = np.where(np.isnan(release_year), 0.0, np.clip(rating_year - release_year, 0.0, None) / 10.0)
    columns = {
        "user_id": user_row,
        "movie_id": movie_row,
        "gender": users["gender"][user_row],
        "age": users["age"][user_row],
        "occupation": users["occupation"][user_row],
        "zip_prefix": users["zip_prefix"][user_row],
        "movie_year": movies["year_z"][movie_row],
        "movie_age": movie_age,
        "genre_count": movies["genre_count"][movie_row] / 6.0,
        LABEL_FEATURE: ratings["rating"] >= positive_threshold,
    }
    cardinalities = {
        "user_id": len(users["ids"]), "movie_id": len(movies["ids"]), "gender": 2, "age": len(AGE_BUCKETS),
        "occupation": NUM_OCCUPATIONS, "zip_prefix": int(users["zip_cardinality"]),
    }
    hotness = {}
    if genres == "slots":
        for slot in range(genre_slots):
            columns[f"genre_{slot}"] = movies["genres"][movie_row, slot]
            cardinalities[f"genre_{slot}"] = len(GENRES) + 1
    else:
        columns[MULTI_HOT_GENRES] = movies["genre_lists"][movie_row]
        cardinalities[MULTI_HOT_GENRES] = len(GENRES)
        hotness[MULTI_HOT_GENRES] = int(movies["genre_lists"].shape[1])
    return {"columns": columns, "timestamp": ratings["timestamp"], "cardinalities": cardinalities,
            "hotness": hotness, "ratings_path": ratings_path, "users": users, "movies": movies}


RAW_FEATURES_DIRECTORY = "raw_features"   # the users' and movies' features by raw id (write_raw_feature_tables)
RAW_FEATURES_FORMAT = "recsys_common.movielens_ctr/1"


def write_raw_feature_tables(directory: str, users: Dict[str, np.ndarray], movies: Dict[str, np.ndarray],
                             categorical: Sequence[str], genres: str) -> None:
    """``directory/raw_features/``: what maps a raw rating (UserID, MovieID, Timestamp) to this dataset's features
    as ``build_columns`` computed them (``recsys_common.serving.raw_features.MovieLensCtrRawMapper``):
    ``users.parquet`` (UserID and the user's features by row), ``movies.parquet`` (MovieID, release year, its
    z-score, genre count, genre slots or lists) and ``movielens_ctr.json`` (the features and the genre layout)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    target = os.path.join(directory, RAW_FEATURES_DIRECTORY)
    os.makedirs(target)
    user_table = {"UserID": users["ids"], "user_id": np.arange(len(users["ids"]), dtype=np.int64)}
    user_table.update({name: users[name] for name in ("gender", "age", "occupation", "zip_prefix")})
    pq.write_table(pa.table(user_table), os.path.join(target, "users.parquet"))
    movie_table = {"MovieID": movies["ids"], "movie_id": np.arange(len(movies["ids"]), dtype=np.int64),
                   "year": movies["year"], "year_z": movies["year_z"], "genre_count": movies["genre_count"]}
    if genres == "slots":
        movie_table.update({f"genre_{slot}": movies["genres"][:, slot] for slot in range(movies["genres"].shape[1])})
    else:
        movie_table[MULTI_HOT_GENRES] = list(movies["genre_lists"])
    pq.write_table(pa.table(movie_table), os.path.join(target, "movies.parquet"))
    with open(os.path.join(target, "movielens_ctr.json"), "w", encoding="utf-8") as f:
        json.dump({"format": RAW_FEATURES_FORMAT, "categorical": list(categorical), "genres": genres,
                   "numerical": list(NUMERICAL_FEATURES)}, f, indent=1)
        f.write("\n")


def make_feature_spec(cardinalities: Dict[str, int], categorical: Sequence[str], metadata: dict,
                      hotness: Optional[Dict[str, int]] = None) -> dict:
    """The FeatureSpec dict: split-binary files when every feature is single-hot, else one parquet file per split."""
    hotness = hotness or {}
    features = {name: {"dtype": smallest_int_dtype(cardinalities[name]), "cardinality": int(cardinalities[name])}
                for name in categorical}
    for name, hot in hotness.items():
        features[name]["max_hotness"] = int(hot)
    parquet = any(hot > 1 for hot in hotness.values())
    # parquet has no float16 column type that every reader accepts; float32 costs 2 x 3 x 4 bytes a row more.
    features.update({name: {"dtype": "float32" if parquet else "float16"} for name in NUMERICAL_FEATURES})
    features[LABEL_FEATURE] = {"dtype": "bool"}
    source_spec = {}
    for split in SPLITS:
        if parquet:
            source_spec[split] = [{"type": "parquet", "files": [f"{split}/data.parquet"],
                                   "features": list(categorical) + list(NUMERICAL_FEATURES) + [LABEL_FEATURE]}]
            continue
        chunks = [{"type": "split_binary", "features": [name], "files": [f"{split}/{name}.bin"]} for name in categorical]
        chunks.append({"type": "split_binary", "features": list(NUMERICAL_FEATURES), "files": [f"{split}/numerical.bin"]})
        chunks.append({"type": "split_binary", "features": [LABEL_FEATURE], "files": [f"{split}/label.bin"]})
        source_spec[split] = chunks
    return {
        "feature_spec": features,
        "source_spec": source_spec,
        "channel_spec": {"categorical": list(categorical), "numerical": list(NUMERICAL_FEATURES),
                         "label": [LABEL_FEATURE]},
        "metadata": metadata,
    }


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--input_dir", required=True, help="MovieLens-1M directory (users.dat, movies.dat, ratings)")
    parser.add_argument("--output", required=True, help="output dataset directory (must not exist, or be empty)")
    parser.add_argument("--ratings_file", default=None,
                        help="ratings file; default: ratings.dat, ratings.dat.gz or ratings.*.dat.gz in --input_dir")
    parser.add_argument("--positive_threshold", type=int, default=4, help="label = rating >= this")
    parser.add_argument("--test_fraction", type=float, default=0.1, help="latest fraction of ratings used as test")
    parser.add_argument("--genres", choices=GENRE_LAYOUTS, default="slots",
                        help="slots: the first --genre_slots genres as single-hot features genre_<i> (split-binary); "
                             "multi_hot: all genres as one multi-hot feature 'genres' (parquet)")
    parser.add_argument("--genre_slots", type=int, default=3,
                        help="number of genre_<i> categorical features (--genres slots)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the train-row shuffle")
    parser.add_argument("--no_shuffle_train", action="store_true", help="keep train rows in time order")
    return parser


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not 0.0 < args.test_fraction < 1.0:
        parser.error(f"--test_fraction must be in (0, 1), got {args.test_fraction}")
    if not 1 <= args.genre_slots <= 6:
        parser.error(f"--genre_slots must be in [1, 6], got {args.genre_slots}")
    return args


def build_dataset(input_dir: str, output: str, ratings_file: Optional[str] = None, positive_threshold: int = 4,
                  test_fraction: float = 0.1, genres: str = "slots", genre_slots: int = 3, seed: int = 0,
                  shuffle_train: bool = True, tool: str = "recsys_common.movielens_ctr") -> FeatureSpec:
    """Convert MovieLens-1M in ``input_dir`` into a CTR dataset in ``output``; returns the written FeatureSpec.

    ``output`` must not exist or be empty (refused before any work); the files appear all at once (``feature_spec.yaml``
    last). ``tool`` names the writer in the output manifest (``recsys_common.io.atomic_directory``).
    """
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    check_output_directory(output)   # a non-empty output is refused before the work, not after
    built = build_columns(input_dir, ratings_file, positive_threshold, genre_slots, genres)
    columns, timestamp = built["columns"], built["timestamp"]
    num_rows = len(timestamp)
    order = np.argsort(timestamp, kind="stable")          # time order; ties keep file order
    num_train = int(round(num_rows * (1.0 - test_fraction)))
    split_rows = {"train": order[:num_train], "test": order[num_train:]}
    if shuffle_train:
        split_rows["train"] = np.random.default_rng(seed).permutation(split_rows["train"])

    categorical = list(BASE_CATEGORICAL) + ([f"genre_{slot}" for slot in range(genre_slots)] if genres == "slots"
                                            else [MULTI_HOT_GENRES])
    labels = columns[LABEL_FEATURE]
    metadata = {
        "dataset": "movielens-1m-ctr",
        "source": os.path.basename(built["ratings_path"]),
        "label": f"rating >= {positive_threshold}",
        "genres": genres,
        "split": f"time-ordered: first {1 - test_fraction:.0%} train, last {test_fraction:.0%} test",
        "train_cutoff_timestamp": int(timestamp[order[num_train - 1]]),
        "num_samples": {split: int(len(rows)) for split, rows in split_rows.items()},
        "positive_rate": {split: round(float(labels[rows].mean()), 6) for split, rows in split_rows.items()},
    }
    spec_dict = make_feature_spec(built["cardinalities"], categorical, metadata, built["hotness"])
    # A non-empty output is refused (other files are never touched); feature_spec.yaml is moved in last.
    with atomic_directory(output, tool=tool, marker="feature_spec.yaml") as tmp_dir:
        spec = FeatureSpec.from_dict(spec_dict, base_directory=tmp_dir)
        for split, rows in split_rows.items():
            with DatasetWriter(spec, split) as writer:
                writer.write({name: np.asarray(columns[name])[rows] for name in
                              categorical + list(NUMERICAL_FEATURES) + [LABEL_FEATURE]})
        write_raw_feature_tables(tmp_dir, built["users"], built["movies"], categorical, genres)
        spec.to_yaml(os.path.join(tmp_dir, "feature_spec.yaml"))
    spec = FeatureSpec.from_yaml(os.path.join(output, "feature_spec.yaml"))
    print(f"wrote {output}: train {metadata['num_samples']['train']} rows "
          f"(positive rate {metadata['positive_rate']['train']:.4f}), test {metadata['num_samples']['test']} rows "
          f"(positive rate {metadata['positive_rate']['test']:.4f})")
    return spec


def main(argv: Optional[Sequence[str]] = None, tool: str = "recsys_common.movielens_ctr") -> FeatureSpec:
    """Convert; returns the written FeatureSpec (base_directory = --output)."""
    args = parse_args(argv)
    return build_dataset(args.input_dir, args.output, ratings_file=args.ratings_file,
                         positive_threshold=args.positive_threshold, test_fraction=args.test_fraction,
                         genres=args.genres, genre_slots=args.genre_slots, seed=args.seed,
                         shuffle_train=not args.no_shuffle_train, tool=tool)


# ------------------------------------------------------------------------------- streaming ratings readers
# Every MovieLens ratings layout (and the recipes' other delimited integer files) is read here, a block at a time,
# so that a reader's memory is its output arrays plus one block, never the file's text: ML-25M's ratings.csv is
# 650 MB, which whole-file readers turned into 10 to 14 GB. pyarrow's CSV parser does the work; a file it does not
# accept as plain numbers (a bad line, a blank line inside, ids written as ``7.0``) is handed, from the failing block
# on, to a line-by-line scan that either reads the same values or names the file, line and column.

RATINGS_BLOCK_BYTES = 1 << 20   # pyarrow block (~40k rows). Its reader runs ~30 blocks ahead: 16 MB blocks cost 500 MB
_SCAN_BATCH_ROWS = 1 << 20


def _open_binary(path: str):
    return gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")


def read_header(path: str, separator: str, error=MovieLensFormatError) -> List[str]:
    """The first line of ``path`` split at ``separator`` (names stripped, quotes removed)."""
    if not os.path.isfile(path):
        raise error(f"{path}: file not found")
    with _open_binary(path) as f:
        first = f.readline().decode("latin-1").rstrip("\r\n")
    return [name.strip().strip('"') for name in first.split(separator)] if first.strip() else []


def _parse_number(text: str, integer: bool):
    """``text`` as an int (``integer``; an integral float like ``7.0`` too) or a finite float; None if neither."""
    value = text.strip().strip('"')
    try:
        return int(value) if integer else _finite(float(value))
    except ValueError:
        pass
    if integer:
        try:
            number = float(value)
        except ValueError:
            return None
        if number == number and number not in (float("inf"), float("-inf")) and number % 1 == 0:
            return int(number)
    return None


def _finite(value: float):
    return value if value - value == 0 else None   # nan and inf give nan


def _scan_lines(path: str, separator: str, names: Sequence[str], skip_lines: int, int_columns: Sequence[str],
                float_columns: Sequence[str], error) -> Iterator[Tuple[int, Dict[str, np.ndarray]]]:
    """Line-by-line reader from line ``skip_lines + 1`` on: the same batches as the fast path, or ``error`` naming
    the line. Streams (a batch of :data:`_SCAN_BATCH_ROWS` rows at a time); blank lines are allowed at the end only."""
    index = {name: names.index(name) for name in list(int_columns) + list(float_columns)}
    wanted = [(name, index[name], name in int_columns) for name in list(int_columns) + list(float_columns)]
    values = {name: [] for name, _, _ in wanted}
    first_line, blank_at = skip_lines + 1, None
    with _open_binary(path) as f:
        for number, raw in enumerate(f, start=1):
            if number <= skip_lines:
                continue
            line = raw.decode("latin-1").rstrip("\r\n")
            if not line.strip():
                blank_at = blank_at or number
                continue
            if blank_at is not None:
                raise error(f"{path}: line {blank_at}: expected {len(names)} {separator!r}-separated fields "
                            f"({', '.join(names)}), found a blank line (only the end of the file may be blank)")
            fields = line.split(separator)
            if len(fields) != len(names):
                raise error(f"{path}: line {number}: expected {len(names)} {separator!r}-separated fields "
                            f"({', '.join(names)}), found {len(fields)}: {line!r}")
            for name, column, integer in wanted:
                parsed = _parse_number(fields[column], integer)
                if parsed is None:
                    raise error(f"{path}: line {number}: column {name!r} must be "
                                f"{'an integer' if integer else 'a number'}, got {fields[column]!r}")
                values[name].append(parsed)
            if len(values[wanted[0][0]]) >= _SCAN_BATCH_ROWS:
                yield first_line, _scanned_arrays(path, values, int_columns, error)
                values = {name: [] for name, _, _ in wanted}
                first_line = number + 1
    if values[wanted[0][0]]:
        yield first_line, _scanned_arrays(path, values, int_columns, error)


def _scanned_arrays(path: str, values: Dict[str, list], int_columns: Sequence[str], error) -> Dict[str, np.ndarray]:
    out = {}
    for name, column in values.items():
        try:
            out[name] = np.asarray(column, dtype=np.int64 if name in int_columns else np.float64)
        except OverflowError:
            raise error(f"{path}: column {name!r} has a value outside int64") from None
    return out


def iter_delimited_columns(path: str, separator: str, names: Optional[Sequence[str]], int_columns: Sequence[str],
                           float_columns: Sequence[str] = (), has_header: bool = False, error=MovieLensFormatError,
                           block_bytes: Optional[int] = None) -> Iterator[Tuple[int, Dict[str, np.ndarray]]]:
    """Stream the numeric columns of a delimited file (``.gz`` too) as ``(first line number, {column: array})``.

    ``names``: every column of a line, in order (headerless files); with ``has_header`` the first line names them
    and must contain every wanted column (``names`` is then only what the error message calls the layout).
    ``int_columns`` come back int64, ``float_columns`` float64 (finite). ``separator``: one character, or ``::``
    (ML-1M's). Line numbers are 1-based file lines, so ``first + i`` is the line of row ``i`` of a batch. Raises
    ``error`` (a ValueError subclass) naming the file, line and column of a malformed line; an empty file raises
    ``error`` too. Memory: the batch and one pyarrow block, whatever the file size.
    """
    import pyarrow as pa
    import pyarrow.csv as pacsv

    wanted = list(int_columns) + list(float_columns)
    if has_header:
        header = read_header(path, separator, error)
        if not header:
            raise error(f"{path}: empty file (expected a header line {','.join(names or wanted)})")
        missing = [c for c in wanted if c not in header]
        if missing:
            raise error(f"{path}: line 1: header {separator.join(header)!r} lacks column(s) {missing}; expected "
                        f"{separator.join(names or wanted)}")
        if len(set(header)) != len(header):
            raise error(f"{path}: line 1: header {separator.join(header)!r} repeats a column name")
        names, skip = header, 1
    else:
        if not os.path.isfile(path):
            raise error(f"{path}: file not found")
        names, skip = list(names), 0
    if separator == "::":
        # ':' as the delimiter, with an always-empty column between every two fields; a stray ':' in a field
        # changes the column count and is caught like any malformed line.
        arrow_names = [part for name in names for part in (name, f"\0sep{name}")][:-1]
        delimiter, spacers = ":", [f"\0sep{name}" for name in names[:-1]]
    elif len(separator) == 1:
        arrow_names, delimiter, spacers = list(names), separator, []
    else:
        raise ValueError(f"separator must be one character or '::', got {separator!r}")
    types = {name: pa.int64() for name in int_columns}
    types.update({name: pa.float64() for name in float_columns})
    types.update({name: pa.null() for name in spacers})
    line, rows, handoff = skip + 1, 0, False
    try:
        reader = pacsv.open_csv(
            pa.input_stream(path, compression="gzip" if path.endswith(".gz") else None),
            read_options=pacsv.ReadOptions(column_names=arrow_names, skip_rows=skip,
                                           block_size=block_bytes or RATINGS_BLOCK_BYTES),
            parse_options=pacsv.ParseOptions(delimiter=delimiter, quote_char=False, ignore_empty_lines=False),
            convert_options=pacsv.ConvertOptions(column_types=types, include_columns=wanted + spacers,
                                                 strings_can_be_null=False))
        for batch in reader:
            # A null is an empty (or 'NA'-like) field, a blank line or a non-finite rating: the scan says which.
            arrays = {name: batch.column(i) for i, name in enumerate(wanted)}
            if any(column.null_count for column in arrays.values()):
                handoff = True
                break
            arrays = {name: column.to_numpy() for name, column in arrays.items()}
            if not all(np.isfinite(arrays[c]).all() for c in float_columns):
                handoff = True
                break
            rows += batch.num_rows
            yield line, arrays
            line += batch.num_rows
    except (pa.ArrowInvalid, UnicodeDecodeError):
        handoff = True   # a block it cannot parse or convert: the scan names its bad line, or reads it (7.0 ids)
    except (OSError, EOFError) as err:   # a truncated .gz, an unreadable file
        raise error(f"{path}: cannot read after line {line - 1}: {err}") from err
    if handoff:
        try:
            for batch_line, arrays in _scan_lines(path, separator, names, line - 1, int_columns, float_columns,
                                                  error):
                rows += len(arrays[wanted[0]])
                yield batch_line, arrays
        except (OSError, EOFError) as err:
            raise error(f"{path}: cannot read: {err}") from err
    if rows == 0:
        raise error(f"{path}: empty file: no ratings")


def check_rating_range(path: str, first_line: int, column: str, ratings: np.ndarray, rating_range: tuple,
                       layout: str, error=MovieLensFormatError) -> None:
    """Raise ``error`` naming the line of the first rating outside ``rating_range`` = (lowest, highest, step).

    ML-100K and ML-1M rate in whole stars 1 to 5, ML-20M/25M and ml-latest in half stars 0.5 to 5: a 0, a 6 or a
    3.7 there means the file is not what its name says (or a column is shifted), which must not become labels.
    """
    low, high, step = rating_range
    bad = np.flatnonzero((ratings < low) | (ratings > high) | ((ratings / step) % 1 != 0))
    if bad.size:
        i = int(bad[0])
        raise error(f"{path}: line {first_line + i}: column {column!r}: rating {ratings[i]:g} is outside the "
                    f"{layout} range ({low:g} to {high:g} in steps of {step:g}; {bad.size} such row(s) in this block)")


if __name__ == "__main__":
    main(sys.argv[1:])
