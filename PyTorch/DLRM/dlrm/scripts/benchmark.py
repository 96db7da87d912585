"""Training and inference throughput (samples/s) of DLRM, printed as JSON; TorchRec fused vs plain EmbeddingBag.

    python -m dlrm.scripts.benchmark                          # CPU defaults: batch 4096, 26 x 100000 tables
    python -m dlrm.scripts.benchmark --base_device cuda --batch_size 32768 --fp16     # the seed's GPU configuration

Each measurement is one ``python -m dlrm.scripts.main`` process on synthetic Criteo-shaped data (``--synthetic_dataset``):
``--mode train --max_steps S --benchmark_warmup_steps W`` for training, ``--mode inference_benchmark`` for inference.
The embedding types alternate back to back ``--repeats`` times and the medians are reported with their ratio, which
is what survives the noise of a shared machine. The processes run with ``MALLOC_MMAP_MAX_=0
MALLOC_TRIM_THRESHOLD_=1000000000000`` (glibc otherwise returns and re-faults big gradient buffers every step; see
the README). The seed's published single-V100 figures are printed alongside for reference: 494k samples/s FP32,
875k AMP, batch 32768 on the Criteo Terabyte tables.
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

NVIDIA_V100_SEED = {"fp32_samples_per_s": 494_000, "amp_samples_per_s": 875_000, "batch_size": 32768,
                    "source": "seed README, 1x V100 32GB, Criteo Terabyte tables"}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m dlrm.scripts.benchmark", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
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
    from recsys_common.logger import read_log
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
    from recsys_common.io import check_json_output, write_json_output
    args = build_parser().parse_args(argv)
    check_json_output(args.output_json)   # before minutes of runs, not after
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
    text = json.dumps(result, indent=2)
    print(text)
    if args.output_json:
        write_json_output(args.output_json, result)
    return result


if __name__ == "__main__":
    main()
