"""Helpers of the environment and launcher smoke tests (ci/tests): paths, ports, launching workers."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from recsys_testing import free_port  # noqa: F401  (the tests import it from here)

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = Path(__file__).resolve().parent / "scripts"
VENV_BIN = Path(sys.executable).parent


def child_env(**extra) -> dict:
    """Environment for launched workers: loopback only, one thread each (2 ranks on 2 cores)."""
    env = dict(os.environ)
    env.update(
        TF_USE_LEGACY_KERAS="1",
        TF_CPP_MIN_LOG_LEVEL="2",
        OMP_NUM_THREADS="1",
        GLOO_SOCKET_IFNAME="lo",
        MASTER_ADDR="127.0.0.1",
        PYTHONPATH=os.pathsep.join(p for p in (str(SCRIPTS), env.get("PYTHONPATH", "")) if p),
    )
    # Launchers (horovodrun, torchrun) and workers must come from the same venv.
    env["PATH"] = os.pathsep.join([str(VENV_BIN), env.get("PATH", "")])
    env.update({k: str(v) for k, v in extra.items()})
    return env


def run_launcher(cmd, timeout, env=None, cwd=None):
    """Run a launcher command; on failure, show its output in the assertion message."""
    proc = subprocess.run(cmd, cwd=cwd, env=env or child_env(), capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, (
        f"{' '.join(map(str, cmd))} exited {proc.returncode}\n--- stdout ---\n{proc.stdout[-6000:]}"
        f"\n--- stderr ---\n{proc.stderr[-6000:]}")
    return proc


def read_rank_results(out_dir: Path, world_size: int) -> list:
    """Each worker writes rank<r>.json; return them ordered by rank (all must exist)."""
    results = []
    for rank in range(world_size):
        path = out_dir / f"rank{rank}.json"
        assert path.is_file(), f"rank {rank} wrote no result ({path}); files: {sorted(os.listdir(out_dir))}"
        results.append(json.loads(path.read_text()))
    return results


def venv_tool(name: str) -> str:
    """Path of a console script of this venv (horovodrun, torchrun, python)."""
    path = VENV_BIN / name
    if path.exists():
        return str(path)
    found = shutil.which(name)
    assert found, f"{name} is not installed in {VENV_BIN}: run make setup"
    return found
