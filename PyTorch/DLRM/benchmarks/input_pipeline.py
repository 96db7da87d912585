"""Training from split-binary files on disk against ``--synthetic_dataset`` at the same shape, printed as JSON.

    python benchmarks/input_pipeline.py                        # CPU, Kaggle shape: batch 2048, 26 x 100000, dim 16
    python benchmarks/input_pipeline.py --base_device cuda --batch_size 32768 --embedding_dim 128 \\
        --bottom_mlp_sizes 512,256,128 --top_mlp_sizes 1024,1024,512,256,1   # the seed's GPU configuration

Writes a Criteo-shaped split-binary dataset (13 numericals, the given tables; ``recsys_common.synthetic``) with
exactly ``batch_size * (warmup_steps + steps)`` training rows into ``--work_dir`` (default: a temporary directory,
removed), then runs ``python -m dlrm.scripts.main --mode train`` back to back ``--repeats`` times per variant:

* ``synthetic``: ``--synthetic_dataset`` (a pool of batches already on the device: no input cost at all);
* ``files``: ``--dataset`` with ``--prefetch_batches P`` (reading in a background thread);
* ``files_no_prefetch``: ``--dataset --prefetch_batches 0`` (reading on the training thread), unless
  ``--skip_no_prefetch``.

It reports each run's training samples/s (the recipe's own ``train_throughput``: steps after the warmup), the
medians, and the medians of the per-repeat ratios to ``synthetic`` (runs of one repeat are adjacent in time, so they
see about the same machine load). The files are read through the page cache after the first run (the dataset is
small); what is measured is the per-batch work of the reader, not the disk. Processes run with the allocator
settings of ``benchmarks/throughput.py``. The ids in the files are uniform per table, as the synthetic batches' are.

Whole runs on a shared machine vary by more than the input costs, so the JSON also gives the reader's own cost on
the calling thread (``read_ms_per_batch``, measured in this process between the runs of each round) and its size
relative to a synthetic step: the work that prefetching moves off the training thread.

``--mode interleaved`` (part of the default ``both``) measures the same in one process and one model, as
``benchmarks/precision.py`` does for precisions: training steps taking their batch from the synthetic pool,
from the files with prefetching, and from the files without, in rotating order, each timed from fetching the batch to
the end of the optimizer step; it reports the medians and the median of the per-round ratios, which a load change on
a shared machine hits alike. (The prefetch thread then also reads during the other variants' steps; at well under a
millisecond per batch against steps of tens of milliseconds, one step of its own is already ample.)
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional, Sequence

import numpy as np
import torch

from dlrm.data import SplitBinaryBatches, SyntheticBatches, dataset_info
from dlrm.model.parallel import ModelConfig, build_trainable_model, resolve_embedding_type
from dlrm.utils.amp import Amp, cpu_runs_bfloat16_natively
from dlrm.utils.distributed import setup, teardown
from recsys_common.cli import InputError, run_main
from recsys_common.feature_spec import FeatureSpec
from recsys_common.io import check_json_output, report_json
from recsys_common.logger import read_log
from recsys_common.synthetic import generate_dataset


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python benchmarks/input_pipeline.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base_device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--embedding_type", default="auto", choices=["auto", "torchrec_fused", "multi_table"])
    p.add_argument("--batch_size", type=int, default=2048)
    p.add_argument("--table_sizes", default=",".join(["100000"] * 26), help="categorical cardinalities")
    p.add_argument("--embedding_dim", type=int, default=16)
    p.add_argument("--bottom_mlp_sizes", default="512,256,64,16")
    p.add_argument("--top_mlp_sizes", default="512,256,1")
    p.add_argument("--steps", type=int, default=60, help="timed training steps per run")
    p.add_argument("--warmup_steps", type=int, default=10, help="training steps excluded from the timing")
    p.add_argument("--repeats", type=int, default=3, help="rounds of back-to-back runs (medians reported)")
    p.add_argument("--prefetch_batches", type=int, default=2, help="--prefetch_batches of the 'files' runs")
    p.add_argument("--skip_no_prefetch", action="store_true", help="leave out the --prefetch_batches 0 runs")
    p.add_argument("--precision", default="default", choices=["default", "fp32", "amp"],
                   help="default: the recipe's (--fp16: bf16 on CPUs with bfloat16 instructions); fp32: --nofp16; "
                        "amp: --amp")
    p.add_argument("--mode", default="both", choices=["both", "processes", "interleaved"],
                   help="processes: whole dlrm.scripts.main runs; interleaved: steps of one model in this process")
    p.add_argument("--interleaved_steps", type=int, default=60, help="timed steps per variant in interleaved mode")
    p.add_argument("--work_dir", default=None,
                   help="where to write the dataset (default: a temporary directory, removed); an existing dataset "
                        "written by this tool there is replaced")
    p.add_argument("--output_json", default=None, help="also write the JSON here (atomically)")
    return p


def _main_command(args, log: str, data_flags: List[str]) -> List[str]:
    total = args.steps + args.warmup_steps
    cmd = [sys.executable, "-m", "dlrm.scripts.main", "--mode", "train", *data_flags,
           "--embedding_type", args.embedding_type, "--base_device", args.base_device,
           "--batch_size", str(args.batch_size), "--test_batch_size", str(args.batch_size),
           "--embedding_dim", str(args.embedding_dim), "--bottom_mlp_sizes", args.bottom_mlp_sizes,
           "--top_mlp_sizes", args.top_mlp_sizes, "--log_path", log, "--print_freq", "0",
           "--lr", "0.1", "--warmup_steps", "0", "--decay_steps", "0",
           "--max_steps", str(total), "--benchmark_warmup_steps", str(args.warmup_steps)]
    cmd += {"default": [], "fp32": ["--nofp16"], "amp": ["--amp"]}[args.precision]
    return cmd


def _run(args, data_flags: List[str]) -> float:
    """One training process; returns its training samples/s."""
    with tempfile.TemporaryDirectory(prefix="dlrm_bench_input_") as tmp:
        log = os.path.join(tmp, "log.json")
        cmd = _main_command(args, log, data_flags)
        env = dict(os.environ, MALLOC_MMAP_MAX_="0", MALLOC_TRIM_THRESHOLD_="1000000000000")
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
        summary = [r for r in read_log(log) if r["step"] == []][-1]["data"]
    return float(summary["train_throughput"])


def write_dataset(directory: str, table_sizes: List[int], train_rows: int, test_rows: int, seed: int = 0) -> str:
    """A Criteo-shaped split-binary dataset (13 numericals, ``table_sizes``) in ``directory``; returns it.

    The categorical ids are then redrawn uniformly in each table, as ``--synthetic_dataset`` draws them: the
    generator's power-law ids touch far fewer embedding rows per batch, which makes the embedding work (not the
    input) cheaper and the comparison unfair to the synthetic runs.
    """
    spec = FeatureSpec.get_default_feature_spec(13, table_sizes)
    out = generate_dataset(spec, directory, {"train": train_rows, "test": test_rows}, seed=seed, overwrite=True,
                           tool="benchmarks/input_pipeline.py")
    rng = np.random.default_rng(seed)
    for mapping in ("train", "test"):
        for chunk in out.source_spec[mapping]:
            if not set(chunk["features"]) & set(out.channel_spec["categorical"]):
                continue
            (name,) = chunk["features"]
            ids = np.memmap(out.resolve_file(chunk["files"][0]), dtype=out.numpy_dtype(name), mode="r+")
            ids[:] = rng.integers(0, out.cardinality(name), len(ids))
            ids.flush()
            del ids
    return directory


def reader_cost(dataset: str, batch_size: int, repeats: int = 3) -> Dict[str, float]:
    """Milliseconds per batch that reading costs on the calling thread (``prefetch_batches 0``: slicing, checks,
    conversion), the median of ``repeats`` passes over the train mapping (after one pass warming the page cache)."""
    data = SplitBinaryBatches(dataset_info(dataset), "train", batch_size, torch.device("cpu"), prefetch=0)
    times = []
    for _ in range(repeats + 1):
        started = time.perf_counter()
        for _batch in data:
            pass
        times.append((time.perf_counter() - started) * 1000.0 / len(data))
    return {"read_ms_per_batch_median": statistics.median(times[1:]), "read_ms_per_batch_all": times[1:]}


def interleaved(args, dataset: str, table_sizes: List[int], variants: List[str]) -> Dict:
    """Steps of one model alternating between the batch sources ``variants``; see the module docstring."""
    ctx = setup(args.base_device, need_group=True)
    try:
        device, batch = ctx.device, args.batch_size
        info = dataset_info(dataset)
        config = ModelConfig(13, table_sizes, list(info.categorical_features), args.embedding_dim,
                             [int(n) for n in args.bottom_mlp_sizes.split(",")],
                             [int(n) for n in args.top_mlp_sizes.split(",")])
        trainable = build_trainable_model(config, resolve_embedding_type(args.embedding_type, device, False), device,
                                          1, lr=0.1, local_batch_size=batch)
        amp_on = args.precision == "amp" or (args.precision == "default" and
                                             (device.type == "cuda" or cpu_runs_bfloat16_natively()))
        amp = Amp(amp_on, device, None, 8192.0)
        total = args.warmup_steps + args.interleaved_steps
        synthetic = SyntheticBatches(info, batch * total, batch, device, seed=0)
        sources = {"synthetic": iter(synthetic)}
        for name in variants[1:]:
            prefetch = 0 if name == "files_no_prefetch" else args.prefetch_batches
            sources[name] = iter(SplitBinaryBatches(info, "train", batch, device, prefetch=prefetch))
        loss_fn = torch.nn.BCEWithLogitsLoss()
        times: Dict[str, List[float]] = {name: [] for name in sources}
        for i in range(total):
            names = list(sources)
            names = names[i % len(names):] + names[: i % len(names)]   # rotate: no variant always runs first
            for name in names:
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                begin = time.perf_counter()
                numerical, categorical, label, _ = next(sources[name])
                trainable.zero_grad(amp.scaler)
                with amp.autocast():
                    logits = trainable.module(numerical, categorical)
                loss = loss_fn(logits.float(), label)
                (amp.scaler.scale(loss) if amp.scaler is not None else loss).backward()
                trainable.step(amp.scaler)
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                if i >= args.warmup_steps:
                    times[name].append(time.perf_counter() - begin)
        for source in sources.values():
            close = getattr(source, "close", None)
            if close is not None:
                close()   # stops the prefetch threads
        result = {"precision": amp.dtype_name, "timed_steps_per_variant": args.interleaved_steps,
                  "train_samples_per_s_median": {n: batch / statistics.median(t) for n, t in times.items()},
                  "step_time_ratio_to_synthetic_median": {
                      n: statistics.median(a / b for a, b in zip(t, times["synthetic"]))
                      for n, t in times.items() if n != "synthetic"}}
        # samples/s ratio (files / synthetic): the inverse of the step-time ratio
        result["ratio_to_synthetic_median"] = {n: 1.0 / r for n, r in
                                               result["step_time_ratio_to_synthetic_median"].items()}
        return result
    finally:
        teardown(ctx)


def main(argv: Optional[Sequence[str]] = None) -> Dict:
    args = build_parser().parse_args(argv)
    check_json_output(args.output_json)
    if args.steps < 1 or args.warmup_steps < 1 or args.repeats < 1:
        raise InputError("--steps, --warmup_steps and --repeats must be >= 1")
    table_sizes = [int(x) for x in args.table_sizes.split(",") if x]
    work = args.work_dir or tempfile.mkdtemp(prefix="dlrm_bench_input_")
    dataset = os.path.join(work, "dataset")
    try:
        rows = args.batch_size * (args.warmup_steps + max(args.steps, args.interleaved_steps))
        write_dataset(dataset, table_sizes, rows, args.batch_size)
        reading = reader_cost(dataset, args.batch_size)
        variants = {"synthetic": ["--synthetic_dataset", "--synthetic_dataset_table_sizes", args.table_sizes,
                                  "--synthetic_dataset_num_entries", str(rows)],
                    "files": ["--dataset", dataset, "--prefetch_batches", str(args.prefetch_batches)]}
        if not args.skip_no_prefetch:
            variants["files_no_prefetch"] = ["--dataset", dataset, "--prefetch_batches", "0"]
        names = list(variants)
        result: Dict = {"config": {k: v for k, v in vars(args).items() if k not in ("output_json", "work_dir")},
                        "reader_on_training_thread": reading}
        if args.mode in ("both", "interleaved"):
            result["interleaved"] = interleaved(args, dataset, table_sizes, names)
            print(json.dumps({"interleaved": result["interleaved"]}), file=sys.stderr, flush=True)
        if args.mode in ("both", "processes"):
            runs: List[Dict] = []
            for repeat in range(args.repeats):
                record = {"repeat": repeat}
                for name, flags in variants.items():   # back to back: one round sees about one machine load
                    record[name] = _run(args, flags)
                record["read_ms_per_batch"] = reader_cost(dataset, args.batch_size,
                                                          repeats=1)["read_ms_per_batch_median"]
                runs.append(record)
                print(json.dumps(record), file=sys.stderr, flush=True)
            result["processes"] = {
                "train_samples_per_s_median": {n: statistics.median(r[n] for r in runs) for n in names},
                "ratio_to_synthetic_median": {n: statistics.median(r[n] / r["synthetic"] for r in runs)
                                              for n in names if n != "synthetic"},
                # what reading would add to a synthetic step if nothing overlapped it: the share prefetching hides
                "read_ms_over_synthetic_step_ms_median": statistics.median(
                    r["read_ms_per_batch"] / (1000.0 * args.batch_size / r["synthetic"]) for r in runs),
                "runs": runs,
            }
    finally:
        if args.work_dir is None:
            shutil.rmtree(work, ignore_errors=True)
    return report_json(result, args.output_json)


if __name__ == "__main__":
    run_main(main, input_errors=(FileExistsError, ValueError))   # --output_json not a result file; a bad flag
