"""Sparse datasets in the NCF paper's file format, made from MovieLens: the kind of data DeepCF, DMF and ConvNCF
publish (a few thousand users, density 0.1-1.5 %, 99 test negatives per user, three-field ``.rating`` files).

    python benchmarks/sparse_movielens.py --ratings $RECSYS_DATA_DIR/movielens/ml-1m/ratings.users-1-2999.dat.gz \
        --keep 0.08 --output /tmp/ncf-sparse/ml1m-8pct
    python convert.py --paper_split /tmp/ncf-sparse/ml1m-8pct/data --output /tmp/ncf-sparse/ml1m-8pct/converted

    # the long-tail kind: the 10 % most-rated movies gone, 6 ratings per user (density about 0.2 %)
    python benchmarks/sparse_movielens.py --ratings ... --keep 1 --drop_popular 0.1 --max_per_user 6 --output ...

What it does to the ratings (any layout ``convert.py`` reads):

0. with ``--drop_popular F``, removes every rating of the F most-rated items (a fraction of the items; ties broken
   by item id): the product-ratings sets of issue 35 have a long tail and a popularity HR@10 of 0.25-0.28, which
   MovieLens' blockbusters do not give;
1. keeps each rating with probability ``--keep`` (seeded); with ``--max_per_user K``, keeps at most K of each user's
   (a uniform sample); then drops the users left with fewer than ``--min_per_user`` ratings (a test item, a
   validation item and at least one to train on);
2. numbers users and items 0.. in order of first appearance among the kept rows;
3. per user, in time order (stable), the latest rating is the test item and the others the training rows;
4. draws ``--negatives`` test negatives per user, uniform without replacement among the items the user never rated.

Writes ``OUTPUT/data.train.rating`` (training rows in time order), ``OUTPUT/data.test.rating`` (``user item rating``:
three fields, no timestamp, as those papers publish) and ``OUTPUT/data.test.negative``. MovieLens' licence forbids
redistributing the result: write it under /tmp, never into the repository.
"""
from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from typing import List, Optional

import numpy as np

from neumf.data import convert


@dataclass(frozen=True)
class SparseSplit:
    """A paper-format split in memory: training rows in time order, one test item and its negatives per user."""
    train_users: np.ndarray    # int64 [P]
    train_items: np.ndarray    # int64 [P]
    test_items: np.ndarray     # int64 [U], user u's at position u
    negatives: np.ndarray      # int64 [U, K]
    num_items: int

    @property
    def density(self) -> float:
        return (len(self.train_users) + len(self.test_items)) / (len(self.test_items) * self.num_items)


def sparsify(users: np.ndarray, items: np.ndarray, times: np.ndarray, keep: float, min_per_user: int = 3,
             negatives: int = 99, seed: int = 1, drop_popular: float = 0.0,
             max_per_user: Optional[int] = None) -> SparseSplit:
    """Steps 0-4 of the module docstring on raw ``users, items, times`` (one row per rating, any ids)."""
    rng = np.random.default_rng(seed)
    kept = (rng.random(len(users)) < keep) & ~_most_rated(items, drop_popular)
    if max_per_user is not None:
        kept &= _at_most_per_user(users, kept, max_per_user, rng)
    users, items, times = users[kept], items[kept], times[kept]
    raw_ids, per_user = np.unique(users, return_counts=True)
    enough = np.isin(users, raw_ids[per_user >= min_per_user])
    users, items, times = users[enough], items[enough], times[enough]
    all_users, _ = _codes(users)
    all_items, num_items = _codes(items)
    order = np.lexsort((np.arange(len(times)), times, all_users))    # by user, then time, then file order
    sorted_users = all_users[order]
    last = np.r_[sorted_users[1:] != sorted_users[:-1], True]       # each user's latest row
    train_rows = np.sort(order[~last])                               # back to time order over all users
    by_time = np.argsort(times[train_rows], kind="stable")
    train_rows = train_rows[by_time]
    if num_items - np.bincount(all_users).max() < negatives:
        raise ValueError(f"a user rated all but fewer than {negatives} of the {num_items} items: no room for "
                         f"{negatives} test negatives")
    test_items = all_items[order][last]
    negative_items = np.empty((len(test_items), negatives), dtype=np.int64)
    rated = {}
    for u, i in zip(all_users.tolist(), all_items.tolist()):
        rated.setdefault(u, set()).add(i)
    for u in range(len(test_items)):
        pool = np.setdiff1d(np.arange(num_items), np.fromiter(rated[u], dtype=np.int64), assume_unique=True)
        negative_items[u] = rng.choice(pool, size=negatives, replace=False)
    return SparseSplit(all_users[train_rows], all_items[train_rows], test_items, negative_items, num_items)


def _most_rated(items: np.ndarray, fraction: float) -> np.ndarray:
    """A mask of the rows whose item is among the ``fraction`` most-rated items (none when 0)."""
    ids, counts = np.unique(items, return_counts=True)
    top = ids[np.lexsort((ids, -counts))[:int(round(fraction * len(ids)))]]
    return np.isin(items, top)


def _at_most_per_user(users: np.ndarray, kept: np.ndarray, limit: int, rng: np.random.Generator) -> np.ndarray:
    """A mask keeping at most ``limit`` of each user's ``kept`` rows, chosen uniformly (a random rank per row)."""
    rows = np.flatnonzero(kept)
    shuffled = rows[rng.permutation(len(rows))]
    shuffled = shuffled[np.argsort(users[shuffled], kind="stable")]   # by user, random order within a user
    starts = np.r_[0, np.flatnonzero(users[shuffled][1:] != users[shuffled][:-1]) + 1]
    rank = np.arange(len(shuffled)) - np.repeat(starts, np.diff(np.r_[starts, len(shuffled)]))
    mask = np.zeros(len(users), dtype=bool)
    mask[shuffled[rank < limit]] = True
    return mask


def _codes(values: np.ndarray):
    """``(codes, count)``: ``values`` numbered 0.. in order of first appearance."""
    _, first, inverse = np.unique(values, return_index=True, return_inverse=True)
    rank = np.empty(len(first), dtype=np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(len(first))
    return rank[inverse], len(first)


def write_paper_files(split: SparseSplit, prefix: str) -> None:
    """``PREFIX.train.rating``, ``PREFIX.test.rating`` (``user item 1``, three fields) and ``PREFIX.test.negative``."""
    os.makedirs(os.path.dirname(os.path.abspath(prefix)), exist_ok=True)
    with open(prefix + ".train.rating", "w") as f:
        f.writelines(f"{u}\t{i}\t1\n" for u, i in zip(split.train_users.tolist(), split.train_items.tolist()))
    with open(prefix + ".test.rating", "w") as f:
        f.writelines(f"{u}\t{i}\t1\n" for u, i in enumerate(split.test_items.tolist()))
    with open(prefix + ".test.negative", "w") as f:
        f.writelines(f"({u},{i})\t" + "\t".join(map(str, negs)) + "\n"
                     for u, (i, negs) in enumerate(zip(split.test_items.tolist(), split.negatives.tolist())))


def build(ratings_path: str, output: str, keep: float, min_per_user: int = 3, seed: int = 1,
          max_user: Optional[int] = None, drop_popular: float = 0.0, max_per_user: Optional[int] = None) -> str:
    """Read ``ratings_path``, sparsify, write the paper files under ``output``; returns their prefix."""
    columns = convert.read_ratings_columns(ratings_path)
    users, items, times = (np.asarray(columns[c], dtype=np.int64) for c in ("user", "item", "timestamp"))
    if max_user is not None:
        rows = users <= max_user
        users, items, times = users[rows], items[rows], times[rows]
    split = sparsify(users, items, times, keep, min_per_user, seed=seed, drop_popular=drop_popular,
                     max_per_user=max_per_user)
    prefix = os.path.join(output, "data")
    write_paper_files(split, prefix)
    print(f"sparse_movielens.py: {len(split.test_items)} users, {split.num_items} items, "
          f"{len(split.train_users)} training rows, density {100 * split.density:.2f} % -> {prefix}.*")
    return prefix


def main(argv: Optional[List[str]] = None) -> str:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ratings", required=True, help="a MovieLens ratings file (ratings.dat, u.data, ratings.csv)")
    p.add_argument("--output", required=True, help="directory for data.{train.rating,test.rating,test.negative}")
    p.add_argument("--keep", type=float, required=True, help="fraction of the ratings kept, in (0, 1]")
    p.add_argument("--min_per_user", type=int, default=3, help="users with fewer kept ratings are dropped (>= 3)")
    p.add_argument("--max_user", type=int, default=None, help="keep raw user ids <= this (a cut-short last user)")
    p.add_argument("--drop_popular", type=float, default=0.0,
                   help="remove the ratings of this fraction of the items, the most-rated first (step 0)")
    p.add_argument("--max_per_user", type=int, default=None, help="keep at most this many ratings per user")
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args(argv)
    if not 0 < args.keep <= 1 or args.min_per_user < 3:
        p.error("--keep must be in (0, 1] and --min_per_user >= 3")
    if not 0 <= args.drop_popular < 1 or (args.max_per_user is not None and args.max_per_user < args.min_per_user):
        p.error("--drop_popular must be in [0, 1) and --max_per_user >= --min_per_user")
    return build(args.ratings, args.output, args.keep, args.min_per_user, args.seed, args.max_user,
                 args.drop_popular, args.max_per_user)


if __name__ == "__main__":
    main()
