"""Training and evaluation speed of this recipe, and of the same NeuMF written naively, as JSON.

    python benchmarks/training.py --shape ml-100k -e 2 -b 8192                       # CPU: recipe vs naive, ratio
    python benchmarks/training.py --data /data/cache/ml-1m -e 10 -t 0.67 --no_naive  # time to target on real data
    python benchmarks/training.py --shape ml-20m -e 3 --amp --no_naive               # GPU, NVIDIA's ML-20m shape, 1M batch

Data: ``--data`` a converted dataset, or ``--shape`` a synthetic one with the shape of a MovieLens set (users, items,
training positives, 101 test candidates per user; uniform random ids, made directly on the device). Synthetic data
has no structure to learn, so time-to-target is only meaningful with ``--data``.

Both implementations train the same model (``--model``, ``-f``, ``--layers``, ``--dropout``) on the same data
for ``-e`` epochs with the same batch size and learning rate:

* **recipe** -- what ncf.py does: data resident on the device, negatives drawn and shuffled there each epoch,
  batches sliced from the permuted tensors, ``torch.optim.Adam(fused=True)``, vectorised evaluation.
* **naive** -- a typical first implementation: negatives drawn with numpy on the host each epoch, a
  ``DataLoader(TensorDataset(...), shuffle=True)`` that collates every batch from single rows, unfused Adam
  (``foreach=False``), evaluation scored through a ``DataLoader`` as well.

Reported per implementation: median training samples/s and evaluation samples/s over the epochs, and the
time (training + evaluation) until HR@K first reached ``--threshold`` (null if never), and the user and system
CPU seconds it used (``system_over_user``: page faults show up as system time). ``train_speedup`` is
recipe / naive training samples/s.

**Against the plain PyTorch peer** (``benchmarks/neumf_plain_peer.py``, the default of ``--peer``) on the NCF paper's
ML-1M split, run back to back with the peer's configuration (GMF 64, MLP 256-256-128-64, dropout 0.5, batch 65536,
Adam 0.0045 / 0.25 / 0.5)::

    python benchmarks/training.py --paper_ml1m $RECSYS_DATA_DIR --peer -e 3 -b 65536 --amp --compile --no_naive \
        --exclude_positives

``--paper_ml1m DIR`` converts DIR's ``ncf-ml-1m`` split with the ``movielens/ml-1m`` ratings prefix (users
0..2997, as the peer does) into a temporary directory; ``--peer SCRIPT`` runs the peer as a child process on the
same DIR with the same epochs, batch, learning rate, betas, dropout and seed, and reads its JSON. Reported side by
side: ``recipe`` and ``peer`` (its per-epoch HR@10, training samples/s), ``train_speedup_vs_peer`` (recipe median
over epochs / peer's samples/s without its first epoch) and ``hr_vs_peer_per_epoch`` (recipe minus peer HR@10 at
each epoch).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import nullcontext
from typing import Dict, List, Optional

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from neumf import MODEL_NAMES, build_model
from neumf.data import convert
from neumf.data import NCFData, EvalSet, TrainEpochs, duplicate_mask, load_dataset
from neumf.evaluation import evaluate
from neumf.train import autocast_for, compiled_batch_loss, keep_freed_memory, make_optimizer, train_epoch
from recsys_common.cli import run_main
from recsys_common.io import check_json_output, write_json_output
from recsys_common.machine import cpu_bf16_instructions, cpu_model_name as _cpu_model

SHAPES = {  # users, items, training positives (NVIDIA's ML-20m numbers; ML-1m / ML-100k leave-one-out)
    "ml-20m": (138_493, 26_744, 19_861_770),
    "ml-1m": (6_040, 3_706, 994_169),
    "ml-100k": (943, 1_682, 99_057),
    "tiny": (500, 1_000, 15_000),
}


PLAIN_PEER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "neumf_plain_peer.py")

def synthetic_data(shape: str, samples_per_series: int = 101, seed: int = 0) -> NCFData:
    users, items, positives = SHAPES[shape]
    rng = np.random.default_rng(seed)
    test_users = np.repeat(np.arange(users), samples_per_series)
    test_items = rng.integers(0, items, size=users * samples_per_series)
    labels = np.zeros(users * samples_per_series, dtype=np.float32)
    labels[::samples_per_series] = 1
    return NCFData(rng.integers(0, users, positives), rng.integers(0, items, positives), test_users, test_items,
                   labels, users, items, samples_per_series)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_recipe(args, data: NCFData, device: torch.device) -> Dict:
    torch.manual_seed(args.seed)
    model = build_model(args.model, data.num_users, data.num_items, args.factors, args.layers, args.dropout).to(device)
    run_args = argparse.Namespace(amp=args.amp, amp_dtype="auto", beta1=args.beta1, beta2=args.beta2, eps=1e-8,
                                  learning_rate=args.learning_rate, apex_fused_adam=False, optimizer="adam")
    autocast, scaler = autocast_for(run_args, device)
    optimizer = make_optimizer(run_args, model)
    train = TrainEpochs(data.train_users, data.train_items, data.num_items, args.negative_samples,
                        args.batch_size, 0, 1, device, exclude_positives=args.exclude_positives)
    test = EvalSet(data, 0, 1, device)
    batch_loss = compiled_batch_loss(model, autocast) if args.compile else None
    return _loop(args, device, lambda epoch: train_epoch(model, optimizer, scaler, autocast,
                                                               train.epoch(args.seed, epoch), 1, 1,
                                                               batch_loss=batch_loss),
                 lambda: evaluate(model, test, args.topk, args.valid_batch_size, autocast),
                 train.rows_per_epoch)


def run_naive(args, data: NCFData, device: torch.device) -> Dict:
    torch.manual_seed(args.seed)
    model = build_model(args.model, data.num_users, data.num_items, args.factors, args.layers, args.dropout).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.learning_rate, betas=(args.beta1, args.beta2),
                                 foreach=False)
    loss_fn = nn.BCEWithLogitsLoss()
    rng = np.random.default_rng(args.seed)
    rows = len(data.train_users) * (1 + args.negative_samples)
    samples = data.samples_per_series
    test_loader = DataLoader(TensorDataset(torch.as_tensor(data.test_users), torch.as_tensor(data.test_items)),
                             batch_size=args.valid_batch_size, shuffle=False)
    candidates = torch.as_tensor(data.test_items.reshape(-1, samples))
    mask = duplicate_mask(candidates)

    def train_one(epoch):
        model.train()
        neg_users = np.repeat(data.train_users, args.negative_samples)
        neg_items = rng.integers(0, data.num_items, size=len(neg_users))
        users = torch.as_tensor(np.concatenate([data.train_users, neg_users]))
        items = torch.as_tensor(np.concatenate([data.train_items, neg_items]))
        labels = torch.cat([torch.ones(len(data.train_users)), torch.zeros(len(neg_users))])
        loader = DataLoader(TensorDataset(users, items, labels), batch_size=args.batch_size, shuffle=True)
        for u, i, y in loader:
            u, i, y = u.to(device), i.to(device), y.to(device)
            loss = loss_fn(model(u, i), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()

    def evaluate():
        model.eval()
        with torch.no_grad():
            scores = torch.cat([model(u.to(device), i.to(device)).float().cpu() for u, i in test_loader])
        scores = scores.view(-1, samples).masked_fill(mask, float("-inf"))
        rank = (scores[:, 1:] >= scores[:, :1]).sum(1)
        hits = rank < args.topk
        return {"hr": hits.float().mean().item(),
                "ndcg": torch.where(hits, 1 / torch.log2(rank.double() + 2), torch.zeros(())).mean().item(),
                "eval_rows": scores.numel()}

    return _loop(args, device, train_one, evaluate, rows)


def _loop(args, device, train_one, evaluate, rows_per_epoch) -> Dict:
    usage0 = resource.getrusage(resource.RUSAGE_SELF)
    train_tp, eval_tp, hrs, elapsed, ttt = [], [], [], 0.0, None
    train_s, eval_s, eval_rows = [], [], 0
    for epoch in range(args.epochs):
        _sync(device); t0 = time.perf_counter()
        train_one(epoch)
        _sync(device); t1 = time.perf_counter()
        metrics = evaluate()
        _sync(device); t2 = time.perf_counter()
        elapsed += t2 - t0
        train_s.append(t1 - t0)
        eval_s.append(t2 - t1)
        eval_rows = metrics["eval_rows"]
        train_tp.append(rows_per_epoch / (t1 - t0))
        eval_tp.append(metrics["eval_rows"] / (t2 - t1))
        hrs.append(round(metrics["hr"], 5))
        if ttt is None and metrics["hr"] >= args.threshold:
            ttt = elapsed
    usage1 = resource.getrusage(resource.RUSAGE_SELF)
    user_s, system_s = usage1.ru_utime - usage0.ru_utime, usage1.ru_stime - usage0.ru_stime
    return {"train_samples_per_s": statistics.median(train_tp), "eval_samples_per_s": statistics.median(eval_tp),
            "user_cpu_s": user_s, "system_cpu_s": system_s, "system_over_user": system_s / max(user_s, 1e-9),
            "minor_page_faults": usage1.ru_minflt - usage0.ru_minflt,
            "train_samples_per_s_per_epoch": [round(x, 1) for x in train_tp],
            f"hr@{args.topk}_per_epoch": hrs, "time_to_target_s": ttt, "total_time_s": elapsed,
            "train_rows_per_epoch": int(rows_per_epoch), "eval_rows_per_epoch": int(eval_rows),
            "train_seconds_per_epoch": train_s, "eval_seconds_per_epoch": eval_s}


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="NCF speed benchmark (JSON)")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--data", help="converted dataset directory")
    src.add_argument("--shape", choices=sorted(SHAPES), default="ml-100k", help="synthetic data of this shape")
    src.add_argument("--paper_ml1m", metavar="DATA_DIR",
                     help="the NCF paper's ML-1M split rebuilt from DATA_DIR (RECSYS_DATA_DIR layout), users 0..2997")
    p.add_argument("--peer", metavar="SCRIPT", nargs="?", const=PLAIN_PEER,
                   help="also run this peer script on --paper_ml1m's split (no value: benchmarks/neumf_plain_peer.py, "
                        "the plain PyTorch NeuMF written here)")
    p.add_argument("--peer_time_limit", type=float, default=3600.0, help="the peer's --time-limit (seconds)")
    p.add_argument("--model", choices=MODEL_NAMES, default="neumf")
    p.add_argument("-e", "--epochs", type=int, default=2)
    p.add_argument("-b", "--batch_size", type=int, default=8192)
    p.add_argument("--valid_batch_size", type=int, default=2 ** 20)
    p.add_argument("-f", "--factors", type=int, default=64)
    p.add_argument("--layers", nargs="+", type=int, default=[256, 256, 128, 64])
    p.add_argument("-n", "--negative_samples", type=int, default=4)
    p.add_argument("-l", "--learning_rate", type=float, default=0.0045)
    p.add_argument("-b1", "--beta1", type=float, default=0.25)
    p.add_argument("-b2", "--beta2", type=float, default=0.5)
    p.add_argument("--dropout", type=float, default=0.5)
    p.add_argument("-k", "--topk", type=int, default=10)
    p.add_argument("-t", "--threshold", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--amp", action="store_true", help="recipe only: fp16 (CUDA) / bf16 (CPU) autocast")
    p.add_argument("--compile", action="store_true", help="recipe only: torch.compile the training step "
                                                          "(ncf.py --compile)")
    p.add_argument("--exclude_positives", action="store_true",
                   help="recipe only: negatives exclude the user's training positives (ncf.py --exclude_positives; "
                        "the peer always samples this way)")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    p.add_argument("--no_naive", action="store_true", help="skip the naive implementation")
    p.add_argument("--output_json", "--output", dest="output",
                   help="also write the JSON here (atomically; an existing file is replaced only if it is JSON)")
    args = p.parse_args(argv)
    if args.peer and not args.paper_ml1m:
        p.error("--peer needs --paper_ml1m (the peer trains on the NCF paper's ML-1M split)")
    if args.peer and not os.path.isfile(args.peer):
        p.error(f"--peer {args.peer}: file not found")
    return args


def paper_ml1m_data(data_dir: str, workdir: str) -> NCFData:
    """The NCF paper's ML-1M split for users 0..2997, converted from ``data_dir`` into ``workdir``, loaded."""
    split = convert.convert_paper_split(os.path.join(data_dir, "ncf-ml-1m", "ml-1m"),
                                        os.path.join(data_dir, "movielens", "ml-1m", "ratings.users-1-2999.dat.gz"),
                                        max_user=2997)
    out = os.path.join(workdir, "ml-1m-paper")
    convert.write_split(split, out)
    return load_dataset(out)


def run_peer(args) -> Dict:
    """Run the peer script as a child on ``--paper_ml1m`` with this run's settings; its final JSON line."""
    command = [sys.executable, args.peer, "--data", args.paper_ml1m, "--epochs", str(args.epochs),
               "--time-limit", str(args.peer_time_limit), "--batch", str(args.batch_size),
               "--neg", str(args.negative_samples), "--lr", str(args.learning_rate), "--beta1", str(args.beta1),
               "--beta2", str(args.beta2), "--dropout", str(args.dropout), "--seed", str(args.seed)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"peer {args.peer} failed ({done.returncode}): {done.stderr[-2000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result["command"] = command
    return result


def compare_with_peer(recipe: Dict, peer: Dict, topk: int) -> Dict:
    """Side-by-side numbers: speed ratio and per-epoch HR@K difference (recipe - peer)."""
    ours = recipe[f"hr@{topk}_per_epoch"]
    theirs = [e["hr10"] for e in peer["per_epoch"]]
    diff = [round(a - b, 4) for a, b in zip(ours, theirs)]
    return {"train_speedup_vs_peer": recipe["train_samples_per_s"] / peer["train_samples_per_s_excl_epoch1"],
            "peer_train_samples_per_s": peer["train_samples_per_s_excl_epoch1"],
            "recipe_train_samples_per_s": recipe["train_samples_per_s"],
            "hr_vs_peer_per_epoch": diff, "hr_at_least_peer_every_epoch": all(d >= 0 for d in diff)}


def main(argv: Optional[List[str]] = None) -> Dict:
    args = parse_args(argv)
    check_json_output(args.output)  # before minutes of benchmarking, not after
    device = torch.device("cuda" if args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
                          else "cpu")
    keep_freed_memory()  # as ncf.py's entry point does
    workdir = tempfile.TemporaryDirectory(prefix="ncf-bench-")
    if args.paper_ml1m:
        data = paper_ml1m_data(args.paper_ml1m, workdir.name)
    else:
        data = load_dataset(args.data) if args.data else synthetic_data(args.shape, seed=args.seed)
    result = {"config": {k: v for k, v in vars(args).items() if k not in ("output",)},
              "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
              "cpu_model": _cpu_model(), "loadavg_before": os.getloadavg(),
              "cpu_bf16_instructions": cpu_bf16_instructions(),
              "threads": torch.get_num_threads(), "torch": torch.__version__,
              "users": data.num_users, "items": data.num_items, "train_positives": int(len(data.train_users)),
              "recipe": run_recipe(args, data, device)}
    if not args.no_naive:
        result["naive"] = run_naive(args, data, device)
        result["train_speedup"] = result["recipe"]["train_samples_per_s"] / result["naive"]["train_samples_per_s"]
        result["eval_speedup"] = result["recipe"]["eval_samples_per_s"] / result["naive"]["eval_samples_per_s"]
    if args.peer:
        result["peer"] = run_peer(args)
        result.update(compare_with_peer(result["recipe"], result["peer"], args.topk))
    workdir.cleanup()
    result["loadavg_after"] = os.getloadavg()  # other processes' load skews both sides: compare the ratio
    text = json.dumps(result, indent=1)
    print(text)
    if args.output:
        write_json_output(args.output, result)
    return result


if __name__ == "__main__":
    run_main(main, prog="benchmarks/training.py", input_errors=(FileExistsError,))   # an --output that is not a result file
