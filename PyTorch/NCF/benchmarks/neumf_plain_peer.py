"""The peer of ``benchmarks/training.py --peer``: NeuMF written the plain PyTorch way a user would write it first.

What makes it plain (and what the recipe does instead): negatives drawn on the host each epoch with numpy, a
``TensorDataset`` + ``DataLoader`` feeding shuffled batches, ``torch.nn.Dropout``, the default (unfused) Adam,
evaluation one user at a time. The model and the protocol are the NCF paper's: GMF 64 factors + MLP 256-256-128-64
(128-wide user and item embeddings), dropout 0.5, Adam 0.0045 (0.25, 0.5) at batch 65536 by default, 4 negatives
per positive drawn among the items the user has no training interaction with; the paper's ML-1M split (99 test
negatives per user) for users 0..2997, rebuilt from ``DATA/ncf-ml-1m`` and the ML-1M ratings prefix in
``DATA/movielens/ml-1m`` (items numbered in order of first appearance in ``ratings.dat``).

    python benchmarks/neumf_plain_peer.py --data $RECSYS_DATA_DIR --epochs 3

Prints one line per epoch on stderr and, last on stdout, one JSON object: ``per_epoch`` (``hr10``, ``ndcg10``,
``train_samples_per_s``, ``seconds``), ``train_samples_per_s`` (all epochs) and ``train_samples_per_s_excl_epoch1``.
"""
import argparse
import json
import os
import sys
import time

import numpy as np
import pandas as pd
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

MAX_USER = 2997   # the ML-1M ratings prefix shipped for tests ends inside user 2999: users 0..2997 are whole


def load_paper_split(data_dir: str):
    """(train user/item arrays, test users, test candidate matrix [U, 100] with the positive first, items)."""
    split = os.path.join(data_dir, "ncf-ml-1m", "ml-1m")
    ratings = pd.read_csv(os.path.join(data_dir, "movielens", "ml-1m", "ratings.users-1-2999.dat.gz"), sep="::",
                          engine="python", names=["user", "movie", "rating", "time"])
    ratings["user"] -= 1
    ratings["item"] = pd.factorize(ratings["movie"])[0]   # the paper's ids: order of first appearance
    ratings = ratings[ratings["user"] <= MAX_USER]
    test = pd.read_csv(split + ".test.rating", sep="\t", names=["user", "item", "rating", "time"])
    test = test[test["user"] <= MAX_USER]
    held_out = set(zip(test["user"], test["item"]))
    keep = [(u, i) not in held_out for u, i in zip(ratings["user"], ratings["item"])]
    train = ratings[keep]
    negatives = {}
    with open(split + ".test.negative") as f:
        for line in f:
            head, *rest = line.rstrip("\n").split("\t")
            user = int(head.strip("()").split(",")[0])
            if user <= MAX_USER:
                negatives[user] = [int(x) for x in rest]
    candidates = np.array([[item] + negatives[user] for user, item in zip(test["user"], test["item"])])
    num_items = int(max(ratings["item"].max(), candidates.max())) + 1
    return train["user"].to_numpy(), train["item"].to_numpy(), test["user"].to_numpy(), candidates, num_items


class NeuMF(nn.Module):
    def __init__(self, users: int, items: int, factors: int, layers, dropout: float):
        super().__init__()
        self.gmf_user, self.gmf_item = nn.Embedding(users, factors), nn.Embedding(items, factors)
        self.mlp_user, self.mlp_item = nn.Embedding(users, layers[0] // 2), nn.Embedding(items, layers[0] // 2)
        blocks = []
        for width_in, width_out in zip(layers, layers[1:]):
            blocks += [nn.Linear(width_in, width_out), nn.ReLU(), nn.Dropout(dropout)]
        self.mlp = nn.Sequential(*blocks)
        self.out = nn.Linear(factors + layers[-1], 1)
        for table in (self.gmf_user, self.gmf_item, self.mlp_user, self.mlp_item):
            nn.init.normal_(table.weight, std=0.01)

    def forward(self, user, item):
        gmf = self.gmf_user(user) * self.gmf_item(item)
        mlp = self.mlp(torch.cat([self.mlp_user(user), self.mlp_item(item)], dim=1))
        return self.out(torch.cat([gmf, mlp], dim=1)).squeeze(1)


def epoch_samples(users, items, num_items, negatives_per_positive, seen, rng):
    """The epoch's rows: every positive, and per positive that many negatives the user has not interacted with."""
    neg_users = np.repeat(users, negatives_per_positive)
    neg_items = rng.integers(0, num_items, size=len(neg_users))
    for k in range(len(neg_users)):
        while (neg_users[k], neg_items[k]) in seen:
            neg_items[k] = rng.integers(0, num_items)
    all_users = np.concatenate([users, neg_users])
    all_items = np.concatenate([items, neg_items])
    labels = np.concatenate([np.ones(len(users)), np.zeros(len(neg_users))]).astype(np.float32)
    return TensorDataset(torch.as_tensor(all_users), torch.as_tensor(all_items), torch.as_tensor(labels))


@torch.no_grad()
def evaluate(model, test_users, candidates, k: int = 10):
    model.eval()
    hits, ndcg = [], []
    for user, row in zip(test_users, candidates):
        scores = model(torch.full((len(row),), int(user)), torch.as_tensor(row))
        rank = int((scores[1:] >= scores[0]).sum())
        hits.append(rank < k)
        ndcg.append(1.0 / np.log2(rank + 2) if rank < k else 0.0)
    model.train()
    return float(np.mean(hits)), float(np.mean(ndcg))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True, help="the folder holding ncf-ml-1m/ and movielens/ml-1m/")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--time-limit", type=float, default=3600.0, help="stop after the epoch that passes it (seconds)")
    p.add_argument("--batch", type=int, default=65536)
    p.add_argument("--neg", type=int, default=4)
    p.add_argument("--lr", type=float, default=0.0045)
    p.add_argument("--beta1", type=float, default=0.25)
    p.add_argument("--beta2", type=float, default=0.5)
    p.add_argument("--dropout", type=float, default=0.5)
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args()
    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    users, items, test_users, candidates, num_items = load_paper_split(args.data)
    seen = set(zip(users.tolist(), items.tolist()))
    model = NeuMF(int(max(users.max(), test_users.max())) + 1, num_items, 64, [256, 256, 128, 64], args.dropout)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr, betas=(args.beta1, args.beta2))
    loss_fn = nn.BCEWithLogitsLoss()
    per_epoch, started = [], time.perf_counter()
    for epoch in range(1, args.epochs + 1):
        t0 = time.perf_counter()
        data = epoch_samples(users, items, num_items, args.neg, seen, rng)
        for u, i, y in DataLoader(data, batch_size=args.batch, shuffle=True):
            optimizer.zero_grad()
            loss_fn(model(u, i), y).backward()
            optimizer.step()
        train_seconds = time.perf_counter() - t0
        hr, ndcg = evaluate(model, test_users, candidates)
        per_epoch.append({"epoch": epoch, "hr10": hr, "ndcg10": ndcg, "seconds": train_seconds,
                          "train_samples_per_s": len(data) / train_seconds})
        print(f"epoch {epoch}: HR@10 {hr:.4f} NDCG@10 {ndcg:.4f} {len(data) / train_seconds:,.0f} samples/s",
              file=sys.stderr, flush=True)
        if time.perf_counter() - started > args.time_limit:
            break
    rows = sum(e["train_samples_per_s"] * e["seconds"] for e in per_epoch)
    later = per_epoch[1:] or per_epoch
    print(json.dumps({"peer": "neumf_plain_peer", "per_epoch": per_epoch,
                      "train_samples_per_s": rows / sum(e["seconds"] for e in per_epoch),
                      "train_samples_per_s_excl_epoch1": sum(e["train_samples_per_s"] * e["seconds"] for e in later)
                      / sum(e["seconds"] for e in later)}))


if __name__ == "__main__":
    main()
