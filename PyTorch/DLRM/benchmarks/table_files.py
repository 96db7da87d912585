"""Benchmark: training with embedding tables in files (``--embedding_memory_budget_gb``) against tables in RAM, as JSON.

    python benchmarks/table_files.py --file_gb 8 16 --ram_gb 2 --budget_gb 1 --steps 200 --output table_files.json

Each run is a fresh child process training a DLRM (26 tables with Criteo 1TB's relative sizes scaled to the given
total, ``--embedding_dim``, SGD, the recipe's model code) on random batches whose ids follow a power law per table
(``recsys_common.synthetic.power_law_ids``, alpha 1.05; hot ids are small ids, as Criteo preprocessing orders them).
Runs: the tables in RAM at ``--ram_gb`` (the reference speed), then at each ``--file_gb`` with every table over the
budget in files. Per run: samples/s after ``--warmup`` steps, the child's peak RSS, disk bytes read and written per
step (``/proc/self/io``), page faults per step (major: read from disk; minor: found in the page cache) and the share of
faults served from memory. ``--drop_page_cache`` also evicts the files from the page cache every step
(``posix_fadvise(DONTNEED)``): the case of a machine whose page cache holds none of the tables (a lower bound).
The files go to ``--storage`` (a directory this run creates and removes). The JSON has each run, the file/RAM speed
ratios and the machine's CPU model and load.
"""
import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
RECIPE = os.path.dirname(HERE)
sys.path.insert(0, RECIPE)

# Criteo 1TB's cardinalities (MLPerf's, capped at 40M): the tables keep these proportions at any total size.
CRITEO_1TB = (40000000, 39060, 17295, 7424, 20265, 3, 7122, 1543, 63, 40000000, 3067956, 405282, 10, 2209, 11938,
              155, 4, 976, 14, 40000000, 40000000, 40000000, 590152, 12973, 108, 36)


def table_sizes(total_gb: float, dim: int):
    scale = total_gb * 2 ** 30 / (sum(CRITEO_1TB) * dim * 4)
    return [max(1, int(n * scale)) for n in CRITEO_1TB]


def _counters():
    with open("/proc/self/io") as f:
        io = dict(line.split(": ") for line in f.read().splitlines())
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return int(io["read_bytes"]), int(io["write_bytes"]), usage.ru_majflt, usage.ru_minflt


def child(args):
    """One run in this process; prints its JSON record."""
    import numpy as np
    import torch
    from dlrm.model.parallel import ModelConfig, build_trainable_model
    from recsys_common.synthetic import power_law_ids
    torch.set_num_threads(args.threads)
    sizes = table_sizes(args.total_gb, args.embedding_dim)
    config = ModelConfig(13, sizes, [f"c{i}" for i in range(26)], args.embedding_dim, [64, args.embedding_dim],
                         [64, 1])
    started = time.perf_counter()
    trainable = build_trainable_model(config, "multi_table", torch.device("cpu"), 1, 0.01, local_batch_size=args.batch,
                                      table_budget_bytes=args.budget_gb * 2 ** 30,
                                      table_storage_dir=args.storage)
    setup_s = time.perf_counter() - started
    embeddings = trainable.core.embeddings
    rng = np.random.default_rng(0)
    batches = [(torch.randn(args.batch, 13),
                torch.from_numpy(np.stack([power_law_ids(rng, n, args.batch) for n in sizes], 1)),
                torch.from_numpy((rng.random(args.batch) < 0.25).astype(np.float32))) for _ in range(16)]
    for step in range(args.warmup + args.steps):
        if step == args.warmup:
            start, before = time.perf_counter(), _counters()
        numerical, categorical, label = batches[step % len(batches)]
        trainable.zero_grad()
        torch.nn.functional.binary_cross_entropy_with_logits(trainable.module(numerical, categorical),
                                                             label).backward()
        trainable.step()
        if args.drop_page_cache:
            for table_file in embeddings.files:
                table_file.flush()
                fd = os.open(table_file.path, os.O_RDONLY)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                os.close(fd)
    elapsed = time.perf_counter() - start
    read, written, major, minor = (b - a for a, b in zip(before, _counters()))
    in_files = sum(n for n, f in zip(sizes, embeddings.in_files) if f) * args.embedding_dim * 4
    print(json.dumps({"total_table_gb": args.total_gb, "in_files_gb": round(in_files / 2 ** 30, 3),
                      "budget_gb": args.budget_gb, "samples_per_s": args.steps * args.batch / elapsed,
                      "setup_s": setup_s, "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20,
                      "disk_read_mb_per_step": read / args.steps / 2 ** 20,
                      "disk_written_mb_per_step": written / args.steps / 2 ** 20,
                      "major_faults_per_step": major / args.steps, "minor_faults_per_step": minor / args.steps,
                      "faults_served_from_memory": minor / max(major + minor, 1),
                      "drop_page_cache": args.drop_page_cache}))


def run(args, total_gb, budget_gb, storage):
    command = [sys.executable, os.path.abspath(__file__), "--child", "--total_gb", str(total_gb), "--budget_gb",
               str(budget_gb), "--storage", storage, "--steps", str(args.steps), "--warmup", str(args.warmup),
               "--batch", str(args.batch), "--embedding_dim", str(args.embedding_dim), "--threads",
               str(args.threads)] + (["--drop_page_cache"] if args.drop_page_cache else [])
    print(f"[table_files] {total_gb} GB of tables, budget {budget_gb} GB", flush=True)
    proc = subprocess.run(command, capture_output=True, text=True, cwd=RECIPE)
    if proc.returncode:
        raise SystemExit(f"run failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--file_gb", type=float, nargs="+", default=[8.0, 16.0], help="table totals trained from files")
    p.add_argument("--ram_gb", type=float, default=2.0, help="table total of the in-RAM reference run")
    p.add_argument("--budget_gb", type=float, default=1.0,
                   help="--embedding_memory_budget_gb of the file runs (a step's working set, then small tables)")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--batch", type=int, default=4096)
    p.add_argument("--embedding_dim", type=int, default=128)
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--drop_page_cache", action="store_true")
    p.add_argument("--storage", default=None, help="where the table files go (default: a new directory in /tmp)")
    p.add_argument("--output", default=None)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--total_gb", type=float, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        return child(args)
    from recsys_common.machine import cpu_model_name
    root = tempfile.mkdtemp(prefix="table_files_", dir=args.storage)
    try:
        reference = run(args, args.ram_gb, 1e6, os.path.join(root, "ram"))   # the same code, every table in RAM
        runs = [run(args, total, args.budget_gb, os.path.join(root, f"files_{total}")) for total in args.file_gb]
    finally:
        shutil.rmtree(root)   # the files this run made
    report = {"benchmark": "table_files", "cpu": cpu_model_name(), "cores": os.cpu_count(),
              "load_average": os.getloadavg()[0], "command": " ".join(sys.argv), "in_ram": reference,
              "in_files": runs,
              "speed_ratio_files_to_ram": [r["samples_per_s"] / reference["samples_per_s"] for r in runs]}
    print(json.dumps(report, indent=1))
    if args.output:
        with open(args.output, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
