"""Training and inference throughput (samples/s) of DLRM, printed as JSON; TorchRec fused vs plain EmbeddingBag.

    python benchmarks/throughput.py                          # CPU defaults: batch 4096, 26 x 100000 tables
    python benchmarks/throughput.py --base_device cuda --batch_size 32768 --fp16     # the seed's GPU configuration

Each measurement is one ``python -m dlrm.scripts.main`` process on synthetic Criteo-shaped data (``--synthetic_dataset``):
``--mode train --max_steps S --benchmark_warmup_steps W`` for training, ``--mode inference_benchmark`` for inference.
The embedding types alternate back to back ``--repeats`` times and the medians are reported with their ratio, which
is what survives the noise of a shared machine. The processes run with ``MALLOC_MMAP_MAX_=0
MALLOC_TRIM_THRESHOLD_=1000000000000`` (glibc otherwise returns and re-faults big gradient buffers every step on
these VMs). The seed's published single-V100 figures are printed alongside for reference: 494k samples/s FP32,
875k AMP, batch 32768 on the Criteo Terabyte tables.

Against TorchRec (the default, ``--compare torchrec_peer``, CPU): our training step against TorchRec's own
``torchrec.models.dlrm.DLRM`` in the same process, on the same pre-generated batches, at the Kaggle shape (dim 16,
MLPs 13-512-256-64-16 / 512-256-1) and the seed's (dim 128, 13-512-256-128 / 1024-1024-512-256-1), 26 tables of
100,000 rows, batch 2048, SGD lr 0.1 for all. The peer runs in its two fast forms: ``FusedEmbeddingBagCollection``
(FBGEMM table-batched bags, SGD inside the backward) and ``DistributedModelParallel`` (one rank, gloo). Each round
times ``--steps`` steps of every variant back to back (after ``--warmup_steps``); per round the ratio is ours over
the faster peer variant, and the JSON reports the median over ``--rounds``. Ours is the recipe's own training step:
``build_trainable_model`` (one-buffer tables with SGD fused into the backward), bf16 autocast where the CPU runs it
natively (``--precision auto``), the dense part compiled with ``torch.compile`` (``--compile``, the default here;
compilation happens in the warmup and is reported as ``ours_first_step_s``): ``dlrm.scripts.main --embedding_type
multi_table --compile``. ``--ours_embedding_type torchrec_fused --no-compile`` measures what ``dlrm.scripts.main``
runs with its defaults instead (``--embedding_type auto`` picks ``torchrec_fused`` where TorchRec is installed). Run it with
``MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=1000000000000`` (it warns otherwise).

    MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=1000000000000 python benchmarks/throughput.py
    python benchmarks/throughput.py --compare embedding_types     # the subprocess comparison above
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from typing import Dict, List, Optional, Sequence

from recsys_common.cli import run_main
from recsys_common.io import check_json_output, report_json
from recsys_common.logger import read_log

NVIDIA_V100_SEED = {"fp32_samples_per_s": 494_000, "amp_samples_per_s": 875_000, "batch_size": 32768,
                    "source": "seed README, 1x V100 32GB, Criteo Terabyte tables"}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python benchmarks/throughput.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--compare", default="torchrec_peer", choices=["torchrec_peer", "embedding_types"],
                   help="torchrec_peer: ours against torchrec.models.dlrm.DLRM in one process (CPU); "
                        "embedding_types: whole dlrm.scripts.main runs per --embedding_types")
    p.add_argument("--shapes", default="kaggle,seed", help="torchrec_peer: shapes to run (kaggle, seed)")
    p.add_argument("--peer_batch_size", type=int, default=2048, help="torchrec_peer: batch of ours and the peer")
    p.add_argument("--peer_table_size", type=int, default=100000, help="torchrec_peer: rows of each of 26 tables")
    p.add_argument("--peer_variants", default="fused,dmp", help="torchrec_peer: TorchRec forms to run (fused, dmp)")
    p.add_argument("--rounds", type=int, default=5, help="torchrec_peer: rounds (each times every variant)")
    p.add_argument("--precision", default="auto", choices=["auto", "float32", "bfloat16"],
                   help="torchrec_peer, ours: auto = bfloat16 autocast where the CPU has bf16 instructions")
    p.add_argument("--compile", default=True, action=argparse.BooleanOptionalAction,
                   help="torchrec_peer, ours: torch.compile the dense part")
    p.add_argument("--threads", type=int, default=None, help="torchrec_peer: torch.set_num_threads")
    p.add_argument("--ours_embedding_type", default="multi_table", choices=["multi_table", "torchrec_fused"],
                   help="torchrec_peer, ours: multi_table (one-buffer tables, SGD fused into the backward: "
                        "dlrm.scripts.main --embedding_type multi_table) or torchrec_fused (what --embedding_type "
                        "auto picks where TorchRec is installed)")
    p.add_argument("--embedding_types", default="torchrec_fused,multi_table")
    p.add_argument("--base_device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--batch_size", type=int, default=4096)
    p.add_argument("--table_sizes", default=",".join(["100000"] * 26), help="synthetic table sizes")
    p.add_argument("--embedding_dim", type=int, default=128)
    p.add_argument("--bottom_mlp_sizes", default="512,256,128")
    p.add_argument("--top_mlp_sizes", default="1024,1024,512,256,1")
    p.add_argument("--steps", type=int, default=30, help="training steps per measurement (after warmup)")
    p.add_argument("--warmup_steps", type=int, default=10, help="training steps excluded from the timing")
    p.add_argument("--inference_steps", type=int, default=30)
    p.add_argument("--repeats", type=int, default=3, help="alternating runs per embedding type (medians reported)")
    p.add_argument("--fp16", action="store_true", help="AMP (bfloat16 on CPU, float16 on CUDA)")
    p.add_argument("--cuda_graphs", action="store_true")
    p.add_argument("--skip_inference", action="store_true")
    p.add_argument("--output_json", default=None,
                   help="also write the JSON here (atomically; an existing JSON result is replaced, any other file is "
                        "refused before the runs start)")
    return p


def _run_main(args, embedding_type: str, mode: str) -> Dict:
    with tempfile.TemporaryDirectory(prefix="dlrm_bench_") as tmp:
        log = os.path.join(tmp, "log.json")
        cmd = [sys.executable, "-m", "dlrm.scripts.main", "--mode", mode, "--synthetic_dataset",
               "--synthetic_dataset_table_sizes", args.table_sizes, "--embedding_type", embedding_type,
               "--base_device", args.base_device, "--batch_size", str(args.batch_size),
               "--embedding_dim", str(args.embedding_dim), "--bottom_mlp_sizes", args.bottom_mlp_sizes,
               "--top_mlp_sizes", args.top_mlp_sizes, "--log_path", log, "--print_freq", "0",
               "--fp16" if args.fp16 else "--nofp16", "--lr", "0.1", "--warmup_steps", "0", "--decay_steps", "0"]
        if args.cuda_graphs:
            cmd.append("--cuda_graphs")
        if mode == "train":
            total = args.steps + args.warmup_steps
            cmd += ["--max_steps", str(total), "--benchmark_warmup_steps", str(args.warmup_steps),
                    "--synthetic_dataset_num_entries", str(args.batch_size * total),
                    "--test_batch_size", str(args.batch_size)]
        else:
            cmd += ["--inference_benchmark_batch_sizes", str(args.batch_size),
                    "--inference_benchmark_steps", str(args.inference_steps)]
        env = dict(os.environ, MALLOC_MMAP_MAX_="0", MALLOC_TRIM_THRESHOLD_="1000000000000")
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr[-4000:]}")
        summary = [r for r in read_log(log) if r["step"] == []][-1]["data"]
    if mode == "train":
        return {"train_samples_per_s": summary["train_throughput"], "train_step_time_s": summary["train_step_time"]}
    inference = summary["inference"][str(args.batch_size)]
    return {"inference_samples_per_s": inference["throughput"], "inference_latency_mean_ms": inference["latency_mean_ms"],
            "inference_latency_p99_ms": inference["latency_p99_ms"]}


def main(argv: Optional[Sequence[str]] = None) -> Dict:
    args = build_parser().parse_args(argv)
    check_json_output(args.output_json)   # before minutes of runs, not after
    if args.compare == "torchrec_peer":
        from torchrec_peer import compare_with_torchrec   # torch and TorchRec, late: --compare embedding_types needs neither
        result = compare_with_torchrec(shapes=[s for s in args.shapes.split(",") if s],
                                       batch_size=args.peer_batch_size, table_size=args.peer_table_size,
                                       peer_variants=[v for v in args.peer_variants.split(",") if v],
                                       rounds=args.rounds, steps=args.steps, warmup_steps=args.warmup_steps,
                                       precision=args.precision, compile_dense=args.compile, threads=args.threads,
                                       ours_embedding_type=args.ours_embedding_type)
        return report_json(result, args.output_json)
    types = [t for t in args.embedding_types.split(",") if t]
    runs: List[Dict] = []
    for repeat in range(args.repeats):
        for embedding_type in types:  # alternate back to back: both see the same machine load
            record = {"repeat": repeat, "embedding_type": embedding_type}
            record.update(_run_main(args, embedding_type, "train"))
            if not args.skip_inference:
                record.update(_run_main(args, embedding_type, "inference_benchmark"))
            runs.append(record)
            print(json.dumps(record), file=sys.stderr, flush=True)
    medians = {}
    for embedding_type in types:
        mine = [r for r in runs if r["embedding_type"] == embedding_type]
        medians[embedding_type] = {k: statistics.median(r[k] for r in mine) for k in mine[0]
                                   if k not in ("repeat", "embedding_type")}
    result = {"config": {k: v for k, v in vars(args).items() if k != "output_json"},
              "median": medians, "runs": runs, "nvidia_v100_seed": NVIDIA_V100_SEED}
    if "torchrec_fused" in medians and "multi_table" in medians:
        ratios = {}
        for key in ("train_samples_per_s", "inference_samples_per_s"):
            pairs = [(a[key], b[key]) for a, b in zip([r for r in runs if r["embedding_type"] == "torchrec_fused"],
                                                       [r for r in runs if r["embedding_type"] == "multi_table"])
                     if key in a]
            if pairs:
                ratios[key] = statistics.median(a / b for a, b in pairs)
        result["ratio_fused_over_multi_table"] = ratios
    return report_json(result, args.output_json)


if __name__ == "__main__":
    run_main(main, input_errors=(FileExistsError,))   # --output_json names a file that is not a result
