"""Training-step speed of float32 against bfloat16 autocast on this CPU, interleaved in one process; prints JSON.

    MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=1000000000000 python benchmarks/precision.py --threads 2

The default shape is Kaggle Criteo's as the issue measured it: batch 2048, 26 tables of 100,000 rows, dim 16,
MLPs 512-256-64-16 / 512-256-1. Both models are built by the training code (``build_trainable_model``) and step as
``dlrm.train`` does (``zero_grad`` / autocast forward / ``backward`` / ``step``). Steps of the two precisions
alternate (fp32, bf16, then bf16, fp32, ...), so a load change on a shared machine hits both alike; the medians and
the median of the per-pair time ratios are reported, with the CPU's model name, its bfloat16 flags and the load average.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from typing import Dict, Optional, Sequence

import torch

from dlrm.model.parallel import ModelConfig, build_trainable_model, resolve_embedding_type
from dlrm.utils.amp import Amp
from dlrm.utils.distributed import setup, teardown
from recsys_common.cli import run_main
from recsys_common.machine import cpu_bf16_instructions, cpu_model_name


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python benchmarks/precision.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--embedding_types", default="multi_table,torchrec_fused")
    p.add_argument("--batch_size", type=int, default=2048)
    p.add_argument("--table_sizes", default=",".join(["100000"] * 26))
    p.add_argument("--embedding_dim", type=int, default=16)
    p.add_argument("--bottom_mlp_sizes", default="512,256,64,16")
    p.add_argument("--top_mlp_sizes", default="512,256,1")
    p.add_argument("--steps", type=int, default=16, help="timed steps per precision")
    p.add_argument("--warmup_steps", type=int, default=3)
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    return p


def cpu_description() -> Dict[str, object]:
    """The CPU's model name and which bf16 instructions its bf16 GEMMs run on (``recsys_common.machine``)."""
    return {"model": cpu_model_name(), "bf16_instructions": cpu_bf16_instructions()}


def main(argv: Optional[Sequence[str]] = None) -> Dict:
    args = build_parser().parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    sizes = [int(n) for n in args.table_sizes.split(",")]
    config = ModelConfig(13, sizes, [f"cat_{i}" for i in range(len(sizes))], args.embedding_dim,
                         [int(n) for n in args.bottom_mlp_sizes.split(",")],
                         [int(n) for n in args.top_mlp_sizes.split(",")])
    batch = args.batch_size
    generator = torch.Generator().manual_seed(0)
    batches = [(torch.randn(batch, 13, generator=generator),
                torch.stack([torch.randint(0, n, (batch,), generator=generator) for n in sizes], 1),
                torch.randint(0, 2, (batch,), generator=generator).float()) for _ in range(4)]
    loss_fn = torch.nn.BCEWithLogitsLoss()
    ctx = setup("cpu", need_group=True)
    out: Dict[str, object] = {"cpu": cpu_description(), "threads": torch.get_num_threads(),
                              "load_average_1min_start": os.getloadavg()[0], "batch_size": batch,
                              "config": {k: v for k, v in vars(args).items()}}
    try:
        for requested in [t for t in args.embedding_types.split(",") if t]:
            embedding_type = resolve_embedding_type(requested, ctx.device, False)
            models = {p: build_trainable_model(config, embedding_type, ctx.device, 1, lr=0.1, local_batch_size=batch)
                      for p in ("float32", "bfloat16")}
            amps = {"float32": Amp(False, ctx.device, None, 1.0), "bfloat16": Amp(True, ctx.device, "bfloat16", 1.0)}
            times: Dict[str, list] = {"float32": [], "bfloat16": []}
            for i in range(args.warmup_steps + args.steps):
                for precision in (("float32", "bfloat16") if i % 2 == 0 else ("bfloat16", "float32")):
                    trainable, amp = models[precision], amps[precision]
                    numerical, categorical, label = batches[i % len(batches)]
                    begin = time.perf_counter()
                    trainable.zero_grad(amp.scaler)
                    with amp.autocast():
                        logits = trainable.module(numerical, categorical)
                    loss_fn(logits.float(), label).backward()
                    trainable.step(amp.scaler)
                    if i >= args.warmup_steps:
                        times[precision].append(time.perf_counter() - begin)
            median = {p: statistics.median(v) for p, v in times.items()}
            out[embedding_type] = {
                "float32_samples_per_s": batch / median["float32"],
                "bfloat16_samples_per_s": batch / median["bfloat16"],
                "speedup_bfloat16": median["float32"] / median["bfloat16"],
                "median_pair_speedup_bfloat16": statistics.median(a / b for a, b in zip(times["float32"],
                                                                                         times["bfloat16"])),
                "step_times_s": times,
            }
            del models
    finally:
        teardown(ctx)
    out["load_average_1min_end"] = os.getloadavg()[0]
    print(json.dumps({k: ({kk: vv for kk, vv in v.items() if kk != "step_times_s"} if isinstance(v, dict) else v)
                      for k, v in out.items()}, indent=2))
    return out


if __name__ == "__main__":
    run_main(main, input_errors=(FileExistsError,))   # --output_json names a file that is not a result
