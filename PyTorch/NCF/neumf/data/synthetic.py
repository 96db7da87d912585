"""Synthetic MovieLens-shaped implicit feedback: ``user_id,item_id,timestamp`` CSV with learnable structure.

Each user ``u`` and item ``i`` get a latent vector (``--dim``); item popularity follows a Zipf law. A user's
number of interactions is drawn from a shifted power law (at least ``--min_per_user``, like MovieLens' 20), and
its items are sampled without replacement with probability proportional to
``popularity_i ** 0.5 * exp(--affinity * <x_u, y_i>)`` (Gumbel top-k). Timestamps are random, so the held-out
latest interaction is a fair sample of the user's taste: a collaborative model beats popularity on it.

    python synthetic.py --output /tmp/ncf_synthetic/ratings.csv --users 2000 --items 1500

The file is then converted like any BYO CSV: ``python convert.py --path ratings.csv --output DIR``.
"""
from __future__ import annotations

import argparse
import os
from typing import List, Optional

import numpy as np

from recsys_common.cli import run_main
from recsys_common.io import atomic_path


def generate(num_users: int, num_items: int, mean_per_user: float = 60.0, min_per_user: int = 20,
             dim: int = 8, affinity: float = 2.5, seed: int = 0) -> np.ndarray:
    """int64 array ``[N, 3]`` of (user_id, item_id, timestamp), ids starting at 1 as in MovieLens."""
    if num_items <= min_per_user:
        raise ValueError(f"--items ({num_items}) must exceed --min_per_user ({min_per_user})")
    rng = np.random.default_rng(seed)
    user_vec = rng.normal(size=(num_users, dim)) / np.sqrt(dim)
    item_vec = rng.normal(size=(num_items, dim)) / np.sqrt(dim) * 2
    log_pop = -0.5 * np.log(rng.permutation(num_items) + 1.0)  # Zipf(1) popularity, square-rooted
    extra = rng.pareto(2.0, size=num_users)
    extra = extra / max(extra.mean(), 1e-9) * max(mean_per_user - min_per_user, 0)
    counts = np.minimum(min_per_user + extra.astype(np.int64), num_items // 2)
    rows = []
    chunk = max(1, 2_000_000 // num_items)
    for lo in range(0, num_users, chunk):
        hi = min(lo + chunk, num_users)
        logits = affinity * user_vec[lo:hi] @ item_vec.T * np.sqrt(dim) + log_pop
        keys = logits + rng.gumbel(size=logits.shape)
        order = np.argsort(-keys, axis=1)
        for r, u in enumerate(range(lo, hi)):
            items = order[r, : counts[u]]
            times = 978_300_000 + np.sort(rng.integers(0, 30_000_000, size=len(items)))
            rows.append(np.stack([np.full(len(items), u + 1), items + 1, times], axis=1))
    return np.concatenate(rows).astype(np.int64)


def write_csv(ratings: np.ndarray, path: str) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with atomic_path(path) as tmp:
        np.savetxt(tmp, ratings, fmt="%d", delimiter=",", header="user_id,item_id,timestamp", comments="")


def main(argv: Optional[List[str]] = None) -> str:
    """Writes the ratings CSV; returns its path."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--output", required=True, help="CSV file to write")
    p.add_argument("--users", type=int, default=2000)
    p.add_argument("--items", type=int, default=1500)
    p.add_argument("--mean_per_user", type=float, default=60.0)
    p.add_argument("--min_per_user", type=int, default=20)
    p.add_argument("--dim", type=int, default=8, help="latent dimension of the hidden taste model")
    p.add_argument("--affinity", type=float, default=2.5, help="strength of taste vs popularity")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    ratings = generate(args.users, args.items, args.mean_per_user, args.min_per_user, args.dim, args.affinity,
                       args.seed)
    write_csv(ratings, args.output)
    print(f"synthetic.py: {len(ratings)} interactions, {args.users} users, {args.items} items -> {args.output}")
    return args.output


if __name__ == "__main__":
    run_main(main, prog="synthetic.py")
