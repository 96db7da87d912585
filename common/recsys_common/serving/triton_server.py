"""A real Triton Inference Server on loopback serving a model repository, started and always stopped.

    with serve_repository("deploy/repo_cpu") as server:       # every model of the repository, READY
        with InferenceClient(server.grpc_url, "grpc") as client:
            client.infer("dlrm-onnx", inputs, ["probability"])
    # here the server and its Python-backend stubs are gone (also when the block raised)

From a shell (blocks until Ctrl-C or SIGTERM):

    python -m recsys_common.serving.triton_server --model-repository deploy/repo_cpu [--models a b] \\
        [--http-port 8000 --grpc-port 8001] [--host 127.0.0.1]

The server is the ``tritonserver`` binary (Triton 2.51) of the ``nvidia-pytriton`` wheel, which ``make setup``
installs into ``<venv>/opt/tritonserver`` (``ci/install_tritonserver.sh``). It has the Python backend and Triton's
ensemble scheduler only, so it serves the CPU repositories our deployers write (``backend: "python"`` models running
ONNX / TorchScript / SavedModel inside ``model.py``, and ensembles of them); a GPU repository (onnxruntime, libtorch
and TensorFlow platforms) needs NVIDIA's container, and is refused here with that said.

How: the server runs under ``_process_watchdog`` (the leader of a new process group, so one signal reaches the
server and the stubs it starts; it stops the server if this process dies without stopping it), bound to ``host``
(loopback by default; Triton binds 0.0.0.0 unless told), metrics off (no third port to collide on),
``--disable-auto-complete-config`` (a model is served with exactly the ``config.pbtxt`` we wrote, so a field Triton
refuses fails here as it would in production), ``--model-control-mode explicit`` with one ``--load-model`` per name
when ``models`` is given. The Python stubs run the interpreter of ``<install>/stub-env`` (numpy 1.26, the main
environment's packages after it): the stub was built against numpy 1.x and returns wrong tensor values under numpy 2.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from typing import Iterator, List, Optional, Sequence

from ..machine import free_port
from .client import ServingError
from .model_config import ModelConfigError, check_model_directory

#: Where ``ci/install_tritonserver.sh`` puts the server, under the Python environment's prefix.
INSTALL_SUBDIR = os.path.join("opt", "tritonserver")
#: Set to another install directory (same layout) to use it instead.
INSTALL_ENV = "RECSYS_TRITONSERVER_HOME"
#: Read by the CPU repository's ``model.py`` (``triton_python_model.THREADS_ENV``; that file imports nothing of ours).
THREADS_ENV = "RECSYS_SERVING_THREADS"
#: The backend each platform needs (an ensemble is scheduled by Triton itself).
PLATFORM_BACKENDS = {"onnxruntime_onnx": "onnxruntime", "pytorch_libtorch": "pytorch",
                     "tensorflow_savedmodel": "tensorflow", "ensemble": None}


@dataclasses.dataclass(frozen=True)
class TritonInstall:
    """A ``tritonserver`` install: the binary, its ``--backend-directory`` and the stubs' interpreter directory."""
    home: str

    @property
    def binary(self) -> str:
        return os.path.join(self.home, "pytriton", "tritonserver", "bin", "tritonserver")

    @property
    def backend_directory(self) -> str:
        return os.path.join(self.home, "pytriton", "tritonserver", "backends")

    @property
    def stub_bin(self) -> str:
        return os.path.join(self.home, "stub-env", "bin")

    def backends(self) -> List[str]:
        """The backends this install has (the sub-directories of the backend directory)."""
        return sorted(n for n in os.listdir(self.backend_directory)
                      if os.path.isdir(os.path.join(self.backend_directory, n)))


def find_tritonserver() -> TritonInstall:
    """The install in ``$RECSYS_TRITONSERVER_HOME`` or ``<sys.prefix>/opt/tritonserver``; ``ServingError`` saying how
    to install it when absent."""
    home = os.environ.get(INSTALL_ENV) or os.path.join(sys.prefix, INSTALL_SUBDIR)
    install = TritonInstall(os.path.abspath(home))
    missing = [p for p in (install.binary, os.path.join(install.stub_bin, "python3")) if not os.path.exists(p)]
    if missing:
        raise ServingError(f"tritonserver is not installed at {install.home} (missing {missing[0]}): run `make setup` "
                           f"or `bash ci/install_tritonserver.sh {sys.executable}` (needs glibc 2.35+), or set "
                           f"{INSTALL_ENV} to an install")
    return install


def model_backend(config) -> Optional[str]:
    """The backend a parsed ``ModelConfig`` needs (None for an ensemble)."""
    return config.backend or PLATFORM_BACKENDS.get(config.platform)


def repository_models(repo_dir: str, models: Optional[Sequence[str]], install: TritonInstall) -> List[str]:
    """The names of the models to serve: ``models`` (each must be in the repository), or every model there.

    Each model directory is checked with ``check_model_directory``, and its backend must be one this install has.
    Raises ``ServingError`` naming the repository and the model."""
    if not os.path.isdir(repo_dir):
        raise ServingError(f"{repo_dir}: model repository not found")
    names = sorted(n for n in os.listdir(repo_dir)
                   if not n.startswith(".") and os.path.isfile(os.path.join(repo_dir, n, "config.pbtxt")))
    unknown = [m for m in (models or ()) if m not in names]
    if unknown:
        raise ServingError(f"{repo_dir}: no model {unknown[0]!r} (models there: {names or 'none'})")
    if not names:
        raise ServingError(f"{repo_dir}: no model (no <name>/config.pbtxt)")
    available = install.backends()
    for name in names:   # every one, also when serving some: an ensemble's steps load with it
        try:
            config = check_model_directory(os.path.join(repo_dir, name))
        except ModelConfigError as e:
            raise ServingError(f"{repo_dir}: model {name!r} cannot be served: {e}") from None
        backend = model_backend(config)
        if backend is not None and backend not in available and (models is None or name in models):
            raise ServingError(f"{repo_dir}: model {name!r} needs Triton's {backend!r} backend, which the "
                               f"tritonserver at {install.home} lacks (it has {available}); this server runs CPU "
                               f"repositories (backend \"python\"): write one with the recipe's deployer and "
                               f"--triton-backend python, or serve this repository with NVIDIA's Triton container")
    return list(models) if models else names


def triton_command(install: TritonInstall, repo_dir: str, models: Optional[Sequence[str]], host: str,
                   http_port: int, grpc_port: int, exit_timeout_s: int) -> List[str]:
    """The ``tritonserver`` command line (see the module docstring for why each flag)."""
    command = [install.binary, f"--model-repository={repo_dir}", f"--backend-directory={install.backend_directory}",
               f"--http-address={host}", f"--http-port={http_port}", f"--grpc-address={host}",
               f"--grpc-port={grpc_port}", "--allow-metrics=false", "--allow-gpu-metrics=false",
               "--disable-auto-complete-config", "--strict-readiness=true", f"--exit-timeout-secs={exit_timeout_s}",
               "--pinned-memory-pool-byte-size=0", "--log-verbose=0"]
    if models:
        command.append("--model-control-mode=explicit")
        command += [f"--load-model={m}" for m in models]
    return command


@dataclasses.dataclass
class ServerHandle:
    """A running server: ``http_url`` / ``grpc_url`` as "host:port" (what tritonclient takes), the served model
    names, the server log file and the process id of the watchdog (also the id of the server's process group)."""
    http_url: str
    grpc_url: str
    models: List[str]
    log_path: str
    pid: int


#: Log lines that say nothing on a machine without GPUs.
_LOG_NOISE = ("NVML", "DCGM", "CudaDriverHelper", "CUDA memory pool", "Pinned memory pool")


def log_tail(path: str, lines: int = 30) -> str:
    """The server log's error lines (Triton's ``E...`` lines, which a model's refusal is) and its last ``lines``
    lines, without the option tables and the GPU notices of a machine without GPUs."""
    try:
        with open(path, "r", encoding="utf-8", errors="replace") as f:
            kept = [line for line in f if not line.startswith(("|", "+-")) and line.strip()
                    and not any(noise in line for noise in _LOG_NOISE)]
    except OSError:
        return "(no log)"
    tail = kept[-lines:]
    errors = [line for line in kept[:-lines] if line.startswith("E") or "error" in line.lower()][-10:]
    return "".join(errors + (["...\n"] if errors else []) + tail)


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2.0) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def stop_process_group(proc: subprocess.Popen, grace_s: float = 10.0) -> None:
    """Stop the watchdog ``proc`` (a process-group leader) and everything in its group: SIGTERM to the watchdog,
    which stops the server within ``grace_s``; then SIGKILL to the group, whatever is left."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(proc.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=grace_s + 5.0)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5.0)


def _wait_until_ready(proc: subprocess.Popen, repo_dir: str, url: str, models: Sequence[str], timeout_s: float,
                      log_path: str) -> None:
    deadline = time.monotonic() + timeout_s
    waiting = list(models)
    while waiting:
        if proc.poll() is not None:
            raise ServingError(f"tritonserver serving {repo_dir} exited with status {proc.returncode} before "
                               f"model(s) {waiting} were ready; log {log_path}, last lines:\n{log_tail(log_path)}")
        if time.monotonic() > deadline:
            raise ServingError(f"tritonserver serving {repo_dir}: model(s) {waiting} not ready after {timeout_s:g} s; "
                               f"log {log_path}, last lines:\n{log_tail(log_path)}")
        waiting = [m for m in waiting if not _http_ok(f"http://{url}/v2/models/{m}/ready")]
        if waiting:
            time.sleep(0.2)


@contextlib.contextmanager
def serve_repository(repo_dir: str, models: Optional[Sequence[str]] = None, *, http_port: Optional[int] = None,
                     grpc_port: Optional[int] = None, startup_timeout_s: float = 120.0, log_path: Optional[str] = None,
                     host: str = "127.0.0.1", stop_timeout_s: float = 10.0, intra_op_threads: int = 0,
                     install: Optional[TritonInstall] = None) -> Iterator[ServerHandle]:
    """Serve a model repository with Triton; yield a ``ServerHandle`` once every served model is READY.

    Args:
        repo_dir: the model repository.
        models: model names to serve (explicit model control; an ensemble's steps load with it); default every one.
        http_port, grpc_port: default: free ports picked now.
        startup_timeout_s: limit for the server to start and load every model.
        log_path: the server's stdout+stderr (default: a file in a temporary directory, removed on exit).
        host: the address to bind (loopback by default; the client connects to 127.0.0.1 when it is 0.0.0.0).
        stop_timeout_s: how long Triton may take to stop (its ``--exit-timeout-secs``) before SIGKILL.
        intra_op_threads: framework threads per model instance (onnxruntime, torch, TensorFlow inside ``model.py``,
            through ``RECSYS_SERVING_THREADS``); 0: each framework's default.
        install: the server to run (default ``find_tritonserver()``).
    Raises ``ServingError`` (with the end of the server log) if the server exits or misses the deadline (a model
    Triton refuses makes it exit); the server's process group is stopped on exit from the block, also when it raises.
    """
    install = install or find_tritonserver()
    repo_dir = os.path.abspath(repo_dir)
    served = repository_models(repo_dir, models, install)
    client_host = "127.0.0.1" if host in ("0.0.0.0", "") else host
    env = dict(os.environ, PATH=os.pathsep.join([install.stub_bin, os.environ.get("PATH", "")]))
    if intra_op_threads:
        env[THREADS_ENV] = str(int(intra_op_threads))
    # ports we pick can be taken by another process before Triton binds them: then pick again
    attempts = PORT_ATTEMPTS if http_port is None or grpc_port is None else 1
    with tempfile.TemporaryDirectory(prefix="recsys_triton_") as workdir:
        log_path = os.path.abspath(log_path) if log_path else os.path.join(workdir, "tritonserver.log")
        for attempt in range(1, attempts + 1):
            ports = _ports(http_port, grpc_port)
            command = triton_command(install, repo_dir, models, host, *ports, max(1, int(stop_timeout_s)))
            proc = _start_watched(command, env, workdir, log_path, stop_timeout_s)
            try:
                _wait_until_ready(proc, repo_dir, f"{client_host}:{ports[0]}", served, startup_timeout_s, log_path)
                break
            except ServingError as e:
                stop_process_group(proc, stop_timeout_s)
                if attempt == attempts or "already in use" not in str(e):
                    raise
        try:
            yield ServerHandle(http_url=f"{client_host}:{ports[0]}", grpc_url=f"{client_host}:{ports[1]}",
                               models=served, log_path=log_path, pid=proc.pid)
        finally:
            stop_process_group(proc, stop_timeout_s)


PORT_ATTEMPTS = 3


def _ports(http_port: Optional[int], grpc_port: Optional[int]):
    """(HTTP port, gRPC port): the given ones, free ports picked now for the others (never the same twice)."""
    http_port = http_port or free_port()
    chosen = grpc_port or free_port()
    while chosen == http_port and not grpc_port:
        chosen = free_port()
    return http_port, chosen


def _start_watched(command: List[str], env, workdir: str, log_path: str, stop_timeout_s: float) -> subprocess.Popen:
    """``command`` under ``_process_watchdog`` (which stops it if this process dies), in a new process group, its
    output appended to ``log_path``."""
    watchdog = [sys.executable, "-m", "recsys_common.serving._process_watchdog", str(os.getpid()),
                str(stop_timeout_s), "--"]
    with open(log_path, "ab") as log:
        return subprocess.Popen(watchdog + command, cwd=workdir, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)


# ---------------------------------------------------------------------------------------------------------- CLI
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m recsys_common.serving.triton_server",
        description="Serve a Triton model repository with the tritonserver that `make setup` installs (Triton 2.51, "
                    "Python backend, CPU) until Ctrl-C.")
    parser.add_argument("--model-repository", required=True, help="the model repository directory")
    parser.add_argument("--models", nargs="+", default=None,
                        help="model names to serve (explicit model control; default: every model)")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only)")
    parser.add_argument("--http-port", type=int, default=8000, help="HTTP port (Triton's default 8000)")
    parser.add_argument("--grpc-port", type=int, default=8001, help="gRPC port (Triton's default 8001)")
    parser.add_argument("--startup-timeout", type=float, default=120.0, help="seconds to wait for every model")
    parser.add_argument("--log-path", default=None, help="server log file (default: a temporary file)")
    parser.add_argument("--intra-op-threads", type=int, default=0,
                        help="framework threads per model instance (0: each framework's default)")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> None:
    """Serve until Ctrl-C or SIGTERM; a server that does not come up raises ``ServingError``."""
    args = build_parser().parse_args(argv)
    stop = []
    # SIGTERM stops like Ctrl-C, so that the server group is always taken down with us
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    with serve_repository(args.model_repository, args.models, http_port=args.http_port, grpc_port=args.grpc_port,
                          startup_timeout_s=args.startup_timeout, log_path=args.log_path, host=args.host,
                          intra_op_threads=args.intra_op_threads) as server:
        print(f"serving {', '.join(server.models)}: HTTP {server.http_url}, gRPC {server.grpc_url} "
              f"(log {server.log_path}); Ctrl-C stops", flush=True)
        try:
            while not stop:
                time.sleep(0.2)
        except KeyboardInterrupt:
            pass
    print("server stopped", flush=True)


if __name__ == "__main__":
    from recsys_common.cli import run_main
    run_main(main, failures=(ServingError,))
