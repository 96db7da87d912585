"""Outbrain ETL: the seven raw CSVs -> parquet ``train/`` and ``valid/`` with the 29 features, ``feature_spec.yaml``
and the fitted statistics (``workflow/``).

    python -m wide_deep.data.outbrain.preproc --input_dir /outbrain/orig --output_dir /outbrain/data
    python -m wide_deep.data.outbrain.preproc ... --use_dask --dask_workers 2   # a LocalCluster on this machine
    python -m wide_deep.data.outbrain.preproc ... --dask_scheduler tcp://host:8786   # a running Dask cluster
    python -m wide_deep.data.outbrain.preproc ... --engine nvtabular   # NVTabular 23.8's workflow (CPU or GPU)

(``preproc/prepare_dataset.sh``, and NVIDIA's ``scripts/preproc.sh``, wrap this.) Two engines compute stage 2 (the features, after the joins):

- ``--engine default``: our own code, :mod:`wide_deep.data.outbrain.engine` (pandas, numpy, pyarrow, scipy; no
  NVTabular, merlin or dask needed), CPU only. It reproduces NVTabular 23.8's operators (HashBucket, FillMedian with
  dask's approximate median, LogOp, JoinGroupby CTR and counts, Normalize, TF-IDF ColumnSimilarity, Categorify and
  ListSlice of the page lists): the same files, columns, dtypes, row order and ``feature_spec.yaml``, every value
  equal bit for bit but the list codes of equally frequent terms (ordered by term id here, by numpy's unstable
  quicksort in NVTabular); ``tests/test_etl_engines.py`` compares them. ``workflow/`` holds the fitted statistics
  without pickle (JSON, parquet, npz): ``wide_deep.data.outbrain.engine.load_fitted(path).transform(joined_rows)``.
- ``--engine nvtabular``: the NVTabular workflow of :mod:`wide_deep.data.outbrain.nvtabular.workflow` (imported only
  then; NVTabular 23.8 with its own pins, e.g. ``make setup-nvtabular``'s environment, or the Merlin image), on CPU
  (pandas) where there is no GPU or with ``--cpu``, on GPU (cuDF) otherwise; ``workflow/`` is
  ``nvtabular.Workflow.load(path)``'s (needs ``wide_deep`` importable).

Output directory (written to a staging directory and moved into place at the end: on any error nothing is left):

    train/part_<i>.parquet   label ``clicked`` (int32), ``display_id`` (int64), 13 one-hot int32 ids, 3 multi-hot
    valid/part_<i>.parquet   int32 lists (at most 3 ids), 13 float32 numericals; valid sorted by display_id
    train/_file_list.txt     the files by absolute path (HugeCTR), and ``_metadata`` (parquet summary); NVTabular
                             also writes its schema files there
    feature_spec.yaml        recsys_common FeatureSpec: mappings ``train`` and ``test`` (= valid/), channels
                             ``label``, ``map``, ``onehot_categorical``, ``multihot_categorical``, ``numerical``;
                             categoricals with ``cardinality``, multi-hot with ``max_hotness: 3``
    workflow/                the fitted statistics (see the engines above)

Model-side interface: read ``feature_spec.yaml`` with ``recsys_common.feature_spec.FeatureSpec.from_yaml``; the
channel lists give the feature order; embedding widths are ``features.EMBEDDING_SIZES`` (``embedding_sizes.json``).

Out of core: the raw CSVs are read in blocks with typed columns, the joins and the split run display range by
display range (:mod:`wide_deep.data.outbrain.joins`, pandas in this process, ``--partition_rows`` clicks rows at
a time), and stage 2 is fitted and applied partition by partition (``--num_partitions``, default one per
``--partition_rows`` joined rows, at least 4). Memory is bounded by the partition size and the catalogue tables
(ads, documents), not by the click log. Every step prints its rows and rows/s; long steps print rows done of the
total, rows/s and time left every few seconds.

Resume: the stages (join and split; fit; transform train; transform valid) write into ``--work_dir`` (default
``<output_dir>.preproc.work``) and record each finished stage in its ``state.json``; after an error, Ctrl-C or a
kill, the same command skips the finished stages (``--restart`` starts over; other inputs or settings, the engine
included, are refused). The work directory is removed when the output is in place.

Dask: by default stage 2 runs in this process (the default engine: one partition after another; NVTabular: the
local threaded Dask scheduler). ``--use_dask`` starts a ``distributed.LocalCluster`` of ``--dask_workers``
processes on 127.0.0.1 (``LocalCUDACluster`` for NVTabular on GPU), ``--dask_scheduler`` uses an existing cluster,
whose workers must see ``--output_dir`` at the same path and be able to import ``wide_deep`` (same code on
``PYTHONPATH``). With either, the default engine runs each partition's fit passes and transform as a task on the
workers (plain ``distributed``, no NVTabular; the output is the same as in one process), NVTabular its workflow.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import shutil
import sys
import threading
import time
import warnings
from typing import Callable, Dict, Iterator, List, Optional, Sequence

import numpy as np

from recsys_common.cli import InputError, exit_status
from recsys_common.feature_spec import FeatureSpec
from recsys_common.io import OutputDirectoryError, atomic_directory, atomic_write_text, check_output_directory
from recsys_common.logger import hms

from . import features as F
from .joins import DEFAULT_PARTITION_ROWS, stream_join_and_split
from . import engine as E
from .raw import RAW_FILES, RawInputError, check_raw_files, raw_path, read_document_terms
from .tables import document_tables

TOOL = "wide_deep.data.outbrain.preproc"
SPEC_NAME = "feature_spec.yaml"
WORKFLOW_DIR = "workflow"
NUM_STEPS = 7
ENGINES = ("default", "nvtabular")


def skip_unused_frameworks() -> None:
    """Make ``import tensorflow`` / ``import torch`` fail in this process unless they are already imported.

    Merlin imports both, if present, for its dtype tables (about 20 s on 2 cores); the ETL uses neither. Only for
    processes that run nothing but the ETL: the command line and the workers of the ETL's own LocalCluster.
    """
    for name in ("tensorflow", "torch"):
        sys.modules.setdefault(name, None)
    warnings.filterwarnings("ignore", message=r".*dtype mappings did not load successfully")


class Progress:
    """Progress of the ETL: a numbered line per step (``[preproc] step i/N <what>: <rows> rows in <s> s (<rows/s>
    rows/s)``) and, inside the long steps, a line at most every ``every`` seconds: ``[preproc]   read
    clicks_train.csv: 4,194,304 of ~20,000,000 rows (21.0 %), 310,000 rows/s, 0:00:51 left`` (``~``: the total
    estimated from the bytes read of the file's size). Keeps the step timings."""

    def __init__(self, total: int = NUM_STEPS, out: Callable[[str], None] = print, every: float = 5.0):
        self.total, self.step, self.out, self.timings, self.every = total, 0, out, {}, every
        self._meters: Dict[str, list] = {}
        self._mark = time.perf_counter()   # start of the current sub-stage: the step's start or the last one's end

    @contextlib.contextmanager
    def __call__(self, what: str, rows: Optional[int] = None) -> Iterator[dict]:
        self.step += 1
        info = {"rows": rows}
        start = self._mark = time.perf_counter()
        yield info
        seconds = time.perf_counter() - start
        self.timings[what] = seconds
        rows = info["rows"]
        rate = f": {rows:,} rows in {seconds:.2f} s ({rows / max(seconds, 1e-9):,.0f} rows/s)" if rows else \
            f" in {seconds:.2f} s"
        self.out(f"[preproc] step {self.step}/{self.total} {what}{rate}; {_peak_rss_note()}")

    def rows(self, what: str, done: int, total: int, estimated: bool = False) -> None:
        """``done`` of ``total`` rows of sub-stage ``what`` (printed at most every ``every`` s, and at the end)."""
        now = time.perf_counter()
        state = self._meters.setdefault(what, [self._mark, -1e9])
        if done < total and now - state[1] < self.every:
            return
        state[1] = now
        if done >= total:
            self._mark = now
        elapsed = max(now - state[0], 1e-9)
        rate = done / elapsed
        left = (total - done) / rate if rate > 0 else float("nan")
        self.out(f"[preproc]   {what}: {done:,} of {'~' if estimated else ''}{total:,} rows "
                 f"({100.0 * done / max(total, 1):.1f} %), {rate:,.0f} rows/s, {hms(left)} left")

    def block(self, what: str, done: int, bytes_done: int, file_bytes: int) -> None:
        """A streamed CSV read: rows so far, total estimated from the share of the file read."""
        total = done if bytes_done >= file_bytes else max(done, int(done * file_bytes / max(bytes_done, 1)))
        self.rows(what, done, total, estimated=bytes_done < file_bytes)


def _peak_rss_note() -> str:
    """This process's peak resident memory so far (Linux ``ru_maxrss`` is in KiB): which step raised the peak."""
    return f"peak RSS so far {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GiB"


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


@contextlib.contextmanager
def task_progress(progress: Progress, what: str, rows: int, client=None) -> Iterator[None]:
    """Progress of a Dask computation as rows: ``rows`` x (tasks finished / tasks). NVTabular runs its fit and
    transform as Dask graphs whose tasks are per partition, so the share of tasks done is the share of rows done.
    Local scheduler: a ``dask.callbacks.Callback``; a ``distributed`` client: its task counts, polled."""
    if client is None:
        from dask.callbacks import Callback

        class _Tasks(Callback):
            def _start_state(self, dsk, state):
                self.total = max(1, sum(len(state[k]) for k in ("ready", "waiting", "waiting_data", "finished")))
                self.finished = 0

            def _posttask(self, key, result, dsk, state, worker_id):
                self.finished += 1
                progress.rows(what, int(rows * self.finished / self.total), rows, estimated=True)

        with _Tasks():
            yield
        return
    stop = threading.Event()

    def poll():
        while not stop.wait(progress.every):
            try:
                counts = client.run_on_scheduler(_scheduler_task_counts)
            except Exception:   # noqa: BLE001  (progress is best effort; the computation reports its own errors)
                return
            if counts[1]:
                progress.rows(what, int(rows * counts[0] / counts[1]), rows, estimated=True)

    thread = threading.Thread(target=poll, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def _scheduler_task_counts(dask_scheduler=None):
    """(tasks in memory or released after finishing, tasks known) on a distributed scheduler."""
    tasks = dask_scheduler.tasks.values()
    done = sum(1 for t in tasks if t.state in ("memory", "forgotten"))
    return done, max(1, len(dask_scheduler.tasks))


def require_nvtabular() -> None:
    """Import NVTabular (seconds) for ``--engine nvtabular``, or raise :class:`EngineUnavailableError`."""
    try:
        import merlin.io  # noqa: F401
        import nvtabular  # noqa: F401
    except ImportError as e:
        raise EngineUnavailableError(
            f"--engine nvtabular needs NVTabular 23.8 (and merlin-core), which this Python lacks ({e}); run it "
            f"with the NVTabular environment's python (make setup-nvtabular) or use --engine default") from e


def gpu_available() -> bool:
    from merlin.core.compat import cudf
    return cudf is not None


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


STATE_NAME = "state.json"
STATE_VERSION = 1
STAGES = ("join", "fit", "train", "test")   # the stages a resumed run skips once recorded as finished


class EngineUnavailableError(InputError):
    """``--engine nvtabular`` where NVTabular is not installed."""


class ResumeError(InputError):
    """A work directory that holds another run's state, or files this tool did not write."""


def default_work_dir(output_dir: str) -> str:
    return os.path.abspath(output_dir).rstrip(os.sep) + ".preproc.work"


def _input_fingerprint(input_dir: str, settings: Dict[str, object]) -> Dict[str, object]:
    """What a finished stage's result depends on: the raw files (size, mtime) and the settings that change rows."""
    files = {}
    for name in RAW_FILES:
        st = os.stat(raw_path(input_dir, name))
        files[name] = [st.st_size, st.st_mtime_ns]
    return {"input_dir": os.path.abspath(input_dir), "files": files, **settings}


class EtlState:
    """``<work_dir>/state.json``: the stages finished so far and what they produced, rewritten atomically after
    each stage. A stage's files are written under a temporary name in ``work_dir`` and renamed into place before
    the stage is recorded, so a kill at any moment leaves either a recorded, complete stage or nothing of it.

    A run whose fingerprint (input files' sizes and mtimes, settings) differs from the recorded one is refused
    (run the earlier command to resume it, or pass ``restart``); so is a ``work_dir`` holding anything but this
    tool's state (a user's files are never deleted)."""

    def __init__(self, work_dir: str, fingerprint: Dict[str, object], restart: bool, out: Callable[[str], None]):
        self.work_dir, self.path = work_dir, os.path.join(work_dir, STATE_NAME)
        self.data: Dict[str, object] = {"tool": TOOL, "version": STATE_VERSION, "fingerprint": fingerprint,
                                        "done": {}}
        if os.path.isdir(work_dir) and os.listdir(work_dir):
            old = None
            if os.path.isfile(self.path):
                with open(self.path, encoding="utf-8") as f:
                    old = json.load(f)
            if not isinstance(old, dict) or old.get("tool") != TOOL:
                raise ResumeError(f"{work_dir}: work directory exists and does not hold a {TOOL} state "
                                  f"({STATE_NAME}); choose another --work_dir or delete it")
            if restart or old.get("version") != STATE_VERSION or old.get("fingerprint") != fingerprint:
                if not restart:
                    raise ResumeError(
                        f"{work_dir}: holds an unfinished run with other input files or settings; run that command "
                        f"again to resume it, or pass --restart to start over (it deletes {work_dir})")
                shutil.rmtree(work_dir)
            else:
                self.data = old
                if self.data["done"]:
                    out(f"[preproc] resuming from {work_dir}: finished stages "
                        f"{', '.join(self.data['done'])} are not redone")
        os.makedirs(work_dir, exist_ok=True)
        self.save()

    def done(self, stage: str) -> Optional[dict]:
        return self.data["done"].get(stage)

    def finish(self, stage: str, result: dict) -> None:
        self.data["done"][stage] = result
        self.save()

    def save(self) -> None:
        atomic_write_text(self.path, json.dumps(self.data, indent=1) + "\n")

    def fresh(self, name: str) -> str:
        """An empty ``<work_dir>/<name>.tmp`` to write a stage into (what an interrupted attempt left is removed)."""
        path = os.path.join(self.work_dir, name + ".tmp")
        shutil.rmtree(path, ignore_errors=True)
        os.makedirs(path)
        return path

    def commit(self, name: str) -> str:
        """Rename ``<name>.tmp`` to ``<name>`` (replacing a leftover of an attempt that was not recorded)."""
        final = os.path.join(self.work_dir, name)
        shutil.rmtree(final, ignore_errors=True)
        os.rename(final + ".tmp", final)
        return final


def _run_stages(state: EtlState, input_dir: str, output_dir: str, progress: Progress, out: Callable[[str], None], *,
                use_dask: bool, dask_workers: int, dask_scheduler: Optional[str], cpu: bool, seed: int,
                num_partitions: Optional[int], partition_rows: int, num_train_files: Optional[int],
                num_valid_files: Optional[int], overwrite: bool, block_bytes: Optional[int], engine: str):
    """The stages of :func:`run_etl` after the checks; returns (rows, the join stage's record, stages skipped)."""
    work_dir = state.work_dir
    resumed = [s for s in STAGES if state.done(s)]

    with progress("read, join and split (streamed; pandas per display range)") as p:
        joined = state.done("join")
        if joined is None:
            scratch = state.fresh("join")
            result = stream_join_and_split(input_dir, scratch, seed=seed, partition_rows=partition_rows,
                                           num_partitions=num_partitions, block_bytes=block_bytes,
                                           on_block=progress.block, on_rows=progress.rows)
            np.save(os.path.join(scratch, "document_ids.npy"), result["document_ids"])
            joined = {"rows": result["rows"], "clicks_rows": result["clicks_rows"],
                      **{m: [os.path.relpath(f, scratch) for f in result[m]] for m in ("train", "test")}}
            state.commit("join")
            state.finish("join", joined)
        else:
            out("[preproc]   join and split: finished by an earlier run (skipped)")
        p["rows"] = joined["clicks_rows"]
    join_dir = os.path.join(work_dir, "join")
    files = {m: [os.path.join(join_dir, f) for f in joined[m]] for m in ("train", "test")}
    rows = dict(joined["rows"])
    stage2 = _stage2_default if engine == "default" else _stage2_nvtabular
    stage2(state, input_dir, output_dir, progress, out, files, rows, join_dir, use_dask=use_dask,
           dask_workers=dask_workers, dask_scheduler=dask_scheduler, cpu=cpu, num_train_files=num_train_files,
           num_valid_files=num_valid_files)
    with progress("feature spec and move into place"):
        with atomic_directory(output_dir, overwrite=overwrite, tool=TOOL, marker=SPEC_NAME) as staging:
            for name in (WORKFLOW_DIR, "train", "valid"):
                shutil.move(os.path.join(work_dir, name), os.path.join(staging, name))
            spec = build_feature_spec(staging, [f"train/{n}" for n in _parquet_files(os.path.join(staging, "train"))],
                                      [f"valid/{n}" for n in _parquet_files(os.path.join(staging, "valid"))], rows)
            spec.to_yaml(os.path.join(staging, SPEC_NAME))
        shutil.rmtree(work_dir, ignore_errors=True)
    return rows, joined, resumed


def _document_inputs(input_dir: str, join_dir: str, progress: Progress):
    """The per-page term lists and TF-IDF matrices of the pages the joins met (both engines' first fit step)."""
    with progress("document lists and TF-IDF matrices (pandas/scipy)") as p:
        tables = {source: read_document_terms(input_dir, source, column)
                  for source, column in sorted(set(F.LIST_SOURCES.values()))}
        p["rows"] = sum(len(t[0]) for t in tables.values())
        return document_tables(tables, np.load(os.path.join(join_dir, "document_ids.npy")))


def _stage2_nvtabular(state: EtlState, input_dir: str, output_dir: str, progress: Progress,
                      out: Callable[[str], None], files: Dict[str, List[str]], rows: Dict[str, int], join_dir: str, *,
                      use_dask: bool, dask_workers: int, dask_scheduler: Optional[str], cpu: bool,
                      num_train_files: Optional[int], num_valid_files: Optional[int]) -> None:
    """Stage 2 on NVTabular (``--engine nvtabular``): the workflow of :mod:`.nvtabular.workflow`, fitted and applied
    on Dask, saved with ``Workflow.save``."""
    from merlin.io import Dataset
    from nvtabular import Workflow
    from .nvtabular.workflow import build_workflow
    work_dir = state.work_dir
    with dask_client(use_dask, dask_workers, dask_scheduler, cpu, os.path.join(work_dir, "dask")) as client:
        if state.done("fit") is None:
            lists, matrices = _document_inputs(input_dir, join_dir, progress)
            stats = state.fresh("stats")
            workflow = build_workflow(lists, matrices, stats, client=client)
            del lists, matrices
            with progress("fit workflow on train (NVTabular)", rows["train"]), \
                    task_progress(progress, "fit workflow on train", rows["train"], client):
                workflow.fit(Dataset(files["train"], engine="parquet", cpu=cpu))
            # Saving copies the fitted statistics into workflow/, where transform then reads them.
            workflow.save(state.fresh(WORKFLOW_DIR))
            del workflow
            state.commit(WORKFLOW_DIR)
            shutil.rmtree(stats, ignore_errors=True)
            state.finish("fit", {})
        else:
            with progress("document lists and TF-IDF matrices: finished by an earlier run (skipped)"):
                pass
            with progress("fit workflow on train: finished by an earlier run (skipped)"):
                pass
        # Loaded back from the work directory in both cases, so a fresh and a resumed run transform alike.
        workflow = Workflow.load(os.path.join(work_dir, WORKFLOW_DIR), client=client)
        for mapping, subdir, count in (("train", "train", num_train_files), ("test", "valid", num_valid_files)):
            if state.done(mapping) is not None:
                with progress(f"transform and write {subdir}/: finished by an earlier run (skipped)"):
                    pass
                continue
            with progress(f"transform and write {subdir}/ (NVTabular)", rows[mapping]), \
                    task_progress(progress, f"transform and write {subdir}/", rows[mapping], client):
                written = state.fresh(subdir)
                workflow.transform(Dataset(files[mapping], engine="parquet", cpu=cpu)).to_parquet(
                    written, output_files=count or len(files[mapping]), shuffle=None)
                _fix_file_list(written, os.path.join(os.path.abspath(output_dir), subdir))
            state.commit(subdir)
            state.finish(mapping, {})


def _stage2_default(state: EtlState, input_dir: str, output_dir: str, progress: Progress,
                    out: Callable[[str], None], files: Dict[str, List[str]], rows: Dict[str, int], join_dir: str, *,
                    use_dask: bool, dask_workers: int, dask_scheduler: Optional[str], cpu: bool,
                    num_train_files: Optional[int], num_valid_files: Optional[int]) -> None:
    """Stage 2 on the default engine (:mod:`wide_deep.data.outbrain.engine`): fitted partition by partition,
    statistics saved without pickle; with ``--use_dask`` / ``--dask_scheduler`` the partitions run as tasks of a
    ``distributed`` cluster (plain Dask, no NVTabular)."""
    work_dir = state.work_dir
    with dask_client(use_dask, dask_workers, dask_scheduler, True, os.path.join(work_dir, "dask")) as client:
        if state.done("fit") is None:
            lists, matrices = _document_inputs(input_dir, join_dir, progress)
            with progress("fit workflow on train (pandas/numpy)", rows["train"]):
                E.fit(files["train"], lists, matrices, state.fresh(WORKFLOW_DIR), client=client,
                      on_rows=progress.rows, total_rows=rows["train"])
            del lists, matrices
            state.commit(WORKFLOW_DIR)
            state.finish("fit", {})
        else:
            with progress("document lists and TF-IDF matrices: finished by an earlier run (skipped)"):
                pass
            with progress("fit workflow on train: finished by an earlier run (skipped)"):
                pass
        workflow_dir = os.path.join(work_dir, WORKFLOW_DIR)
        for mapping, subdir, count in (("train", "train", num_train_files), ("test", "valid", num_valid_files)):
            if state.done(mapping) is not None:
                with progress(f"transform and write {subdir}/: finished by an earlier run (skipped)"):
                    pass
                continue
            with progress(f"transform and write {subdir}/ (pandas/numpy)", rows[mapping]):
                written = state.fresh(subdir)
                E.transform(files[mapping], workflow_dir, written, count or len(files[mapping]), client=client,
                            on_rows=progress.rows, what=f"transform and write {subdir}/", total_rows=rows[mapping])
                _fix_file_list(written, os.path.join(os.path.abspath(output_dir), subdir))
            state.commit(subdir)
            state.finish(mapping, {})


def run_etl(input_dir: str, output_dir: str, *, use_dask: bool = False, dask_workers: int = 2,
            dask_scheduler: Optional[str] = None, cpu: Optional[bool] = None, seed: int = 0,
            num_partitions: Optional[int] = None, partition_rows: int = DEFAULT_PARTITION_ROWS,
            num_train_files: Optional[int] = None, num_valid_files: Optional[int] = None, overwrite: bool = False,
            block_bytes: Optional[int] = None, work_dir: Optional[str] = None, restart: bool = False,
            engine: str = "default", out: Callable[[str], None] = print) -> Dict[str, object]:
    """Run the ETL; returns ``{"rows": {"train": n, "test": n}, "clicks_rows": n, "seconds": {step: s},
    "rows_per_second": r, "resumed": [stages skipped]}`` (``rows_per_second``: clicks_train rows per second, end to
    end).

    ``engine``: ``default`` (pandas/numpy, :mod:`wide_deep.data.outbrain.engine`; CPU only) or ``nvtabular`` (the
    NVTabular workflow; needs NVTabular 23.8 installed). ``cpu``: NVTabular only: None picks the GPU when cuDF is
    importable. ``num_partitions``: parquet pieces of the joined train and
    of the joined valid data, i.e. Dask partitions of the workflow (None: 4, or one per ``partition_rows`` rows
    when there are more; keep it fixed to compare runs: outputs are equal for equal partitions, whatever the
    scheduler). ``partition_rows`` also bounds the clicks rows joined at once. ``num_train_files`` /
    ``num_valid_files``: output files (None: one per partition). ``block_bytes``: CSV bytes parsed per block.

    Resume: the stages (join and split; fit; transform train; transform valid) write into ``work_dir`` (default
    ``<output_dir>.preproc.work``) and are recorded in its ``state.json`` when finished; a run stopped by an error,
    Ctrl-C or a kill keeps it, and the same command started again skips the recorded stages. ``restart``: discard
    an earlier run's work directory instead. On success the results move into ``output_dir`` and the work directory
    is removed.
    Raises ``RawInputError`` (missing file or column, bad value, an empty split), ``OutputDirectoryError``,
    ``ResumeError``.
    """
    if engine not in ENGINES:
        raise ValueError(f"--engine must be one of {', '.join(ENGINES)}, got {engine!r}")
    if engine == "default":
        cpu = True
    else:
        require_nvtabular()
        if cpu is None:
            cpu = not gpu_available()
    for flag, value in (("--num_partitions", num_partitions), ("--num_train_files", num_train_files),
                        ("--num_valid_files", num_valid_files), ("--dask_workers", dask_workers),
                        ("--partition_rows", partition_rows)):
        if value is not None and value < 1:
            raise ValueError(f"{flag} must be at least 1, got {value}")
    progress = Progress(out=out)
    where = ('default engine (pandas/numpy) on CPU' if engine == "default" else
             f"NVTabular on {'CPU (pandas; experimental in NVTabular 23.8)' if cpu else 'GPU (cuDF)'}")
    out(f"[preproc] {where}, "
        f"{'Dask scheduler ' + dask_scheduler if dask_scheduler else f'LocalCluster of {dask_workers} workers' if use_dask else 'one process'}")
    start = time.perf_counter()
    work_dir = os.path.abspath(work_dir or default_work_dir(output_dir))
    with progress("check raw files"):
        check_raw_files(input_dir)          # missing file/column: fail before any work
        check_output_directory(output_dir, overwrite)
        if os.path.abspath(output_dir) == work_dir:
            raise ResumeError(f"--work_dir must differ from --output_dir ({work_dir})")
        state = EtlState(work_dir, _input_fingerprint(input_dir, {
            "engine": engine, "seed": seed, "cpu": cpu, "num_partitions": num_partitions, "partition_rows": partition_rows,
            "num_train_files": num_train_files, "num_valid_files": num_valid_files}), restart, out)
    try:
        rows, joined, resumed = _run_stages(
            state, input_dir, output_dir, progress, out, use_dask=use_dask, dask_workers=dask_workers,
            dask_scheduler=dask_scheduler, cpu=cpu, seed=seed, num_partitions=num_partitions,
            partition_rows=partition_rows, num_train_files=num_train_files, num_valid_files=num_valid_files,
            overwrite=overwrite, block_bytes=block_bytes, engine=engine)
    except BaseException:
        if not state.data["done"]:   # nothing to resume (bad input is found in the first stage): leave nothing
            shutil.rmtree(work_dir, ignore_errors=True)
        else:
            out(f"[preproc] stopped; finished stages ({', '.join(state.data['done'])}) are kept in {work_dir}: "
                f"the same command resumes after them (--restart starts over)")
        raise
    seconds = time.perf_counter() - start
    total_rows = rows["train"] + rows["test"]
    out(f"[preproc] done: {joined['clicks_rows']:,} clicks_train rows -> {rows['train']:,} train + "
        f"{rows['test']:,} valid rows in {seconds:.1f} s ({joined['clicks_rows'] / seconds:,.0f} clicks rows/s end "
        f"to end{'; resumed: ' + ', '.join(resumed) + ' skipped' if resumed else ''}) -> {os.path.abspath(output_dir)}")
    return {"rows": rows, "clicks_rows": joined["clicks_rows"], "seconds": dict(progress.timings, total=seconds),
            "rows_per_second": joined["clicks_rows"] / seconds, "joined_rows_per_second": total_rows / seconds,
            "resumed": resumed}


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--input_dir", "--data_path", dest="input_dir", default="/outbrain/orig",
                   help="directory of the seven raw Outbrain CSVs")
    p.add_argument("--output_dir", "--metadata_path", dest="output_dir", default="/outbrain/data",
                   help="output directory: train/, valid/, feature_spec.yaml, workflow/")
    p.add_argument("--engine", choices=ENGINES, default="default",
                   help="stage 2 engine: default (pandas/numpy, no NVTabular) or nvtabular (the NVTabular 23.8 "
                        "workflow; needs NVTabular installed)")
    p.add_argument("--use_dask", action="store_true",
                   help="run stage 2 on a distributed.LocalCluster of --dask_workers processes")
    p.add_argument("--dask_workers", type=int, default=2, help="workers of the --use_dask LocalCluster")
    p.add_argument("--dask_scheduler", default=None,
                   help="address of a running Dask scheduler (tcp://host:8786) to run the workflow on")
    p.add_argument("--cpu", action="store_true", help="--engine nvtabular: use the CPU (pandas) even where a GPU "
                                                       "(cuDF) is available (the default engine always runs on CPU)")
    p.add_argument("--seed", type=int, default=0, help="seed of the train/valid split draw")
    p.add_argument("--num_partitions", type=int, default=None,
                   help="Dask partitions of the joined train (and of the joined valid) data; default 4, or one per "
                        "--partition_rows rows when there are more")
    p.add_argument("--partition_rows", type=int, default=DEFAULT_PARTITION_ROWS,
                   help="rows held at once: clicks rows joined together, and rows per default partition")
    p.add_argument("--num_train_files", type=int, default=None, help="parquet files in train/ (default: one per "
                                                                     "partition)")
    p.add_argument("--num_valid_files", type=int, default=None, help="parquet files in valid/ (default: one per "
                                                                     "partition)")
    p.add_argument("--work_dir", default=None,
                   help="where the stages write and record what is finished (state.json), kept after a failure or a "
                        "kill so that the same command resumes; removed on success (default: <output_dir>.preproc.work)")
    p.add_argument("--restart", action="store_true",
                   help="discard the work directory of an earlier unfinished run instead of resuming it")
    p.add_argument("--overwrite", action="store_true",
                   help="replace this tool's earlier outputs in a non-empty --output_dir (other files are kept)")
    return p.parse_args(argv)


def run(argv: Optional[Sequence[str]] = None):
    """Parse ``argv`` and run the ETL; returns :func:`run_etl`'s result. Raises ``RawInputError``,
    ``OutputDirectoryError``, ``ValueError`` (``ResumeError``) on bad input."""
    args = parse_args(argv)
    return run_etl(args.input_dir, args.output_dir, use_dask=args.use_dask, dask_workers=args.dask_workers,
                   dask_scheduler=args.dask_scheduler, cpu=True if args.cpu else None, seed=args.seed,
                   num_partitions=args.num_partitions, partition_rows=args.partition_rows,
                   num_train_files=args.num_train_files,
                   num_valid_files=args.num_valid_files, overwrite=args.overwrite, work_dir=args.work_dir,
                   restart=args.restart, engine=args.engine)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """The command line's exit status (recsys_common.cli): 0, or 2 with one ``error:`` line for bad input."""
    return exit_status(run, argv, input_errors=(RawInputError, OutputDirectoryError, ValueError))


if __name__ == "__main__":
    skip_unused_frameworks()
    # Said once here instead of once per Dataset: NVTabular calls its CPU (pandas) mode experimental.
    warnings.filterwarnings("ignore", message=r".*NVTabular Dataset (in|to) CPU mode")
    sys.exit(main())
