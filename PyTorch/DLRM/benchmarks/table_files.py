"""Benchmark: training with embedding tables in files (``--embedding_memory_budget_gb``) against tables in RAM, as JSON.

    python benchmarks/table_files.py --file_gb 23 46 --ram_gb 2 --budget_gb 4 --steps 200 --output table_files.json

Each run is a fresh child process training a DLRM with 26 tables of Criteo 1TB's relative sizes (MLPerf's
cardinalities, capped at 40M) scaled to the given total, with the recipe's model code, on fresh random batches whose
ids follow a power law per table (``recsys_common.synthetic.power_law_ids``, alpha 1.05; hot ids are small ids, as
Criteo preprocessing orders them; a batch is drawn outside the timed part). ``--model small`` (default): dot
interaction, MLPs 64-dim / 64-1, SGD, one id per table; ``--model mlperf``: MLPerf DLRM-DCNv2 (DCN 3 x 512, MLPs
512-256-128 / 1024-1024-512-256-1, Adagrad with its accumulator beside each table, MLPerf's per-table hotness).
Runs: the tables in RAM at ``--ram_gb`` (the reference speed; with ``--reference_each`` again before every file run,
so each ratio is taken back to back), then each ``--file_gb`` with every table over the budget in files. Per run:
samples/s after ``--warmup`` steps, the child's peak RSS (the child is the whole process tree: it starts none), disk
bytes read and written per step (``/proc/self/io``), page faults per step (major: read from disk; minor: found in
the page cache) and the share of faults served from memory (the page cache's hit rate for this process).
``--drop_page_cache`` also evicts the files from the page cache every step (``posix_fadvise(DONTNEED)``): the case
of a machine whose page cache holds none of the tables (a lower bound). The files go to ``--storage`` (a directory
this run creates; each run's files are removed when it ends). The JSON has each run, the file/RAM speed ratios, the
machine's CPU model, load and free disk, and the time one epoch of Criteo 1TB (4.2B rows) would take at each rate.
``--checkpoint_every N`` also saves a checkpoint (``dlrm.checkpointing``) every N timed steps, outside the timing:
the bytes and seconds of each save, and the undo journal's bytes per step (the price of incremental checkpoints of
the tables in files); ``--full_copy_checkpoint`` saves the tables in files into the checkpoint instead (as before
incremental checkpoints), for the comparison.
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

CRITEO_1TB_TRAIN_ROWS = 4_195_197_692   # days 0-22 of Criteo 1TB, the training split of NVIDIA's and MLPerf's recipes


def table_sizes(total_gb: float, dim: int, adagrad: bool = False):
    """MLPerf's 26 cardinalities scaled so the tables (and Adagrad accumulators) take ``total_gb``."""
    from recsys_common.synthetic import MLPERF_CARDINALITIES
    scale = total_gb * 2 ** 30 / (sum(MLPERF_CARDINALITIES) * dim * 4 * (2 if adagrad else 1))
    return [max(1, int(n * scale)) for n in MLPERF_CARDINALITIES]


def _counters():
    with open("/proc/self/io") as f:
        io = dict(line.split(": ") for line in f.read().splitlines())
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return int(io["read_bytes"]), int(io["write_bytes"]), usage.ru_majflt, usage.ru_minflt


def _model(args, sizes):
    """The model config, hotness and whether it trains with Adagrad, for ``--model``."""
    from dlrm.model.parallel import ModelConfig
    from recsys_common.synthetic import MLPERF_HOTNESS
    names = [f"c{i}" for i in range(26)]
    if args.model == "mlperf":
        return ModelConfig(13, sizes, names, args.embedding_dim, [512, 256, args.embedding_dim],
                           [1024, 1024, 512, 256, 1], interaction_op="dcn", hotness=list(MLPERF_HOTNESS)), True
    return ModelConfig(13, sizes, names, args.embedding_dim, [64, args.embedding_dim], [64, 1]), False


def _batch(rng, sizes, hotness, batch):
    """Numerical features, power-law ids (``[batch, sum(hotness)]``) and labels of one random batch."""
    import numpy as np
    import torch
    from recsys_common.synthetic import power_law_ids
    ids = np.concatenate([power_law_ids(rng, n, (batch, h)) for n, h in zip(sizes, hotness)], axis=1)
    return (torch.randn(batch, 13), torch.from_numpy(ids),
            torch.from_numpy((rng.random(batch) < 0.25).astype(np.float32)))


def _drop_page_cache(embeddings):
    for table_file in embeddings.files:
        table_file.flush()
        fd = os.open(table_file.path, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)


def _checkpoint(args, trainable, config, step):
    """A checkpoint as training saves one: ``(bytes this process wrote, seconds, undo journal bytes since the last)``
    (the journal starts anew at each checkpoint)."""
    from dlrm import checkpointing
    journal = _journal_bytes(trainable.core.embeddings)
    if args.full_copy_checkpoint:   # the tables in files go through DCP into the checkpoint, as before
        checkpointing._table_storage = lambda trainable: None
    written, start = _counters()[1], time.perf_counter()
    checkpointing.save_checkpoint(f"{args.storage}.checkpoints", trainable, config.to_dict(), {"global_step": step},
                                  0, 1, keep=1)
    return _counters()[1] - written, time.perf_counter() - start, journal


def _journal_bytes(embeddings):
    """The bytes of the current undo journal (each checkpoint starts a new one)."""
    return embeddings.journal.bytes_written if embeddings.journal is not None else 0


def child(args):
    """One run in this process; prints its JSON record."""
    import numpy as np
    import torch
    from dlrm.model.parallel import build_trainable_model
    torch.set_num_threads(args.threads)
    adagrad = args.model == "mlperf"
    sizes = table_sizes(args.total_gb, args.embedding_dim, adagrad)
    config, adagrad = _model(args, sizes)
    started = time.perf_counter()
    trainable = build_trainable_model(config, "multi_table", torch.device("cpu"), 1, 0.01, local_batch_size=args.batch,
                                      adagrad=adagrad, table_budget_bytes=args.budget_gb * 2 ** 30,
                                      table_storage_dir=args.storage)
    setup_s = time.perf_counter() - started
    embeddings, rng, trained_s, saves = trainable.core.embeddings, np.random.default_rng(0), 0.0, []
    for step in range(args.warmup + args.steps):
        if step == args.warmup:
            before, trained_s, journal_before = _counters(), 0.0, _journal_bytes(embeddings)
        numerical, categorical, label = _batch(rng, sizes, config.hotness, args.batch)
        start = time.perf_counter()
        trainable.zero_grad()
        torch.nn.functional.binary_cross_entropy_with_logits(trainable.module(numerical, categorical),
                                                             label).backward()
        trainable.step()
        trained_s += time.perf_counter() - start
        if args.drop_page_cache:
            _drop_page_cache(embeddings)
        if args.checkpoint_every and step >= args.warmup and (step + 1 - args.warmup) % args.checkpoint_every == 0:
            saves.append(_checkpoint(args, trainable, config, step + 1))
    read, written, major, minor = (b - a for a, b in zip(before, _counters()))
    written -= sum(save[0] for save in saves)
    per_row = args.embedding_dim * 4 * (2 if adagrad else 1)
    in_files = sum(n for n, f in zip(sizes, embeddings.in_files) if f) * per_row
    print(json.dumps({"model": args.model, "total_table_gb": args.total_gb, "in_files_gb": round(in_files / 2 ** 30, 3),
                      "budget_gb": args.budget_gb, "samples_per_s": args.steps * args.batch / trained_s,
                      "setup_s": setup_s, "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20,
                      "disk_read_mb_per_step": read / args.steps / 2 ** 20,
                      "disk_written_mb_per_step": written / args.steps / 2 ** 20,
                      "major_faults_per_step": major / args.steps, "minor_faults_per_step": minor / args.steps,
                      "faults_served_from_memory": minor / max(major + minor, 1),
                      "drop_page_cache": args.drop_page_cache, "load_average_after": os.getloadavg()[0],
                      **_checkpoint_figures(args, saves, journal_before)}))


def _checkpoint_figures(args, saves, journal_before):
    """The checkpoints' figures; the journal's bytes per timed step (those of the warmup steps taken out), for
    incremental checkpoints only (a full copy commits no generation, so its journal never starts anew)."""
    if not saves:
        return {}
    journal = (sum(save[2] for save in saves) - journal_before) / (len(saves) * args.checkpoint_every) / 2 ** 20
    return {"checkpoint_every": args.checkpoint_every, "full_copy_checkpoint": args.full_copy_checkpoint,
            "checkpoint_written_mb": [save[0] / 2 ** 20 for save in saves],
            "checkpoint_s": [save[1] for save in saves],
            "journal_mb_per_step": None if args.full_copy_checkpoint else journal}


def run(args, total_gb, budget_gb, storage):
    command = [sys.executable, os.path.abspath(__file__), "--child", "--total_gb", str(total_gb), "--budget_gb",
               str(budget_gb), "--storage", storage, "--steps", str(args.steps), "--warmup", str(args.warmup),
               "--batch", str(args.batch), "--embedding_dim", str(args.embedding_dim), "--threads",
               str(args.threads), "--model", args.model] + (["--drop_page_cache"] if args.drop_page_cache else []) + \
        (["--checkpoint_every", str(args.checkpoint_every)] if args.checkpoint_every else []) + \
        (["--full_copy_checkpoint"] if args.full_copy_checkpoint else [])
    print(f"[table_files] {args.model}: {total_gb} GB of tables, budget {budget_gb} GB", flush=True)
    try:
        proc = subprocess.run(command, capture_output=True, text=True, cwd=RECIPE)
    finally:
        shutil.rmtree(storage, ignore_errors=True)   # this run's table files: the next run needs the disk
        shutil.rmtree(f"{storage}.checkpoints", ignore_errors=True)
    if proc.returncode:
        raise SystemExit(f"run failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    record = json.loads(proc.stdout.strip().splitlines()[-1])
    record["epoch_of_criteo_1tb_hours"] = CRITEO_1TB_TRAIN_ROWS / record["samples_per_s"] / 3600
    print(f"[table_files]   {record['samples_per_s']:.0f} samples/s, peak RSS {record['peak_rss_gb']:.2f} GB",
          flush=True)
    return record


def _parser():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--file_gb", type=float, nargs="+", default=[8.0, 16.0], help="table totals trained from files")
    p.add_argument("--ram_gb", type=float, default=2.0, help="table total of the in-RAM reference run")
    p.add_argument("--budget_gb", type=float, default=1.0,
                   help="--embedding_memory_budget_gb of the file runs (a step's working set, then small tables)")
    p.add_argument("--model", choices=("small", "mlperf"), default="small")
    p.add_argument("--reference_each", action="store_true", help="run the in-RAM reference again before each file run")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--batch", type=int, default=4096)
    p.add_argument("--embedding_dim", type=int, default=128)
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--drop_page_cache", action="store_true")
    p.add_argument("--checkpoint_every", type=int, default=None, help="save a checkpoint every this many timed steps")
    p.add_argument("--full_copy_checkpoint", action="store_true",
                   help="checkpoints copy the tables in files (as before incremental checkpoints), for comparison")
    p.add_argument("--storage", default=None, help="where the table files go (default: a new directory in /tmp)")
    p.add_argument("--output", default=None)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--total_gb", type=float, help=argparse.SUPPRESS)
    return p


def main():
    args = _parser().parse_args()
    if args.child:
        return child(args)
    from recsys_common.machine import cpu_model_name
    root = tempfile.mkdtemp(prefix="table_files_", dir=args.storage)
    free_gb = shutil.disk_usage(root).free / 2 ** 30
    try:
        reference = run(args, args.ram_gb, 1e6, os.path.join(root, "ram"))   # the same code, every table in RAM
        runs = []
        for total in args.file_gb:
            before = run(args, args.ram_gb, 1e6, os.path.join(root, "ram")) if args.reference_each and runs else None
            runs.append(dict(run(args, total, args.budget_gb, os.path.join(root, f"files_{total}")),
                             reference_samples_per_s=(before or reference)["samples_per_s"]))
    finally:
        shutil.rmtree(root, ignore_errors=True)   # the directory this run made
    with open("/proc/meminfo") as f:
        ram_gb = int(f.readline().split()[1]) / 2 ** 20
    report = {"benchmark": "table_files", "cpu": cpu_model_name(), "cores": os.cpu_count(), "ram_gb": ram_gb,
              "disk_free_gb_at_start": free_gb, "load_average": os.getloadavg()[0], "command": " ".join(sys.argv),
              "in_ram": reference, "in_files": runs,
              "speed_ratio_files_to_ram": [r["samples_per_s"] / r["reference_samples_per_s"] for r in runs]}
    print(json.dumps(report, indent=1))
    if args.output:
        with open(args.output, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
