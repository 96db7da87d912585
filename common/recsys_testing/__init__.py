"""Locating the project's small real datasets from tests and benchmarks.

The datasets live beside the repository (``../shared/data``) or wherever ``RECSYS_DATA_DIR`` points; their licences
forbid committing them. A user's fresh clone has none, so tests that need them skip with a reason; CI sets
``RECSYS_REQUIRE_DATA=1`` and then a missing dataset fails the test instead of skipping it.

Also: free loopback ports; :func:`run_torchrun_nodes`, which starts several ``torchrun`` launchers on this machine
as the nodes of one job (the recipes' multi-node tests); :func:`run_process_group` and :func:`horovodrun_command`, the
one way the TensorFlow recipes' tests start ``horovodrun`` (or a single rank) and never leave a process behind.
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import re
import subprocess
import sys
import tempfile
import time
import uuid
from typing import Dict, Iterator, List, Optional, Sequence

from recsys_common.machine import free_port  # noqa: F401  (the one definition; tests import it from here)
from recsys_common.prepare_clicks import main as prepare_clicks
from recsys_common.feature_spec import FeatureSpec
from recsys_common.synthetic import generate_dataset
from recsys_common.serving.perf_analyzer import PerfAnalyzerNotFound, find_perf_analyzer

REQUIRE_ENV = "RECSYS_REQUIRE_DATA"
DATA_DIR_ENV = "RECSYS_DATA_DIR"


def repo_root() -> str:
    """The repository root (``common/recsys_testing/__init__.py``: three directories up)."""
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def recipe_env(recipe_dir: str, tensorflow: bool = False) -> Dict[str, str]:
    """Environment for a recipe test's child processes (``python -m ...``, torchrun, horovodrun): the recipe and
    ``common`` first on ``PYTHONPATH`` (a child imports this checkout's code even where the recipes are not
    installed), one OpenMP thread unless set; ``tensorflow``: Keras 2 (tf-keras, for Horovod) and quiet TF logs."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([recipe_dir, os.path.join(repo_root(), "common"), env.get("PYTHONPATH", "")])
    env.setdefault("OMP_NUM_THREADS", "1")
    if tensorflow:
        env["TF_USE_LEGACY_KERAS"] = "1"
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    return env


# The 999-row Avazu sample as both DLRM recipes' tests prepare it (tests/test_prepare_clicks_avazu.py): 18
# categorical columns (ids by frequency, values seen once -> the rare id), C15/C16 (banner width/height) as
# numericals, three random 70/30 splits (one 291-row test set is too noisy to compare models on).
AVAZU_CATEGORICAL = ["C1", "banner_pos", "site_id", "site_domain", "site_category", "app_id", "app_domain",
                     "app_category", "device_id", "device_model", "device_type", "device_conn_type", "C14", "C17",
                     "C18", "C19", "C20", "C21"]
AVAZU_SPLIT_SEEDS = (0, 1, 2)


def seed_study_margin(measured: Sequence[float], baseline: Sequence[float]) -> float:
    """How far below the baseline's mean a model's mean metric may fall: a seed study's ``measured`` means (one per
    seed) give mean - 3 sd, minus ``baseline``'s mean, rounded down to 3 decimals (a run of the same code on another
    seed stays above it; a model that learned nothing does not)."""
    import statistics
    floor = statistics.mean(measured) - 3 * statistics.stdev(measured) - statistics.mean(baseline)
    return math.floor(floor * 1000) / 1000


def prepare_avazu_splits(tmp_path_factory, seeds: Sequence[int] = AVAZU_SPLIT_SEEDS) -> List[str]:
    """The shared Avazu sample through ``recsys_common.prepare_clicks`` once per split seed; returns the dataset
    directories (skips, or fails under ``RECSYS_REQUIRE_DATA=1``, without the sample)."""
    raw = shared_data_path("avazu", "avazu-train-head999.csv")
    out = []
    for seed in seeds:
        directory = str(tmp_path_factory.mktemp("avazu") / f"split{seed}")
        prepare_clicks(["--input", raw, "--output", directory, "--label", "click", "--categorical",
                        *AVAZU_CATEGORICAL, "--numerical", "C15", "C16", "--frequency_limit", "2",
                        "--split_fractions", "0.7", "0", "0.3", "--seed", str(seed)])
        out.append(directory)
    return out


def ci_pins(constraints: str = "ci/constraints.txt") -> Dict[str, str]:
    """``{package: version}`` of ``ci/constraints.txt`` (names lower-case, ``_`` as ``-``): what CI tests, which
    the recipes' Dockerfiles and requirements must agree with (their ``tests/test_packaging.py``).
    ``constraints``: another constraints file of the repository (``ci/nvtabular-env/constraints.txt``)."""
    pins = {}
    with open(os.path.join(repo_root(), constraints)) as f:
        for line in f:
            m = re.match(r"^([A-Za-z0-9_.-]+)==([^\s#]+)", line)
            if m:
                pins[m.group(1).lower().replace("_", "-")] = m.group(2)
    return pins


def requirement_specs(path: str) -> Dict[str, str]:
    """``{package: version specifier}`` of a requirements file (``""`` for an unpinned line; comments dropped)."""
    out = {}
    with open(path) as f:
        for line in f:
            line = line.split("#", 1)[0].strip()
            if line:
                m = re.match(r"^([A-Za-z0-9_.-]+)\s*(.*)$", line)
                out[m.group(1).lower().replace("_", "-")] = m.group(2)
    return out


def read_dockerfile(path: str):
    """``(text, {ARG name: default}, [RUN commands, continuation lines joined])`` of a Dockerfile."""
    with open(path) as f:
        text = f.read()
    runs = [line[4:] for line in re.sub(r"\\\n", " ", text).splitlines() if line.startswith("RUN ")]
    return text, dict(re.findall(r"^ARG (\w+)=(\S+)", text, flags=re.M)), runs


def make_criteo_like_dataset(directory: str, train_rows: int = 8192, test_rows: int = 2048,
                             table_sizes: Sequence[int] = (1000, 500, 200, 100, 50, 20, 10, 5),
                             seed: int = 7) -> str:
    """A tiny split-binary dataset in NVIDIA's DLRM layout (13 numericals, ``table_sizes`` categoricals, learnable
    labels) in ``directory``, for the DLRM recipes' tests; returns the directory."""
    spec = FeatureSpec.get_default_feature_spec(13, list(table_sizes))
    generate_dataset(spec, str(directory), {"train": train_rows, "test": test_rows}, seed=seed)
    return str(directory)


@contextlib.contextmanager
def local_spark_session(app_name: str) -> Iterator["pyspark.sql.SparkSession"]:  # noqa: F821
    """The tests' Spark: ``local[2]`` on the loopback address, no UI or progress bars, 2 shuffle partitions, a 1 GiB
    driver and the C1-only JIT (the tests' jobs are tiny, so JVM warm-up dominates: 1.6-2.4x faster measured here),
    ERROR logs; stopped on exit."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession
    session = (SparkSession.builder.master("local[2]").appName(app_name)
               .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", "2").config("spark.driver.memory", "1g")
               .config("spark.driver.extraJavaOptions", "-XX:TieredStopAtLevel=1")
               .getOrCreate())
    try:
        session.sparkContext.setLogLevel("ERROR")
        yield session
    finally:
        session.stop()


def shared_data_dir() -> str:
    return os.path.abspath(os.environ.get(DATA_DIR_ENV) or os.path.join(repo_root(), os.pardir, "shared", "data"))


def data_required() -> bool:
    return os.environ.get(REQUIRE_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def shared_data_path(*parts: str) -> str:
    """Path of a shared dataset; inside pytest, skip (or fail when required) if it does not exist."""
    path = os.path.join(shared_data_dir(), *parts)
    if os.path.exists(path):
        return path
    reason = (f"real dataset {os.path.join(*parts)} not found at {path}: set {DATA_DIR_ENV} to the directory "
              f"holding the project's shared datasets (see README)")
    import pytest  # imported here so that the library itself does not depend on pytest
    if data_required():
        pytest.fail(f"{reason}; {REQUIRE_ENV}=1 makes this a failure", pytrace=False)
    pytest.skip(reason)
    return path  # unreachable


def perf_analyzer_path() -> str:
    """Triton's perf_analyzer (``make setup`` installs it); inside pytest, skip without it, or fail when
    ``RECSYS_REQUIRE_DATA=1`` (CI, whose setup installs it)."""
    try:
        return find_perf_analyzer()
    except PerfAnalyzerNotFound as e:
        import pytest
        if data_required():
            pytest.fail(f"{e}; {REQUIRE_ENV}=1 makes this a failure", pytrace=False)
        pytest.skip(str(e))
        raise  # unreachable


NVTABULAR_PYTHON_ENV = "RECSYS_NVTABULAR_PYTHON"
REQUIRE_NVTABULAR_ENV = "RECSYS_REQUIRE_NVTABULAR"


def nvtabular_python() -> str:
    """The interpreter of the separate NVTabular environment (``make setup-nvtabular``: NVTabular 23.8 with its
    2023 pins, nothing else), which runs the ETLs' ``--engine nvtabular`` for the equality tests: the path in
    ``RECSYS_NVTABULAR_PYTHON``, else ``<repo>/.venv-nvtabular/bin/python``. Inside pytest, skip without it, or
    fail when ``RECSYS_REQUIRE_NVTABULAR=1`` or ``RECSYS_REQUIRE_DATA=1`` (``make test`` and CI build it)."""
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    path = os.environ.get(NVTABULAR_PYTHON_ENV) or os.path.join(repo, ".venv-nvtabular", "bin", "python")
    if os.access(path, os.X_OK):
        return path
    reason = (f"the NVTabular environment's python ({path}) is missing: run 'make setup-nvtabular' or set "
              f"{NVTABULAR_PYTHON_ENV}")
    import pytest
    required = os.environ.get(REQUIRE_NVTABULAR_ENV, "").strip().lower() in ("1", "true", "yes", "on")
    if required or data_required():
        pytest.fail(f"{reason}; {REQUIRE_NVTABULAR_ENV}=1 or {REQUIRE_ENV}=1 makes this a failure", pytrace=False)
    pytest.skip(reason)
    return path  # unreachable


@dataclasses.dataclass
class LauncherResult:
    node: int
    command: List[str]
    returncode: Optional[int]   # None: killed after the deadline or after another node failed
    output: str                 # stdout and stderr, interleaved


def run_torchrun_nodes(program: Sequence[str], nnodes: int = 2, nproc_per_node: int = 1,
                       rendezvous: str = "c10d", cwd: Optional[str] = None, env: Optional[Dict[str, str]] = None,
                       timeout: float = 600.0) -> List[LauncherResult]:
    """Start ``nnodes`` torchrun launchers on loopback at once, as nodes ``0..nnodes-1`` of one job, and wait for all.

    ``program``: what follows torchrun's own flags (``["-m", "dlrm.scripts.main", ...]`` or ``["ncf.py", ...]``).
    ``rendezvous``: ``"c10d"`` (``--rdzv_backend c10d --rdzv_endpoint 127.0.0.1:PORT``; torchrun then orders the
    nodes itself) or ``"static"`` (``--node_rank R --master_addr 127.0.0.1 --master_port PORT``). The port is free at
    call time. Every launcher must exit 0: otherwise, or past ``timeout`` seconds, every launcher still running is
    stopped (with its workers) and the AssertionError shows each node's command, exit status and output.
    """
    if rendezvous not in ("c10d", "static"):
        raise ValueError(f"rendezvous must be 'c10d' or 'static', got {rendezvous!r}")
    port = free_port()
    child_env = dict(os.environ if env is None else env)
    child_env.setdefault("GLOO_SOCKET_IFNAME", "lo")  # gloo's connections stay on loopback too
    base = [sys.executable, "-m", "torch.distributed.run", f"--nnodes={nnodes}", f"--nproc_per_node={nproc_per_node}"]
    run_id = uuid.uuid4().hex[:12]
    procs, logs, commands, killed = [], [], [], set()
    try:
        for node in range(nnodes):
            if rendezvous == "c10d":
                launcher = ["--rdzv_backend=c10d", f"--rdzv_endpoint=127.0.0.1:{port}", f"--rdzv_id={run_id}",
                            "--local_addr=127.0.0.1"]
            else:
                launcher = [f"--node_rank={node}", "--master_addr=127.0.0.1", f"--master_port={port}"]
            command = base + launcher + list(program)
            log = tempfile.TemporaryFile(mode="w+", prefix=f"torchrun_node{node}_")
            logs.append(log)
            commands.append(command)
            procs.append(subprocess.Popen(command, cwd=cwd, env=child_env, stdout=log, stderr=subprocess.STDOUT))
        deadline = time.monotonic() + timeout
        while any(p.poll() is None for p in procs):
            if time.monotonic() > deadline or any(p.poll() not in (None, 0) for p in procs):
                break
            time.sleep(0.5)
    finally:
        for node, p in enumerate(procs):
            if p.poll() is None:
                _kill_session(p)
                killed.add(node)
    results = []
    for node, (p, log, command) in enumerate(zip(procs, logs, commands)):
        log.seek(0)
        results.append(LauncherResult(node, command, None if node in killed else p.returncode, log.read()))
        log.close()
    if any(r.returncode != 0 for r in results):
        report = "\n".join(f"--- node {r.node}: exit {r.returncode if r.returncode is not None else 'killed'}\n"
                            f"{' '.join(r.command)}\n{_excerpt(r.output)}" for r in results)
        raise AssertionError(f"a torchrun launcher of the {nnodes}-node job failed\n{report}")
    return results


def run_process_group(command: Sequence[str], cwd: Optional[str] = None, env: Optional[Dict[str, str]] = None,
                      timeout: float = 600.0, expect_success: bool = True):
    """Run ``command`` in a session of its own and wait; past ``timeout`` (or on any exception while waiting, such as
    a KeyboardInterrupt) kill the whole process group, launcher and ranks.

    Returns the output (stdout and stderr interleaved); with ``expect_success`` a non-zero exit raises an
    AssertionError showing the command, its status and the start and end of the output; otherwise returns
    ``(returncode, output)``. A timeout always raises.
    """
    import signal
    command = list(command)
    proc = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        raise AssertionError(f"{' '.join(command)} did not finish in {timeout:.0f} s (process group killed)\n"
                             f"{_excerpt(output)}") from None
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    if not expect_success:
        return proc.returncode, output
    if proc.returncode != 0:
        raise AssertionError(f"{' '.join(command)} exited {proc.returncode}\n{_excerpt(output)}")
    return output


def horovodrun_command(num_ranks: int, program: Sequence[str], bin_dir: Optional[str] = None) -> List[str]:
    """``horovodrun -np N -H localhost:N --gloo --network-interface lo <program>``: gloo on loopback, no MPI.

    ``bin_dir``: where ``horovodrun`` is (default: beside ``sys.executable``, the venv's bin directory).
    """
    bin_dir = bin_dir or os.path.dirname(sys.executable)
    return [os.path.join(bin_dir, "horovodrun"), "-np", str(num_ranks), "-H", f"localhost:{num_ranks}", "--gloo",
            "--network-interface", "lo", *program]


def horovod_env(env: Dict[str, str], gloo_timeout_seconds: int = 120) -> Dict[str, str]:
    """``env`` plus what a loopback horovodrun job needs: gloo on ``lo``, a gloo timeout, one OpenMP thread per rank,
    and this interpreter's bin directory first on PATH (horovodrun's ranks run ``python`` from PATH)."""
    env = dict(env)
    env.update(GLOO_SOCKET_IFNAME="lo", HOROVOD_GLOO_TIMEOUT_SECONDS=str(gloo_timeout_seconds), OMP_NUM_THREADS="1")
    env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", "")])
    return env


def _excerpt(output: str, head: int = 2500, tail: int = 5500) -> str:
    """The start (the program's own first lines) and the end (the failure) of a long output."""
    if len(output) <= head + tail:
        return output
    return f"{output[:head]}\n[... {len(output) - head - tail} characters left out ...]\n{output[-tail:]}"


def _kill_session(proc: subprocess.Popen, grace_seconds: float = 30.0) -> None:
    """Stop a launcher and its workers: SIGTERM (torchrun then stops its workers), SIGKILL whatever is left.

    torchrun starts each worker in a session of its own, so the workers are found by parentage (``/proc``) first.
    """
    import signal
    workers = _descendants(proc.pid)
    for sig, wait in ((signal.SIGTERM, grace_seconds), (signal.SIGKILL, 10.0)):
        for pid in [proc.pid] + workers:
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        try:
            proc.wait(timeout=wait)
            break
        except subprocess.TimeoutExpired:
            continue
    for pid in workers:  # a worker the launcher did not stop
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _descendants(pid: int) -> List[int]:
    """Process ids below ``pid`` (Linux ``/proc``; an empty list elsewhere)."""
    children: Dict[int, List[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def import_script(path: str, name: Optional[str] = None):
    """The script at ``path`` (one not in a package, e.g. a recipe's ``benchmarks/<what>.py``) imported as a module,
    for tests that call its functions. ``name``: its module name (default: ``script_<file name>``)."""
    import importlib.util
    name = name or f"script_{os.path.splitext(os.path.basename(path))[0]}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module   # dataclasses and pickling look modules up by name
    spec.loader.exec_module(module)
    return module


#: The Kaggle split of the real 1999-line Criteo sample: lines [0, 1714) train, [1714, 1857) test, the rest validation
#: (``recsys_common.criteo.layout.split_boundaries``).
CRITEO_SAMPLE_TRAIN_END, CRITEO_SAMPLE_TEST_END = 1714, 1857


def criteo_sample_dataset(work_dir: str, frequency_limit: int = 3) -> str:
    """The real 1999-line Criteo sample through the default engine into ``<work_dir>/data`` (frequency limit 3: rare
    values in every split, input order kept); returns that directory."""
    from recsys_common.criteo import polars_preprocess
    os.makedirs(os.path.join(work_dir, "in"))
    os.symlink(shared_data_path("criteo", "kaggle-train-head1999.tsv"), os.path.join(work_dir, "in", "train.txt"))
    polars_preprocess.main(["--input_path", os.path.join(work_dir, "in"), "--output_path",
                            os.path.join(work_dir, "data"), "--frequency_limit", str(frequency_limit),
                            "--train_ordering", "input"])
    return os.path.join(work_dir, "data")


def criteo_sample_raw_test_rows():
    """The sample's test-split lines as a raw request: ``(integers [n, 13], categoricals [n, 26])``, object arrays of
    the fields' bytes as they stand in the file (empty for missing)."""
    import numpy as np
    with open(shared_data_path("criteo", "kaggle-train-head1999.tsv"), encoding="utf-8") as f:
        lines = f.read().split("\n")[CRITEO_SAMPLE_TRAIN_END:CRITEO_SAMPLE_TEST_END]
    fields = [(line.split("\t") + [""] * 40)[:40] for line in lines]
    return (np.array([[v.encode() for v in f[1:14]] for f in fields], dtype=object),
            np.array([[v.encode() for v in f[14:]] for f in fields], dtype=object))
