"""MovieLens ratings -> NVTabular workflow -> parquet + FeatureSpec (the ETL of the HugeCTR MovieLens notebook).

    python -m wide_deep.movielens.etl --input_dir /data/ml-100k --output_dir /data/movielens
    python -m wide_deep.movielens.etl --input_dir /data/ml-1m --output_dir /data/movielens-1m

Input (``--input_dir``): a GroupLens MovieLens directory, recognised by its files:
    ml-100k   ``u.data`` (user \\t item \\t rating \\t timestamp) and ``u.item`` (latin-1, 19 genre flags)
    ml-1m     ``ratings.dat`` (or ``ratings.dat.gz`` or one partial ``ratings.*.dat.gz``) and ``movies.dat``
              (latin-1, ``MovieID::Title::Genre|Genre``)

What it computes, as the Merlin MovieLens examples do: ratings split at random into train (1 - ``--valid_fraction``)
and valid with ``--seed``; the NVTabular workflow joins each rating with its movie's genres (``JoinExternal``),
``Categorify``s ``userId``, ``movieId`` and the genre list ``genres`` (statistics from train only: an id unseen in
train maps to the out-of-vocabulary index), and turns ``rating`` into the label ``rating > 3`` (int8).

Output (``--output_dir``, staged and moved into place at the end: on any error nothing is written)::

    train/part_0.parquet  valid/part_0.parquet   userId, movieId (int64), genres (list<int64>), rating (int8 0/1)
    feature_spec.yaml    recsys_common FeatureSpec: mappings ``train`` and ``test`` (= valid/); channels ``label``
                         [rating], ``onehot_categorical`` [userId, movieId], ``multihot_categorical`` [genres]
                         (``max_hotness`` = most genres of a movie), ``numerical`` []
    workflow/            the fitted workflow: ``nvtabular.Workflow.load(path)``

``run_etl(...)`` does it from explicit arguments; ``main(argv)`` is the command line (exit 2 on bad input).
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Callable, Dict, Optional, Sequence, Tuple

import numpy as np
import pandas as pd

from recsys_common.feature_spec import FeatureSpec
from recsys_common.io import OutputDirectoryError, atomic_directory, check_output_directory
from recsys_common.movielens_ctr import MovieLensFormatError, find_ratings_file, read_ratings

TOOL = "wide_deep.movielens.etl"
SPEC_NAME = "feature_spec.yaml"
WORKFLOW_DIR = "workflow"
USER, ITEM, GENRES, LABEL = "userId", "movieId", "genres", "rating"
ONEHOT_CHANNEL, MULTIHOT_CHANNEL, NUMERICAL_CHANNEL, LABEL_CHANNEL = (
    "onehot_categorical", "multihot_categorical", "numerical", "label")
# rating > 3 is a positive, as in the Merlin MovieLens examples (4 and 5 stars).
POSITIVE_ABOVE = 3
ML100K_GENRES = ("unknown", "Action", "Adventure", "Animation", "Children's", "Comedy", "Crime", "Documentary",
                 "Drama", "Fantasy", "Film-Noir", "Horror", "Musical", "Mystery", "Romance", "Sci-Fi", "Thriller",
                 "War", "Western")


class MovieLensInputError(ValueError):
    """The input directory lacks a file, or a line of it is malformed (the message names the file and line)."""


def _read_ml100k(input_dir: str) -> Tuple[pd.DataFrame, pd.DataFrame]:
    data, item = os.path.join(input_dir, "u.data"), os.path.join(input_dir, "u.item")
    try:
        values = np.loadtxt(data, dtype=np.int64, ndmin=2)
    except ValueError as e:
        raise MovieLensInputError(f"{data}: expected 4 tab-separated integers per line "
                                  f"(user, item, rating, timestamp): {e}") from None
    if values.shape[1] != 4:
        raise MovieLensInputError(f"{data}: expected 4 fields per line, got {values.shape[1]}")
    ratings = pd.DataFrame({USER: values[:, 0], ITEM: values[:, 1], LABEL: values[:, 2]})
    ids, genres = [], []
    with open(item, encoding="latin-1") as f:
        for n, line in enumerate(f, start=1):
            if not line.strip():
                continue
            fields = line.rstrip("\n").split("|")
            if len(fields) != 5 + len(ML100K_GENRES):
                raise MovieLensInputError(f"{item}:{n}: expected {5 + len(ML100K_GENRES)} '|'-separated fields "
                                          f"(id, title, dates, URL, {len(ML100K_GENRES)} genre flags), got {len(fields)}")
            try:
                ids.append(int(fields[0]))
                flags = [int(x) for x in fields[5:]]
            except ValueError:
                raise MovieLensInputError(f"{item}:{n}: movie id and genre flags must be integers") from None
            genres.append([g for g, flag in zip(ML100K_GENRES, flags) if flag] or ["unknown"])
    return ratings, pd.DataFrame({ITEM: np.asarray(ids, dtype=np.int64), GENRES: genres})


def _read_ml1m(input_dir: str, ratings_file: Optional[str]) -> Tuple[pd.DataFrame, pd.DataFrame]:
    path = ratings_file or find_ratings_file(input_dir)
    r = read_ratings(path)
    ratings = pd.DataFrame({USER: r["user"], ITEM: r["movie"], LABEL: r["rating"]})
    movies_path = os.path.join(input_dir, "movies.dat")
    ids, genres = [], []
    with open(movies_path, encoding="latin-1") as f:
        for n, line in enumerate(f, start=1):
            if not line.strip():
                continue
            fields = line.rstrip("\n").split("::")
            if len(fields) != 3:
                raise MovieLensInputError(f"{movies_path}:{n}: expected MovieID::Title::Genres, got {len(fields)} fields")
            try:
                ids.append(int(fields[0]))
            except ValueError:
                raise MovieLensInputError(f"{movies_path}:{n}: MovieID must be an integer, got {fields[0]!r}") from None
            genres.append([g for g in fields[2].strip().split("|") if g] or ["unknown"])
    return ratings, pd.DataFrame({ITEM: np.asarray(ids, dtype=np.int64), GENRES: genres})


def read_movielens(input_dir: str, ratings_file: Optional[str] = None) -> Tuple[pd.DataFrame, pd.DataFrame]:
    """Read a MovieLens directory -> (ratings ``userId, movieId, rating``, movies ``movieId, genres`` (str lists)).

    Raises ``MovieLensInputError`` naming the file (and line) when a file is missing or malformed, or when a rating
    names a movie the movies file lacks.
    """
    if not os.path.isdir(input_dir):
        raise MovieLensInputError(f"{input_dir}: --input_dir is not a directory")
    try:
        if os.path.isfile(os.path.join(input_dir, "u.data")):
            if not os.path.isfile(os.path.join(input_dir, "u.item")):
                raise MovieLensInputError(f"{input_dir}: has u.data but no u.item (the movies' genres)")
            ratings, movies = _read_ml100k(input_dir)
            movies_file = os.path.join(input_dir, "u.item")
        elif os.path.isfile(os.path.join(input_dir, "movies.dat")):
            ratings, movies = _read_ml1m(input_dir, ratings_file)
            movies_file = os.path.join(input_dir, "movies.dat")
        else:
            raise MovieLensInputError(f"{input_dir}: neither ml-100k (u.data, u.item) nor ml-1m (ratings.dat, "
                                      f"movies.dat) files found")
    except (MovieLensFormatError, FileNotFoundError) as e:
        raise MovieLensInputError(str(e)) from None
    if ratings.empty:
        raise MovieLensInputError(f"{input_dir}: no ratings")
    bad = ~ratings[ITEM].isin(movies[ITEM])
    if bad.any():
        raise MovieLensInputError(f"{movies_file}: has no movie {int(ratings[ITEM][bad].iloc[0])} "
                                  f"({int(bad.sum())} rating(s) refer to movies it lacks)")
    return ratings, movies


def split_ratings(ratings: pd.DataFrame, valid_fraction: float, seed: int) -> Tuple[pd.DataFrame, pd.DataFrame]:
    """Random train/valid split (the Merlin examples' ``train_test_split``), seeded; row order of each part kept."""
    if not 0.0 < valid_fraction < 1.0:
        raise ValueError(f"--valid_fraction must be in (0, 1), got {valid_fraction}")
    is_valid = np.random.default_rng(seed).random(len(ratings)) < valid_fraction
    train, valid = ratings[~is_valid].reset_index(drop=True), ratings[is_valid].reset_index(drop=True)
    if train.empty or valid.empty:
        raise MovieLensInputError(f"split of {len(ratings)} ratings with --valid_fraction {valid_fraction} left "
                                  f"{'train' if train.empty else 'valid'} empty")
    return train, valid


def _label(col):
    # A named function (not a lambda) so the saved workflow pickles it by reference to this module.
    return (col > POSITIVE_ABOVE).astype("int8")


def build_workflow(movies: pd.DataFrame):
    """The NVTabular workflow: join genres, Categorify userId/movieId/genres, label = rating > 3 (int8)."""
    import nvtabular as nvt
    from nvtabular import ops
    joined = [USER, ITEM] >> ops.JoinExternal(movies, on=[ITEM])
    categorical = joined >> ops.Categorify()
    label = [LABEL] >> ops.LambdaOp(_label, dtype=np.int8)
    return nvt.Workflow(categorical + label)


def cardinalities(workflow) -> Dict[str, int]:
    """Rows each categorical's embedding table needs (NVTabular's own count, out-of-vocabulary index included)."""
    from nvtabular.ops import get_embedding_sizes
    single, multi = get_embedding_sizes(workflow)
    sizes = dict(single)
    sizes.update(multi)
    return {name: int(sizes[name][0]) for name in (USER, ITEM, GENRES)}


def build_feature_spec(base_directory: str, cards: Dict[str, int], max_hotness: int,
                       rows: Dict[str, int]) -> FeatureSpec:
    """The FeatureSpec of the output directory (paths relative to it)."""
    feature_spec = {USER: {"dtype": "int64", "cardinality": cards[USER]},
                    ITEM: {"dtype": "int64", "cardinality": cards[ITEM]},
                    GENRES: {"dtype": "int64", "cardinality": cards[GENRES], "max_hotness": int(max_hotness)},
                    LABEL: {"dtype": "int8"}}
    columns = [USER, ITEM, GENRES, LABEL]
    source_spec = {"train": [{"type": "parquet", "features": columns, "files": ["train/part_0.parquet"]}],
                   "test": [{"type": "parquet", "features": columns, "files": ["valid/part_0.parquet"]}]}
    channel_spec = {LABEL_CHANNEL: [LABEL], ONEHOT_CHANNEL: [USER, ITEM], MULTIHOT_CHANNEL: [GENRES],
                    NUMERICAL_CHANNEL: []}
    metadata = {"dataset": "movielens", "rows": dict(rows), "workflow": WORKFLOW_DIR,
                "label": f"rating > {POSITIVE_ABOVE}", "produced_by": f"python -m {TOOL}"}
    return FeatureSpec(feature_spec, source_spec, channel_spec, metadata, base_directory=base_directory,
                       origin=os.path.join(base_directory, SPEC_NAME)).validate()


def run_etl(input_dir: str, output_dir: str, *, ratings_file: Optional[str] = None, valid_fraction: float = 0.2,
            seed: int = 42, overwrite: bool = False, out: Callable[[str], None] = print) -> Dict[str, object]:
    """Run the ETL; returns ``{"rows": {"train", "test"}, "cardinalities", "max_hotness", "seconds",
    "rows_per_second"}``. Raises ``MovieLensInputError``, ``OutputDirectoryError``, ``ValueError`` (a flag)."""
    start = time.perf_counter()
    check_output_directory(output_dir, overwrite)
    ratings, movies = read_movielens(input_dir, ratings_file)
    train, valid = split_ratings(ratings, valid_fraction, seed)
    out(f"[movielens.etl] read {len(ratings):,} ratings of {ratings[USER].nunique():,} users and "
        f"{ratings[ITEM].nunique():,} movies from {input_dir}: {len(train):,} train, {len(valid):,} valid "
        f"({time.perf_counter() - start:.1f} s)")
    from merlin.io import Dataset
    max_hotness = int(movies[GENRES].map(len).max())
    rows = {"train": len(train), "test": len(valid)}
    with atomic_directory(output_dir, overwrite=overwrite, tool=TOOL, marker=SPEC_NAME) as staging:
        t = time.perf_counter()
        workflow = build_workflow(movies)
        train_ds, valid_ds = Dataset(train, cpu=_cpu()), Dataset(valid, cpu=_cpu())
        workflow.fit(train_ds)
        workflow.save(os.path.join(staging, WORKFLOW_DIR))
        out(f"[movielens.etl] fitted the workflow on train in {time.perf_counter() - t:.1f} s")
        for ds, subdir in ((train_ds, "train"), (valid_ds, "valid")):
            t = time.perf_counter()
            workflow.transform(ds).to_parquet(os.path.join(staging, subdir), output_files=1, shuffle=None)
            _check_single_output(os.path.join(staging, subdir), os.path.join(os.path.abspath(output_dir), subdir))
            out(f"[movielens.etl] wrote {subdir}/ in {time.perf_counter() - t:.1f} s")
        cards = cardinalities(workflow)
        spec = build_feature_spec(staging, cards, max_hotness, rows)
        spec.to_yaml(os.path.join(staging, SPEC_NAME))
    seconds = time.perf_counter() - start
    out(f"[movielens.etl] done: cardinalities {cards}, max_hotness {max_hotness}, {seconds:.1f} s "
        f"({len(ratings) / seconds:,.0f} rows/s) -> {os.path.abspath(output_dir)}")
    return {"rows": rows, "cardinalities": cards, "max_hotness": max_hotness, "seconds": seconds,
            "rows_per_second": len(ratings) / seconds}


def _cpu() -> bool:
    """NVTabular on the GPU where cuDF is importable, pandas otherwise."""
    from merlin.core.compat import cudf
    return cudf is None


def _check_single_output(written_dir: str, final_dir: str) -> None:
    """Check that NVTabular wrote one ``part_0.parquet`` (the name the spec lists), and point its
    ``_file_list.txt`` (what HugeCTR's Parquet reader takes) at the final directory instead of the staging one."""
    names = sorted(n for n in os.listdir(written_dir) if n.endswith(".parquet"))
    if names != ["part_0.parquet"]:
        raise RuntimeError(f"{written_dir}: expected NVTabular to write part_0.parquet, found {names}")
    file_list = os.path.join(written_dir, "_file_list.txt")
    if os.path.exists(file_list):
        with open(file_list, encoding="utf-8") as f:
            lines = f.read().splitlines()
        lines = [os.path.join(final_dir, os.path.basename(l)) if l.endswith(".parquet") else l for l in lines]
        with open(file_list, "w", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m " + TOOL, description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--input_dir", required=True, help="MovieLens directory (ml-100k or ml-1m files)")
    p.add_argument("--output_dir", required=True, help="output: train/, valid/, feature_spec.yaml, workflow/")
    p.add_argument("--ratings_file", default=None, help="ml-1m: ratings file to read instead of the one found")
    p.add_argument("--valid_fraction", type=float, default=0.2, help="fraction of ratings drawn into valid/")
    p.add_argument("--seed", type=int, default=42, help="seed of the train/valid draw")
    p.add_argument("--overwrite", action="store_true", help="replace this tool's earlier output in --output_dir")
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        run_etl(args.input_dir, args.output_dir, ratings_file=args.ratings_file, valid_fraction=args.valid_fraction,
                seed=args.seed, overwrite=args.overwrite)
    except (MovieLensInputError, OutputDirectoryError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    import warnings
    # Merlin imports TensorFlow and torch, if present, only for dtype tables (seconds on 2 cores); the ETL needs neither.
    for _name in ("tensorflow", "torch"):
        sys.modules.setdefault(_name, None)
    warnings.filterwarnings("ignore", message=r".*dtype mappings did not load successfully")
    warnings.filterwarnings("ignore", message=r".*NVTabular Dataset (in|to) CPU mode")
    sys.exit(main())
