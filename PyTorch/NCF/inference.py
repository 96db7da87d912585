"""Inference latency and throughput of an NCF model over a list of batch sizes.

    python inference.py --load_checkpoint_path /data/checkpoints/model.pth --batch_sizes 1,64,4096,1048576

Without a checkpoint the model is built from the flags (NVIDIA's ML-20m defaults: 138,493 users, 26,744 items),
randomly initialised: speed does not depend on the weights. Prints one JSON object per batch size (and logs
them DLLogger-style to --log_path): mean / p90 / p95 / p99 latency in ms and samples/s.
"""
from __future__ import annotations

import argparse
import json
import time
from typing import Dict, List, Optional

import numpy as np
import torch

from neumf import MODEL_NAMES, build_model
from neumf.checkpointing import CheckpointError, load_model_weights, read_checkpoint
from recsys_common.cli import run_main
from recsys_common.logger import Logger


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Benchmark NCF inference")
    p.add_argument("--load_checkpoint_path", default=None, help="checkpoint written by ncf.py (its config is used)")
    p.add_argument("--model", choices=MODEL_NAMES, default="neumf")
    p.add_argument("--n_users", type=int, default=138493)
    p.add_argument("--n_items", type=int, default=26744)
    p.add_argument("--factors", type=int, default=64)
    p.add_argument("--dropout", type=float, default=0.5)
    p.add_argument("--layers", nargs="+", type=int, default=[256, 256, 128, 64])
    p.add_argument("--batch_sizes", default="1,4,16,64,256,1024,4096,16384,65536,262144,1048576",
                   help="comma-separated batch sizes")
    p.add_argument("--num_batches", type=int, default=200, help="timed batches per batch size")
    p.add_argument("--num_warmup", type=int, default=10, help="untimed batches per batch size")
    p.add_argument("--amp", action="store_true", help="fp16 autocast on CUDA, bf16 on CPU")
    p.add_argument("--fp16", action="store_true", help="NVIDIA's name for --amp")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    p.add_argument("--log_path", default="inference_log.json")
    return p.parse_args(argv)


def main(argv: Optional[List[str]] = None) -> List[Dict]:
    args = parse_args(argv)
    device = torch.device("cuda" if args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
                          else "cpu")
    config = {"model": args.model, "num_users": args.n_users, "num_items": args.n_items, "factors": args.factors,
              "layers": args.layers, "dropout": args.dropout}
    state = None
    if args.load_checkpoint_path:
        state = read_checkpoint(args.load_checkpoint_path)
        config = state.get("config", config)
    model = build_model(config["model"], config["num_users"], config["num_items"], config["factors"],
                        config["layers"], config["dropout"])
    if state is not None:
        load_model_weights(model, state["model"], args.load_checkpoint_path)
    model = model.to(device).eval()
    amp = args.amp or args.fp16
    dtype = torch.float16 if device.type == "cuda" else torch.bfloat16
    logger = Logger(args.log_path)
    logger.log_parameters(dict(vars(args), device=str(device), **{f"config_{k}": v for k, v in config.items()}))
    results = []
    g = torch.Generator(device=device).manual_seed(0)
    for batch_size in [int(b) for b in args.batch_sizes.split(",")]:
        users = torch.randint(0, config["num_users"], (batch_size,), device=device, generator=g)
        items = torch.randint(0, config["num_items"], (batch_size,), device=device, generator=g)
        latencies = []
        with torch.no_grad(), torch.autocast(device.type, dtype=dtype, enabled=amp):
            for i in range(args.num_warmup + args.num_batches):
                if device.type == "cuda":
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
                model(users, items)
                if device.type == "cuda":
                    torch.cuda.synchronize()
                if i >= args.num_warmup:
                    latencies.append(time.perf_counter() - t0)
        lat = np.array(latencies) * 1000.0
        row = {"batch_size": batch_size, "latency_mean_ms": float(lat.mean()),
               "latency_p90_ms": float(np.percentile(lat, 90)), "latency_p95_ms": float(np.percentile(lat, 95)),
               "latency_p99_ms": float(np.percentile(lat, 99)),
               "throughput_samples_per_s": float(batch_size / (lat.mean() / 1000.0))}
        logger.log(step=(batch_size,), data=row)
        print(json.dumps(row))
        results.append(row)
    logger.close()
    return results


if __name__ == "__main__":
    run_main(main, prog="inference.py", input_errors=(CheckpointError,))
