"""Top-K recommendations from an NCF checkpoint, without a server.

    python recommend.py --load_checkpoint_path /tmp/ncf_quickstart/checkpoints/model.pth \
        --data /tmp/ncf_quickstart/cache/synthetic --users 0 5 42 -k 10 --output recommendations.csv

For every requested user the model scores every item of the dataset; the items the user has in the training data
(``train`` mapping of ``--data``) are excluded, and the ``K`` best remaining items are written, best first, with
their probability ``sigmoid(logit)``. Equal scores are ordered by item id (a stable sort), so the output is
deterministic. Ids are the dataset's ids (``convert.py`` numbers users and items ``0..N-1`` in order of first
appearance, as NVIDIA's converter does).

Users come from ``--users`` or ``--users_file`` (one id per line, or a CSV with a ``user`` column). The output is
CSV (``user,rank,item,probability``) or JSON (by ``--output``'s extension or ``--format``), written atomically;
an existing file is replaced only with ``--overwrite``.

This module also holds :func:`load_model`, the one way the serving tools (``deployment/``) turn a checkpoint and
optional model flags into an eval-mode model, with a clear error when the two disagree.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import nn

from recsys_common.cli import InputError, run_main
from recsys_common.feature_spec import FeatureSpecError
from recsys_common.io import atomic_path

from .checkpointing import CheckpointError, load_model_weights, read_checkpoint
from .data import DatasetError, load_dataset
from .model import MODEL_NAMES, NVIDIA_MARKER, build_model, strip_ddp_prefix

# ncf.py's defaults, used for a bare state dict (which records no configuration) when a flag is not given
DEFAULT_FACTORS = 64
DEFAULT_LAYERS = (256, 256, 128, 64)
DEFAULT_DROPOUT = 0.5


class RecommendError(InputError):
    """Bad request for recommendations (unknown user, unreadable users file, existing output)."""


# ------------------------------------------------------------------------------------------------ the model
def _table_rows(state: Dict[str, torch.Tensor], names: Sequence[str]) -> Optional[int]:
    for name in names:
        if name in state:
            return int(state[name].shape[0])
    return None


def _flag_mismatches(config: Dict, requested: Dict) -> List[str]:
    flag_names = {"model": "--model", "factors": "-f/--factors", "layers": "--layers", "dropout": "--dropout",
                  "num_users": "--n_users", "num_items": "--n_items"}
    problems = []
    for key, value in requested.items():
        if value is None or key not in config:
            continue
        saved = list(config[key]) if key == "layers" else config[key]
        wanted = list(value) if key == "layers" else value
        if saved != wanted:
            shown = " ".join(map(str, saved)) if key == "layers" else saved
            problems.append(f"{flag_names[key]} {' '.join(map(str, wanted)) if key == 'layers' else wanted} "
                            f"given, the checkpoint was trained with {flag_names[key]} {shown}")
    return problems


def load_model(checkpoint_path: str, *, model: Optional[str] = None, factors: Optional[int] = None,
               layers: Optional[Sequence[int]] = None, dropout: Optional[float] = None,
               num_users: Optional[int] = None, num_items: Optional[int] = None) -> Tuple[nn.Module, Dict]:
    """The model stored in ``checkpoint_path``, on the CPU in eval mode, and its configuration dict
    (``model, num_users, num_items, factors, layers, dropout``, as ``ncf.py`` records it).

    ``checkpoint_path`` is an ``ncf.py`` checkpoint (``model.pth`` / ``last.pth``, which record their
    configuration), or a bare state dict (ours, from DDP, or NVIDIA's NeuMF ``model.pth``), for which the
    configuration comes from the arguments (``ncf.py``'s defaults where ``None``) and the table sizes from the
    embedding shapes. An argument that is given must agree with the checkpoint: any disagreement raises
    :class:`neumf.checkpointing.CheckpointError` listing every mismatched flag (or, for a bare state dict, every mismatched
    parameter and shape).
    """
    saved = read_checkpoint(checkpoint_path)
    state = strip_ddp_prefix(saved["model"])
    requested = {"model": model, "factors": factors, "layers": list(layers) if layers is not None else None,
                 "dropout": dropout, "num_users": num_users, "num_items": num_items}
    if "config" in saved:
        config = dict(saved["config"])
        problems = _flag_mismatches(config, requested)
        if problems:
            raise CheckpointError(f"{checkpoint_path}: the flags do not match the checkpoint (omit them to use the "
                                  "checkpoint's configuration):\n  " + "\n  ".join(problems))
    else:
        nvidia = NVIDIA_MARKER in state
        users = _table_rows(state, ["mf_user_embed.weight", "mlp_user_embed.weight"] if nvidia else
                            ["gmf.user_embedding.weight", "mlp.user_embedding.weight"])
        items = _table_rows(state, ["mf_item_embed.weight", "mlp_item_embed.weight"] if nvidia else
                            ["gmf.item_embedding.weight", "mlp.item_embedding.weight"])
        if users is None or items is None:
            raise CheckpointError(f"{checkpoint_path}: no user/item embedding found: not an NCF model state dict")
        config = {"model": model or "neumf", "num_users": users, "num_items": items,
                  "factors": factors if factors is not None else DEFAULT_FACTORS,
                  "layers": list(layers) if layers is not None else list(DEFAULT_LAYERS),
                  "dropout": dropout if dropout is not None else DEFAULT_DROPOUT}
        problems = _flag_mismatches(config, {"num_users": num_users, "num_items": num_items})
        if problems:
            raise CheckpointError(f"{checkpoint_path}: " + "; ".join(problems))
    if config["model"] not in MODEL_NAMES:
        raise CheckpointError(f"{checkpoint_path}: unknown model {config['model']!r} in the checkpoint")
    try:
        net = build_model(config["model"], config["num_users"], config["num_items"], config["factors"],
                          config["layers"], config["dropout"])
    except ValueError as err:
        raise CheckpointError(f"{checkpoint_path}: {err}") from err
    load_model_weights(net, state, checkpoint_path)
    return net.eval(), config


# ------------------------------------------------------------------------------------------------ ranking
def seen_items_by_user(train_users: np.ndarray, train_items: np.ndarray, num_users: int) -> Tuple[np.ndarray,
                                                                                                 np.ndarray]:
    """CSR of the training items per user: ``items[offsets[u]:offsets[u + 1]]`` are user ``u``'s items."""
    order = np.argsort(train_users, kind="stable")
    offsets = np.zeros(num_users + 1, dtype=np.int64)
    np.cumsum(np.bincount(train_users, minlength=num_users), out=offsets[1:])
    return offsets, train_items[order]


@torch.no_grad()
def recommend(model: nn.Module, users: Sequence[int], num_items: int, seen_offsets: np.ndarray,
              seen_items: np.ndarray, topk: int, max_rows: int = 1 << 20) -> List[Tuple[int, List[int], List[float]]]:
    """For each user: ``(user, items, probabilities)``, the ``topk`` best items it has not seen, best first.

    Scores every item for ``max(1, max_rows // num_items)`` users at a time. Seen items get ``-inf`` and are never
    returned, so a user who has seen all but ``n < topk`` items gets ``n``. Ties keep item order (stable sort).
    """
    all_items = torch.arange(num_items, dtype=torch.int64)
    per_chunk = max(1, max_rows // num_items)
    out = []
    for lo in range(0, len(users), per_chunk):
        chunk = torch.as_tensor(list(users[lo: lo + per_chunk]), dtype=torch.int64)
        logits = model(chunk.repeat_interleave(num_items), all_items.repeat(len(chunk))).float()
        scores = logits.view(len(chunk), num_items)
        for row, user in enumerate(chunk.tolist()):
            seen = torch.as_tensor(seen_items[seen_offsets[user]: seen_offsets[user + 1]], dtype=torch.int64)
            scores[row, seen] = float("-inf")
        order = torch.sort(scores, dim=1, descending=True, stable=True).indices
        for row, user in enumerate(chunk.tolist()):
            available = num_items - int(torch.isinf(scores[row]).sum())  # -inf only where seen
            best = order[row, : min(topk, available)]
            out.append((user, best.tolist(), torch.sigmoid(scores[row, best]).tolist()))
    return out


# ------------------------------------------------------------------------------------------------ input / output
def read_users_file(path: str) -> List[int]:
    """User ids from ``path``: one per line, or a CSV whose header has a ``user`` column. Errors name the line."""
    if not os.path.isfile(path):
        raise RecommendError(f"{path}: users file not found")
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    if not rows:
        raise RecommendError(f"{path}: users file is empty")
    column, start = 0, 0
    header = [c.strip() for c in rows[0]]
    if "user" in header:
        column, start = header.index("user"), 1
    users = []
    for line, row in enumerate(rows[start:], start=start + 1):
        if not row or not "".join(row).strip():
            continue
        value = row[column].strip() if column < len(row) else ""
        try:
            users.append(int(value))
        except ValueError:
            raise RecommendError(f"{path}: line {line}: user id {value!r} is not an integer") from None
    if not users:
        raise RecommendError(f"{path}: no user ids")
    return users


def check_users(users: Sequence[int], num_users: int, origin: str) -> None:
    bad = [u for u in users if not 0 <= u < num_users]
    if bad:
        raise RecommendError(f"{origin}: unknown user id(s) {bad[:10]}{' ...' if len(bad) > 10 else ''}: the "
                             f"checkpoint knows users 0..{num_users - 1}")


def write_recommendations(results, path: str, fmt: str, overwrite: bool, meta: Dict) -> None:
    """CSV ``user,rank,item,probability`` or JSON ``{..meta, "recommendations": [...]}``, atomically."""
    if os.path.lexists(path) and not overwrite:
        raise RecommendError(f"{path}: exists; pass --overwrite to replace it")
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    with atomic_path(path) as tmp:
        with open(tmp, "w", newline="") as f:
            if fmt == "csv":
                writer = csv.writer(f)
                writer.writerow(["user", "rank", "item", "probability"])
                for user, items, probs in results:
                    for rank, (item, prob) in enumerate(zip(items, probs), start=1):
                        writer.writerow([user, rank, item, f"{prob:.8g}"])
            else:
                json.dump(dict(meta, recommendations=[{"user": u, "items": i, "probabilities": p}
                                                      for u, i, p in results]), f, indent=1)
                f.write("\n")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description="Top-K unseen items for given users from an NCF checkpoint")
    p.add_argument("--load_checkpoint_path", required=True, help="checkpoint written by ncf.py (or a state dict)")
    p.add_argument("--data", required=True, help="the dataset the model was trained on (its train mapping lists "
                                                 "the items to exclude)")
    p.add_argument("--feature_spec_file", default="feature_spec.yaml")
    who = p.add_mutually_exclusive_group(required=True)
    who.add_argument("--users", type=int, nargs="+", help="user ids")
    who.add_argument("--users_file", help="file of user ids: one per line, or CSV with a 'user' column")
    p.add_argument("-k", "--topk", type=int, default=10, help="items per user")
    p.add_argument("--output", required=True, help="output file (.csv or .json)")
    p.add_argument("--format", choices=("csv", "json"), default=None, help="default: from --output's extension")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --output")
    p.add_argument("--max_rows", type=int, default=1 << 20, help="(user, item) pairs scored per forward pass")
    # only for a bare state dict (an ncf.py checkpoint records them; given, they must agree with it)
    p.add_argument("--model", choices=MODEL_NAMES, default=None)
    p.add_argument("-f", "--factors", type=int, default=None)
    p.add_argument("--layers", type=int, nargs="+", default=None)
    p.add_argument("--dropout", type=float, default=None)
    return p


def main(argv: Optional[List[str]] = None) -> List[Tuple[int, List[int], List[float]]]:
    p = build_parser()
    args = p.parse_args(argv)
    if args.topk <= 0:
        p.error("-k/--topk must be > 0")
    fmt = args.format or ("json" if args.output.lower().endswith(".json") else
                          "csv" if args.output.lower().endswith(".csv") else None)
    if fmt is None:
        p.error(f"--output {args.output}: extension is neither .csv nor .json; pass --format")
    if os.path.lexists(args.output) and not args.overwrite:  # before the work, not after
        raise RecommendError(f"{args.output}: exists; pass --overwrite to replace it")
    users = args.users if args.users is not None else read_users_file(args.users_file)
    model, config = load_model(args.load_checkpoint_path, model=args.model, factors=args.factors,
                               layers=args.layers, dropout=args.dropout)
    check_users(users, config["num_users"], "--users" if args.users is not None else args.users_file)
    data = load_dataset(args.data, args.feature_spec_file)
    if (data.num_users, data.num_items) != (config["num_users"], config["num_items"]):
        raise RecommendError(f"--data {args.data}: {data.num_users} users and {data.num_items} items, the "
                             f"checkpoint was trained on {config['num_users']} users and "
                             f"{config['num_items']} items: not its dataset")
    offsets, seen = seen_items_by_user(data.train_users, data.train_items, data.num_users)
    results = recommend(model, users, data.num_items, offsets, seen, args.topk, args.max_rows)
    write_recommendations(results, args.output, fmt, args.overwrite,
                          {"checkpoint": os.path.abspath(args.load_checkpoint_path), "topk": args.topk,
                           "excluded": "items in the training data"})
    print(f"recommend.py: top-{args.topk} items for {len(users)} user(s) -> {args.output}")
    return results


# Bad input: exit 2 with one error line (recsys_common.cli.run_main); tests run the command line the same way.
INPUT_ERRORS = (RecommendError, CheckpointError, DatasetError, FeatureSpecError)

if __name__ == "__main__":
    run_main(main, prog="recommend.py", input_errors=INPUT_ERRORS)
