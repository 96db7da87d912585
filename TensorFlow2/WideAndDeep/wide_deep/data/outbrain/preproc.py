"""Outbrain ETL: the seven raw CSVs -> parquet ``train/`` and ``valid/`` with the 29 features, ``feature_spec.yaml``
and the fitted NVTabular workflow.

    python -m wide_deep.data.outbrain.preproc --input_dir /outbrain/orig --output_dir /outbrain/data
    python -m wide_deep.data.outbrain.preproc ... --use_dask --dask_workers 2   # a LocalCluster on this machine
    python -m wide_deep.data.outbrain.preproc ... --dask_scheduler tcp://host:8786   # a running Dask cluster

(``scripts/preproc.sh`` wraps this.) What it computes is in :mod:`wide_deep.data.outbrain.nvtabular.workflow`.

Output directory (written to a staging directory and moved into place at the end: on any error nothing is left):

    train/part_<i>.parquet   label ``clicked`` (int32), ``display_id`` (int64), 13 one-hot int32 ids, 3 multi-hot
    valid/part_<i>.parquet   int32 lists (at most 3 ids), 13 float32 numericals; valid sorted by display_id
    feature_spec.yaml        recsys_common FeatureSpec: mappings ``train`` and ``test`` (= valid/), channels
                             ``label``, ``map``, ``onehot_categorical``, ``multihot_categorical``, ``numerical``;
                             categoricals with ``cardinality``, multi-hot with ``max_hotness: 3``
    workflow/                the fitted workflow: ``nvtabular.Workflow.load(path)`` (needs ``wide_deep`` importable)

Model-side interface: read ``feature_spec.yaml`` with ``recsys_common.feature_spec.FeatureSpec.from_yaml``; the
channel lists give the feature order; embedding widths are ``features.EMBEDDING_SIZES`` (``embedding_sizes.json``).

Runs with NVTabular on CPU (``nvtabular``/``merlin.io.Dataset(..., cpu=True)``, pandas) where there is no GPU or
with ``--cpu``, and on GPU (cuDF) otherwise. The joins and the split run in pandas in this process (see the workflow
module); the workflow's fit and transform run on Dask: the local threaded scheduler by default, ``--use_dask`` a
``distributed.LocalCluster`` of ``--dask_workers`` processes on 127.0.0.1 (``LocalCUDACluster`` on GPU), or
``--dask_scheduler`` an existing cluster, whose workers must see ``--output_dir`` at the same path and be able to
import ``wide_deep`` (same code on ``PYTHONPATH``).
"""
from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import tempfile
import time
from typing import Callable, Dict, Iterator, List, Optional, Sequence

import numpy as np

from recsys_common.feature_spec import FeatureSpec
from recsys_common.io import OutputDirectoryError, atomic_directory, check_output_directory

from . import features as F
from .raw import RawInputError, check_raw_files, read_raw_table, RAW_FILES

TOOL = "wide_deep.data.outbrain.preproc"
SPEC_NAME = "feature_spec.yaml"
WORKFLOW_DIR = "workflow"
NUM_STEPS = 8


def skip_unused_frameworks() -> None:
    """Make ``import tensorflow`` / ``import torch`` fail in this process unless they are already imported.

    Merlin imports both, if present, for its dtype tables (about 20 s on 2 cores); the ETL uses neither. Only for
    processes that run nothing but the ETL: the command line and the workers of the ETL's own LocalCluster.
    """
    import warnings
    for name in ("tensorflow", "torch"):
        sys.modules.setdefault(name, None)
    warnings.filterwarnings("ignore", message=r".*dtype mappings did not load successfully")


class Progress:
    """Prints ``[preproc] step i/N <what>: <rows> rows in <s> s (<rows/s> rows/s)`` and keeps the timings."""

    def __init__(self, total: int = NUM_STEPS, out: Callable[[str], None] = print):
        self.total, self.step, self.out, self.timings = total, 0, out, {}

    @contextlib.contextmanager
    def __call__(self, what: str, rows: Optional[int] = None) -> Iterator[dict]:
        self.step += 1
        info = {"rows": rows}
        start = time.perf_counter()
        yield info
        seconds = time.perf_counter() - start
        self.timings[what] = seconds
        rows = info["rows"]
        rate = f": {rows:,} rows in {seconds:.2f} s ({rows / max(seconds, 1e-9):,.0f} rows/s)" if rows else \
            f" in {seconds:.2f} s"
        self.out(f"[preproc] step {self.step}/{self.total} {what}{rate}")


@contextlib.contextmanager
def dask_client(use_dask: bool, dask_workers: int, dask_scheduler: Optional[str], cpu: bool,
                local_directory: str) -> Iterator[object]:
    """A ``distributed.Client`` (closed on exit, its LocalCluster too), or None for the local threaded scheduler."""
    if dask_scheduler:
        from distributed import Client
        client = Client(dask_scheduler)
        try:
            yield client
        finally:
            client.close()
        return
    if not use_dask:
        yield None
        return
    from distributed import Client, LocalCluster
    if cpu:
        cluster = LocalCluster(n_workers=dask_workers, threads_per_worker=1, processes=True, host="127.0.0.1",
                               dashboard_address=None, local_directory=local_directory)
    else:  # one worker per GPU (NVIDIA's multi-GPU preprocessing)
        from dask_cuda import LocalCUDACluster
        cluster = LocalCUDACluster(n_workers=dask_workers, host="127.0.0.1", dashboard_address=None,
                                   local_directory=local_directory)
    try:
        with Client(cluster) as client:
            client.run(skip_unused_frameworks)
            yield client
    finally:
        cluster.close()


def gpu_available() -> bool:
    from merlin.core.compat import cudf
    return cudf is not None


def _write_joined(df, directory: str, parts: int) -> List[str]:
    """Stage-1 output as ``parts`` parquet files (row order kept); the workflow reads one partition per file."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    os.makedirs(directory)
    paths = []
    for i, chunk in enumerate(np.array_split(np.arange(len(df)), max(1, min(parts, len(df))))):
        path = os.path.join(directory, f"part_{i}.parquet")
        pq.write_table(pa.Table.from_pandas(df.iloc[chunk], preserve_index=False), path)
        paths.append(path)
    return paths


def _parquet_files(directory: str) -> List[str]:
    names = [n for n in os.listdir(directory) if n.endswith(".parquet")]
    return sorted(names, key=lambda n: (len(n), n))


def _fix_file_list(written_dir: str, final_dir: str) -> None:
    """NVTabular's ``_file_list.txt`` (read by HugeCTR) names files by absolute path: point it at the final
    directory instead of the staging directory they were written in."""
    path = os.path.join(written_dir, "_file_list.txt")
    if not os.path.exists(path):
        return
    with open(path, "r", encoding="utf-8") as f:
        lines = f.read().splitlines()
    fixed = [os.path.join(final_dir, os.path.basename(line)) if line.endswith(".parquet") else line
             for line in lines]
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(fixed) + "\n")


def build_feature_spec(base_directory: str, train_files: List[str], valid_files: List[str],
                       rows: Dict[str, int]) -> FeatureSpec:
    """The FeatureSpec of the output (file paths relative to ``base_directory``)."""
    feature_spec = {F.LABEL: {"dtype": "int32"}, F.DISPLAY_ID: {"dtype": "int64"}}
    for f in F.FEATURES:
        meta = {"dtype": f.dtype}
        if f.kind != "numerical":
            meta["cardinality"] = int(f.cardinality)
        if f.kind == "multihot":
            meta["max_hotness"] = int(f.max_hotness)
        feature_spec[f.name] = meta
    source_spec = {mapping: [{"type": "parquet", "features": list(F.OUTPUT_COLUMNS), "files": list(files)}]
                   for mapping, files in (("train", train_files), ("test", valid_files))}
    channel_spec = {F.LABEL_CHANNEL: [F.LABEL], F.MAP_CHANNEL: [F.DISPLAY_ID],
                    F.ONEHOT_CHANNEL: list(F.ONEHOT_FEATURES), F.MULTIHOT_CHANNEL: list(F.MULTIHOT_FEATURES),
                    F.NUMERICAL_CHANNEL: list(F.NUMERICAL_FEATURES)}
    metadata = {"dataset": "outbrain", "rows": dict(rows), "workflow": WORKFLOW_DIR,
                "produced_by": f"python -m {TOOL}"}
    spec = FeatureSpec(feature_spec, source_spec, channel_spec, metadata, base_directory=base_directory,
                       origin=os.path.join(base_directory, SPEC_NAME))
    return spec.validate()


def run_etl(input_dir: str, output_dir: str, *, use_dask: bool = False, dask_workers: int = 2,
            dask_scheduler: Optional[str] = None, cpu: Optional[bool] = None, seed: int = 0,
            num_partitions: int = 4, num_train_files: int = 8, num_valid_files: int = 8, overwrite: bool = False,
            out: Callable[[str], None] = print) -> Dict[str, object]:
    """Run the ETL; returns ``{"rows": {"train": n, "test": n}, "seconds": {step: s}, "rows_per_second": r}``.

    ``cpu``: None picks the GPU when cuDF is importable. ``num_partitions``: pieces of the joined data, i.e. Dask
    partitions (keep it fixed to compare runs: outputs are equal for equal partitions, whatever the scheduler).
    Raises ``RawInputError`` (missing file or column, bad value, an empty split), ``OutputDirectoryError``.
    """
    if cpu is None:
        cpu = not gpu_available()
    for flag, value in (("--num_partitions", num_partitions), ("--num_train_files", num_train_files),
                        ("--num_valid_files", num_valid_files), ("--dask_workers", dask_workers)):
        if value < 1:
            raise ValueError(f"{flag} must be at least 1, got {value}")
    progress = Progress(out=out)
    out(f"[preproc] NVTabular on {'CPU (pandas; experimental in NVTabular 23.8)' if cpu else 'GPU (cuDF)'}, "
        f"{'Dask scheduler ' + dask_scheduler if dask_scheduler else f'LocalCluster of {dask_workers} workers' if use_dask else 'one process'}")
    start = time.perf_counter()
    with progress("check raw files"):
        check_raw_files(input_dir)          # missing file/column: fail before any work
        check_output_directory(output_dir, overwrite)
    # Imported after the cheap checks: NVTabular takes seconds to import.
    from merlin.io import Dataset
    from nvtabular import Workflow  # noqa: F401  (the saved workflow is loaded with this class)
    from .nvtabular.workflow import build_workflow, document_tables, join_and_split

    with progress("read raw CSVs") as p:
        tables = {name: read_raw_table(input_dir, name) for name in RAW_FILES}
        p["rows"] = sum(len(t) for t in tables.values())
    with progress("join and split (pandas)") as p:
        train, valid = join_and_split(tables, seed=seed)
        p["rows"] = len(train) + len(valid)
    with atomic_directory(output_dir, overwrite=overwrite, tool=TOOL, marker=SPEC_NAME) as staging:
        scratch = tempfile.mkdtemp(prefix="_scratch", dir=staging)
        try:
            with progress("document lists and TF-IDF matrices (pandas/scipy)") as p:
                doc_ids = np.concatenate([train["document_id"].to_numpy(), valid["document_id"].to_numpy()])
                lists, matrices = document_tables(tables, doc_ids)
                train_paths = _write_joined(train, os.path.join(scratch, "joined_train"), num_partitions)
                valid_paths = _write_joined(valid, os.path.join(scratch, "joined_valid"), num_partitions)
                p["rows"] = len(train) + len(valid)
            rows = {"train": len(train), "test": len(valid)}
            del tables, train, valid
            with dask_client(use_dask, dask_workers, dask_scheduler, cpu, os.path.join(scratch, "dask")) as client:
                workflow = build_workflow(lists, matrices, os.path.join(scratch, "stats"), client=client)
                train_ds = Dataset(train_paths, engine="parquet", cpu=cpu)
                valid_ds = Dataset(valid_paths, engine="parquet", cpu=cpu)
                with progress("fit workflow on train (NVTabular)", rows["train"]):
                    workflow.fit(train_ds)
                # Saving moves the fitted statistics into workflow/, where transform then reads them.
                workflow.save(os.path.join(staging, WORKFLOW_DIR))
                for mapping, ds, subdir, files in (("train", train_ds, "train", num_train_files),
                                                   ("test", valid_ds, "valid", num_valid_files)):
                    with progress(f"transform and write {subdir}/ (NVTabular)", rows[mapping]):
                        workflow.transform(ds).to_parquet(os.path.join(staging, subdir), output_files=files,
                                                          shuffle=None)
                    _fix_file_list(os.path.join(staging, subdir), os.path.join(os.path.abspath(output_dir), subdir))
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        with progress("feature spec"):
            spec = build_feature_spec(staging, [f"train/{n}" for n in _parquet_files(os.path.join(staging, "train"))],
                                      [f"valid/{n}" for n in _parquet_files(os.path.join(staging, "valid"))], rows)
            spec.to_yaml(os.path.join(staging, SPEC_NAME))
    seconds = time.perf_counter() - start
    total_rows = rows["train"] + rows["test"]
    out(f"[preproc] done: {rows['train']:,} train + {rows['test']:,} valid rows in {seconds:.1f} s "
        f"({total_rows / seconds:,.0f} rows/s end to end) -> {os.path.abspath(output_dir)}")
    return {"rows": rows, "seconds": dict(progress.timings, total=seconds),
            "rows_per_second": total_rows / seconds}


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--input_dir", "--data_path", dest="input_dir", default="/outbrain/orig",
                   help="directory of the seven raw Outbrain CSVs")
    p.add_argument("--output_dir", "--metadata_path", dest="output_dir", default="/outbrain/data",
                   help="output directory: train/, valid/, feature_spec.yaml, workflow/")
    p.add_argument("--use_dask", action="store_true",
                   help="run the workflow on a distributed.LocalCluster of --dask_workers processes")
    p.add_argument("--dask_workers", type=int, default=2, help="workers of the --use_dask LocalCluster")
    p.add_argument("--dask_scheduler", default=None,
                   help="address of a running Dask scheduler (tcp://host:8786) to run the workflow on")
    p.add_argument("--cpu", action="store_true", help="use the CPU (pandas) even where a GPU (cuDF) is available")
    p.add_argument("--seed", type=int, default=0, help="seed of the train/valid split draw")
    p.add_argument("--num_partitions", type=int, default=4, help="Dask partitions of the joined data")
    p.add_argument("--num_train_files", type=int, default=8, help="parquet files in train/")
    p.add_argument("--num_valid_files", type=int, default=8, help="parquet files in valid/")
    p.add_argument("--overwrite", action="store_true",
                   help="replace this tool's earlier outputs in a non-empty --output_dir (other files are kept)")
    return p.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    try:
        run_etl(args.input_dir, args.output_dir, use_dask=args.use_dask, dask_workers=args.dask_workers,
                dask_scheduler=args.dask_scheduler, cpu=True if args.cpu else None, seed=args.seed,
                num_partitions=args.num_partitions, num_train_files=args.num_train_files,
                num_valid_files=args.num_valid_files, overwrite=args.overwrite)
    except (RawInputError, OutputDirectoryError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    import warnings
    skip_unused_frameworks()
    # Said once here instead of once per Dataset: NVTabular calls its CPU (pandas) mode experimental.
    warnings.filterwarnings("ignore", message=r".*NVTabular Dataset (in|to) CPU mode")
    sys.exit(main())
