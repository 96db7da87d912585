"""Generate a MovieLens directory in the ml-20m/ml-25m layout (``ratings.csv``, ``movies.csv``) at any size.

    python -m wide_deep.movielens.generate --output_dir /data/ml-25m-generated              # ML-25M's size
    python -m wide_deep.movielens.generate --output_dir /tmp/ml-gen --rows 2000000

For running the MovieLens example at ML-25M's size where GroupLens' files are absent (they may not be
redistributed). The layout is GroupLens': ``ratings.csv`` with the header ``userId,movieId,rating,timestamp``, rows
sorted by user then movie, half-star ratings written ``4.0``/``3.5``; ``movies.csv`` with the header
``movieId,title,genres``, titles quoted when they hold a comma, genres ``A|B|C`` from ML-25M's 19 genres or
``(no genres listed)``.

The shape follows ML-25M (``--rows`` 25,000,095 ratings; 162,541 users scaled with ``--rows``, every user with at
least 20 ratings; 62,423 movies with long-tailed popularity). Ratings come from a small latent-factor model (user
and movie biases, 8 latent factors, a per-user taste for each genre, noise), rounded to half stars, so that a model
that learns users' tastes beats the movies' popularity, as on the real data; the label rate (rating > 3) is about
60 %, as in ML-25M (62 %). Users are generated a block at a time and appended, so memory stays small at any size.

``main(argv)`` returns ``{"ratings", "movies", "users", "bytes", "seconds"}``.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import time
from typing import Dict, Optional, Sequence

import numpy as np

from recsys_common.cli import run_main
from recsys_common.io import OutputDirectoryError, atomic_directory
from recsys_common.logger import Progress

TOOL = "wide_deep.movielens.generate"
ML25M_RATINGS, ML25M_USERS, ML25M_MOVIES = 25_000_095, 162_541, 62_423
GENRES = ("Action", "Adventure", "Animation", "Children", "Comedy", "Crime", "Documentary", "Drama", "Fantasy",
          "Film-Noir", "Horror", "IMAX", "Musical", "Mystery", "Romance", "Sci-Fi", "Thriller", "War", "Western")
NO_GENRES = "(no genres listed)"
FIRST_TIME, LAST_TIME = 789_652_009, 1_574_327_703   # ML-25M's timestamp range
FACTORS = 8
USERS_PER_BLOCK = 8192
RATING_TEXT = np.array([f"{r / 2:.1f}" for r in range(0, 11)])   # index = 2 * rating


def _movies(rng: np.random.Generator, num_movies: int) -> Dict[str, np.ndarray]:
    """Movie ids (gaps like GroupLens'), genres (1-4 of them, a few with none), popularity, bias and factors."""
    ids = np.sort(rng.choice(np.arange(1, 3 * num_movies), size=num_movies, replace=False))
    num_genres = rng.choice([0, 1, 2, 3, 4], size=num_movies, p=[0.01, 0.35, 0.35, 0.2, 0.09])
    genre_weights = np.linspace(2.0, 0.3, len(GENRES))
    genre_weights /= genre_weights.sum()
    genre_sets = [np.sort(rng.choice(len(GENRES), size=k, replace=False, p=genre_weights)) for k in num_genres]
    popularity = rng.pareto(1.1, num_movies) + 0.05        # a long tail: a few movies get most ratings
    popularity /= popularity.sum()
    popularity = np.minimum(popularity, 0.003)             # ML-25M's most rated movie has 0.3 % of the ratings
    return {"ids": ids, "genres": genre_sets, "popularity": popularity / popularity.sum(),
            "bias": rng.normal(0.0, 0.45, num_movies) + 0.15 * np.log(popularity / popularity.mean()),
            "factors": rng.normal(0.0, 0.5, (num_movies, FACTORS))}


def _genre_matrix(genre_sets, num_movies: int) -> np.ndarray:
    """[movies, genres] 1/len weights: a user's taste for a movie is the mean of its genres' tastes."""
    matrix = np.zeros((num_movies, len(GENRES)), dtype=np.float32)
    for row, genres in enumerate(genre_sets):
        if len(genres):
            matrix[row, genres] = 1.0 / len(genres)
    return matrix


def write_movies_csv(path: str, movies: Dict[str, np.ndarray], rng: np.random.Generator) -> None:
    """GroupLens' ``movies.csv``: some titles hold commas and quotes; the csv module quotes them as GroupLens does."""
    with open(path, "w", encoding="utf-8", newline="") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(["movieId", "title", "genres"])
        years = rng.integers(1902, 2020, len(movies["ids"]))
        for movie, genres, year in zip(movies["ids"], movies["genres"], years):
            title = f"Movie {movie}, The ({year})" if movie % 7 == 0 else f"Movie {movie} ({year})"
            if movie % 31 == 0:
                title = f'"Quoted" Movie {movie} ({year})'
            writer.writerow([int(movie), title, "|".join(GENRES[g] for g in genres) or NO_GENRES])


def generate(output_dir: str, rows: int = ML25M_RATINGS, users: Optional[int] = None,
             movies: int = ML25M_MOVIES, seed: int = 0, overwrite: bool = False,
             out=print) -> Dict[str, object]:
    """Write ``ratings.csv`` and ``movies.csv`` into ``output_dir`` (staged, then moved in); see the module doc."""
    if rows < 40 or movies < 20:
        raise ValueError(f"--rows must be at least 40 and --movies at least 20, got {rows} and {movies}")
    users = users or max(2, min(rows // 20, round(ML25M_USERS * rows / ML25M_RATINGS)))
    if users * 20 > rows:
        raise ValueError(f"{users} users need at least 20 ratings each: --rows must be at least {users * 20}")
    start = time.perf_counter()
    rng = np.random.default_rng(seed)
    film = _movies(rng, movies)
    taste_of_movie = _genre_matrix(film["genres"], movies)
    cumulative = np.cumsum(film["popularity"])
    # ratings per user: 20 + a long tail, summing to exactly `rows`
    extra = rng.pareto(1.3, users)
    per_user = 20 + np.floor(extra / extra.sum() * (rows - 20 * users)).astype(np.int64)
    per_user = np.minimum(per_user, movies // 3)   # room left to draw distinct movies
    shortfall = rows - int(per_user.sum())
    per_user += np.bincount(rng.integers(0, users, shortfall), minlength=users)
    import pyarrow as pa
    import pyarrow.csv as pacsv
    options = pacsv.WriteOptions(include_header=False, quoting_style="none")
    with atomic_directory(output_dir, overwrite=overwrite, tool=TOOL, marker="ratings.csv") as staging:
        write_movies_csv(os.path.join(staging, "movies.csv"), film, rng)
        done = 0
        progress = Progress("[movielens.generate] ratings", rows, every=10.0, out=out, estimated=True)
        with open(os.path.join(staging, "ratings.csv"), "wb") as f:
            f.write(b"userId,movieId,rating,timestamp\n")
            for lo in range(0, users, USERS_PER_BLOCK):
                counts = per_user[lo:lo + USERS_PER_BLOCK]
                # a user rates each movie once: draw by popularity, keep the distinct (user, movie) pairs (sorted, as
                # GroupLens' file is) and draw again for the users still short of their count
                key, need = np.zeros(0, dtype=np.int64), counts
                for _ in range(20):
                    if not need.any():
                        break
                    user = np.repeat(np.arange(lo, lo + len(counts), dtype=np.int64), need)
                    movie = np.minimum(np.searchsorted(cumulative, rng.random(len(user)) * cumulative[-1]),
                                       movies - 1)
                    key = np.unique(np.concatenate([key, user * movies + movie]))
                    need = counts - np.bincount(key // movies - lo, minlength=len(counts))
                user, movie = key // movies, key % movies
                n = len(key)
                u_bias = rng.normal(0.0, 0.4, len(counts))
                u_factors = rng.normal(0.0, 0.5, (len(counts), FACTORS))
                u_taste = rng.normal(0.0, 0.8, (len(counts), len(GENRES))).astype(np.float32)
                local = user - lo
                score = (3.45 + u_bias[local] + film["bias"][movie]
                         + np.einsum("ij,ij->i", u_factors[local], film["factors"][movie])
                         + np.einsum("ij,ij->i", u_taste[local], taste_of_movie[movie])
                         + rng.normal(0.0, 0.6, n))
                half_stars = np.clip(np.rint(score * 2), 1, 10).astype(np.int64)
                table = pa.table({"userId": (user + 1).astype(np.int32),
                                  "movieId": film["ids"][movie].astype(np.int32),
                                  "rating": pa.array(RATING_TEXT[half_stars]),
                                  "timestamp": rng.integers(FIRST_TIME, LAST_TIME, n)})
                pacsv.write_csv(table, f, options)
                done += n
                progress.set(done)
    size = sum(os.path.getsize(os.path.join(output_dir, name)) for name in ("ratings.csv", "movies.csv"))
    result = {"ratings": done, "movies": movies, "users": users, "bytes": size,
              "seconds": time.perf_counter() - start}
    out(f"[movielens.generate] wrote {done:,} ratings of {users:,} users and {movies:,} movies "
        f"({size / 1e6:,.0f} MB) in {result['seconds']:.1f} s -> {output_dir}")
    return result


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m " + TOOL, description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--output_dir", required=True, help="directory to write ratings.csv and movies.csv into")
    p.add_argument("--rows", type=int, default=ML25M_RATINGS, help="ratings (about: repeats of a pair are dropped)")
    p.add_argument("--users", type=int, default=None, help="users (default: ML-25M's 162,541 scaled with --rows)")
    p.add_argument("--movies", type=int, default=ML25M_MOVIES, help="movies")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--overwrite", action="store_true", help="replace this tool's earlier files in --output_dir")
    return p


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, object]:
    args = build_parser().parse_args(argv)
    result = generate(args.output_dir, args.rows, args.users, args.movies, args.seed, args.overwrite)
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    run_main(main, input_errors=(OutputDirectoryError, ValueError))
