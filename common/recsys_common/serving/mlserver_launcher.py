"""MLServer on loopback serving the ONNX and TorchScript models of a Triton model repository, started and always
stopped.

No Triton server runs on these machines; MLServer speaks the same KServe-v2 protocol (HTTP and gRPC), so clients
and tools built for Triton (tritonclient) run against it unchanged.

    with serve_repository("deploy/repo") as server:          # every ONNX / TorchScript model of the repository
        with InferenceClient(server.grpc_url, "grpc") as client:
            client.infer("dlrm-onnx", inputs, ["probability"])
    # here the MLServer process group is gone (also when the block raised)

For users without Triton (blocks until Ctrl-C):

    python -m recsys_common.serving.mlserver_launcher --model-repository deploy/repo [--models a b] \\
        [--http-port 8000 --grpc-port 8001] [--host 127.0.0.1]

How (MLServer 1.7.1): a temporary directory holds ``settings.json`` (host, ports, ``parallel_workers: 0`` so
inference runs in the server process itself rather than in a worker pool, metrics endpoint off) and one
``<model>/model-settings.json`` per model (``implementation`` = ``mlserver_runtime.OnnxModel`` or
``TorchScriptModel`` by platform, ``parameters.uri`` = the Triton model directory, ``parameters.version``, the KServe
metadata of ``config.pbtxt`` (platform, versions, inputs, outputs) and Triton's config as JSON and as a serialized
gRPC ``ModelConfigResponse``); MLServer's ``start DIR`` command runs in a session of its own with ``recsys_common`` on
its PYTHONPATH (through ``_mlserver_entry``, which installs ``triton_extensions``: the binary tensor extension and the
gRPC ``ModelConfig`` method; its watchdog stops the server if the launching process is killed without stopping
it). This module never imports mlserver: mlserver
and ``tritonclient.grpc`` cannot share a process.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from typing import Dict, Iterator, List, Optional, Sequence

from ..machine import free_port
from .client import ServingError
from .model_config import ModelConfigError, check_model_directory

#: The MLServer runtime serving each Triton platform here (TensorFlow SavedModels are served by Triton only).
RUNTIMES = {"onnxruntime_onnx": "recsys_common.serving.mlserver_runtime.OnnxModel",
            "pytorch_libtorch": "recsys_common.serving.mlserver_runtime.TorchScriptModel"}
RUNTIME = RUNTIMES["onnxruntime_onnx"]


@dataclasses.dataclass
class ServerHandle:
    """A running server: ``http_url`` / ``grpc_url`` as "host:port" (what tritonclient takes), the served model
    names, the server log file and the server's process id (also its process group id)."""
    http_url: str
    grpc_url: str
    models: List[str]
    log_path: str
    pid: int


def servable_models(repo_dir: str, models: Optional[Sequence[str]] = None) -> Dict[str, str]:
    """{model name: model directory} of the models of a Triton repository this server can serve: ONNX
    ("onnxruntime_onnx") and TorchScript ("pytorch_libtorch").

    ``models``: the names to serve (each must be such a model there); None: every one. Each model directory is
    checked with ``check_model_directory``. Raises ``ServingError`` naming the repository and the model."""
    repo_dir = os.path.abspath(repo_dir)
    if not os.path.isdir(repo_dir):
        raise ServingError(f"{repo_dir}: model repository not found")
    found: Dict[str, str] = {}
    other: Dict[str, str] = {}
    names = sorted(n for n in os.listdir(repo_dir)
                   if not n.startswith(".") and os.path.isfile(os.path.join(repo_dir, n, "config.pbtxt")))
    for name in names:
        if models is not None and name not in models:
            continue
        try:
            config = check_model_directory(os.path.join(repo_dir, name))
        except ModelConfigError as e:
            raise ServingError(f"{repo_dir}: model {name!r} cannot be served: {e}") from None
        if config.platform in RUNTIMES:
            found[name] = os.path.join(repo_dir, name)
        else:
            other[name] = config.platform
    for name in models or ():
        if name in other:
            raise ServingError(f"{repo_dir}: model {name!r} has platform {other[name]!r}; MLServer here serves only "
                               f"ONNX and TorchScript models (platforms {sorted(RUNTIMES)}); Triton serves the "
                               f"others")
        if name not in found:
            raise ServingError(f"{repo_dir}: no model {name!r} (models there: {names})")
    if not found:
        raise ServingError(f"{repo_dir}: no ONNX or TorchScript model to serve (models there: {names or 'none'})")
    return found


onnx_models = servable_models   # the earlier name


def write_mlserver_settings(directory: str, model_dirs: Dict[str, str], host: str, http_port: int, grpc_port: int,
                            intra_op_threads: int = 0) -> None:
    """Write MLServer's ``settings.json`` and one ``<model>/model-settings.json`` per model into ``directory``."""
    settings = {
        "debug": False, "host": host, "http_port": http_port, "grpc_port": grpc_port,
        # 0: no inference worker pool (one would fork per-model worker processes and take seconds to start)
        "parallel_workers": 0,
        "metrics_endpoint": None,   # no third port to pick and collide on
        "load_models_at_startup": True,
        "environments_dir": os.path.join(directory, ".envs"),
        "metrics_dir": os.path.join(directory, ".metrics"),
        "gzip_enabled": False,
        # Triton's limit (INT32_MAX) rather than gRPC's 4 MiB default, so large evaluation batches pass as on Triton
        "grpc_max_message_length": 2**31 - 1,
    }
    with open(os.path.join(directory, "settings.json"), "w", encoding="utf-8") as f:
        json.dump(settings, f, indent=1)
    import base64
    from .model_config import (model_config_json, model_config_response_bytes, model_file_name, model_metadata,
                               parse_model_config, version_directories)
    for name, model_dir in model_dirs.items():
        config = parse_model_config(os.path.join(model_dir, "config.pbtxt"))
        file_name = model_file_name(config)
        versions = [v for v in version_directories(model_dir) if os.path.exists(os.path.join(model_dir, str(v),
                                                                                            file_name))]
        metadata = model_metadata(config, versions[-1:])
        os.makedirs(os.path.join(directory, "models", name))
        # platform / versions / inputs / outputs: MLServer answers the KServe-v2 model metadata from these (HTTP
        # ``GET /v2/models/{name}`` and gRPC ``ModelMetadata``), so generic v2 clients find the real tensors;
        # extra.model_config: Triton's config JSON for the runtime's ``/v2/models/{name}/config`` route;
        # extra.model_config_grpc: the serialized gRPC ``ModelConfigResponse`` for ``_mlserver_entry``'s handler
        model_settings = {"name": name, "implementation": RUNTIMES[config.platform],
                          "platform": metadata["platform"], "versions": metadata["versions"],
                          "inputs": metadata["inputs"], "outputs": metadata["outputs"],
                          "parameters": {"uri": model_dir, "version": str(versions[-1]),
                                         "extra": {"intra_op_threads": int(intra_op_threads),
                                                   "max_batch_size": int(config.max_batch_size),
                                                   "inputs": metadata["inputs"], "outputs": metadata["outputs"],
                                                   "model_config": model_config_json(config),
                                                   "model_config_grpc": base64.b64encode(
                                                       model_config_response_bytes(config)).decode("ascii")}}}
        with open(os.path.join(directory, "models", name, "model-settings.json"), "w", encoding="utf-8") as f:
            json.dump(model_settings, f, indent=1)


def _package_root() -> str:
    """The directory holding the ``recsys_common`` package (what the server's PYTHONPATH needs)."""
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _log_tail(path: str, lines: int = 40) -> str:
    try:
        with open(path, "r", encoding="utf-8", errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError:
        return "(no log)"


def _ready(host: str, port: int, model: str) -> bool:
    url = f"http://{host}:{port}/v2/models/{model}/ready"
    try:
        with urllib.request.urlopen(url, timeout=2.0) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def stop_process_group(proc: subprocess.Popen, grace_s: float = 10.0) -> None:
    """SIGTERM the process group of ``proc`` (started with ``start_new_session``), SIGKILL it after ``grace_s``."""
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            break
        try:
            proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            continue
        # the leader is gone; a child it left behind in the group still gets the signal next round
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        break
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5.0)


@contextlib.contextmanager
def serve_repository(repo_dir: str, models: Optional[Sequence[str]] = None, *, http_port: Optional[int] = None,
                     grpc_port: Optional[int] = None, startup_timeout_s: float = 120.0, log_path: Optional[str] = None,
                     host: str = "127.0.0.1", intra_op_threads: int = 0,
                     stop_timeout_s: float = 10.0) -> Iterator[ServerHandle]:
    """Serve the ONNX and TorchScript models of a Triton repository with MLServer; yield a ``ServerHandle`` once every
    model is ready.

    Args:
        repo_dir: the Triton model repository.
        models: model names to serve (default: every ONNX and TorchScript model).
        http_port, grpc_port: default: free ports picked now.
        startup_timeout_s: limit for the server to start and load every model.
        log_path: the server's stdout+stderr (default: a file in a temporary directory, removed on exit).
        host: the address to bind (loopback by default; the client connects to 127.0.0.1 when it is 0.0.0.0).
        intra_op_threads: onnxruntime intra-op threads per model (0: onnxruntime's default).
        stop_timeout_s: SIGTERM grace before SIGKILL when stopping.
    Raises ``ServingError`` (with the end of the server log) if the server exits or misses the deadline; the whole
    process group is stopped on exit from the block, also when it raises.
    """
    model_dirs = servable_models(repo_dir, models)
    http_port = http_port or free_port()
    grpc_port = grpc_port or free_port()
    while grpc_port == http_port:
        grpc_port = free_port()
    client_host = "127.0.0.1" if host in ("0.0.0.0", "") else host
    with tempfile.TemporaryDirectory(prefix="recsys_mlserver_") as workdir:
        write_mlserver_settings(workdir, model_dirs, host, http_port, grpc_port, intra_op_threads)
        log_path = os.path.abspath(log_path) if log_path else os.path.join(workdir, "mlserver.log")
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([_package_root()] + [p for p in [env.get("PYTHONPATH")] if p])
        env.setdefault("OMP_NUM_THREADS", str(max(1, intra_op_threads)))
        # mlserver's own ``start`` command, plus a watchdog that stops the server if this process dies first
        command = [sys.executable, "-m", "recsys_common.serving._mlserver_entry", workdir, str(os.getpid())]
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(command, cwd=workdir, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        try:
            deadline = time.monotonic() + startup_timeout_s
            waiting = list(model_dirs)
            while waiting:
                if proc.poll() is not None:
                    raise ServingError(f"MLServer serving {repo_dir} exited with status {proc.returncode} before "
                                       f"model(s) {waiting} were ready; log {log_path}, last lines:\n"
                                       f"{_log_tail(log_path)}")
                if time.monotonic() > deadline:
                    raise ServingError(f"MLServer serving {repo_dir}: model(s) {waiting} not ready after "
                                       f"{startup_timeout_s:g} s; log {log_path}, last lines:\n{_log_tail(log_path)}")
                waiting = [m for m in waiting if not _ready(client_host, http_port, m)]
                if waiting:
                    time.sleep(0.1)
            yield ServerHandle(http_url=f"{client_host}:{http_port}", grpc_url=f"{client_host}:{grpc_port}",
                               models=list(model_dirs), log_path=log_path, pid=proc.pid)
        finally:
            stop_process_group(proc, stop_timeout_s)


# ---------------------------------------------------------------------------------------------------------- CLI
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m recsys_common.serving.mlserver_launcher",
        description="Serve the ONNX and TorchScript models of a Triton model repository with MLServer (KServe-v2 HTTP "
                    "and gRPC with Triton's model-config and binary-tensor extensions, "
                    "the protocol Triton speaks) until Ctrl-C. For machines without Triton.")
    parser.add_argument("--model-repository", required=True, help="the Triton model repository directory")
    parser.add_argument("--models", nargs="+", default=None, help="model names to serve (default: every ONNX and TorchScript model)")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only)")
    parser.add_argument("--http-port", type=int, default=8000, help="HTTP port (Triton's default 8000)")
    parser.add_argument("--grpc-port", type=int, default=8001, help="gRPC port (Triton's default 8001)")
    parser.add_argument("--startup-timeout", type=float, default=120.0, help="seconds to wait for every model")
    parser.add_argument("--intra-op-threads", type=int, default=0, help="onnxruntime threads per model (0: default)")
    parser.add_argument("--log-path", default=None, help="server log file (default: a temporary file)")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> None:
    """Serve until Ctrl-C or SIGTERM; a server that does not come up raises ``ServingError``."""
    args = build_parser().parse_args(argv)
    with serve_repository(args.model_repository, args.models, http_port=args.http_port,
                          grpc_port=args.grpc_port, startup_timeout_s=args.startup_timeout,
                          log_path=args.log_path, host=args.host,
                          intra_op_threads=args.intra_op_threads) as server:
        print(f"serving {', '.join(server.models)}: HTTP {server.http_url}, gRPC {server.grpc_url} "
              f"(server pid {server.pid}, log {server.log_path}); Ctrl-C stops", flush=True)
        stop = []
        # SIGTERM stops like Ctrl-C, so that the server group is always taken down with us
        signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
        try:
            while not stop:
                time.sleep(0.2)
        except KeyboardInterrupt:
            pass
    print("server stopped", flush=True)


if __name__ == "__main__":
    from recsys_common.cli import run_main
    run_main(main, failures=(ServingError,))
