"""Checkpoints move between world sizes (``tests/checkpoint_worker.py`` under ``horovodrun --gloo``).

A checkpoint written by ``horovodrun -np 2`` (every rank writing the rows of its row-sliced shards into the shared
whole-table files) restores on one rank, and one written by one rank restores on two (table-wise), with the same
evaluation AUC, predictions and dense weights. (Exact resume after a SIGKILL: test_checkpoint_main.py.)
"""
import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

from conftest import RECIPE_DIR, subprocess_env
from dlrm_dcnv2.utils.checkpointing import read_table

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
VENV_BIN = os.path.dirname(sys.executable)
WORKER = os.path.join(TESTS_DIR, "checkpoint_worker.py")
STEPS = 40
TIMEOUT_S = 120


def env():
    e = subprocess_env()
    e.update(GLOO_SOCKET_IFNAME="lo", HOROVOD_GLOO_TIMEOUT_SECONDS="60", OMP_NUM_THREADS="1")
    e["PATH"] = os.pathsep.join([VENV_BIN, e.get("PATH", "")])
    return e


def worker(out, *args, ranks=1):
    cmd = [sys.executable, WORKER, str(out), "--steps", str(STEPS), *map(str, args)]
    if ranks > 1:
        cmd = [os.path.join(VENV_BIN, "horovodrun"), "-np", str(ranks), "-H", f"localhost:{ranks}", "--gloo",
               "--network-interface", "lo"] + cmd
    return cmd


def run(cmd):
    """Run ``cmd`` in a session of its own; kill the whole group on timeout; return its output."""
    proc = subprocess.Popen(cmd, cwd=RECIPE_DIR, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        pytest.fail(f"{' '.join(cmd)} did not finish in {TIMEOUT_S} s (process group killed)\n{output[-5000:]}")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, f"{' '.join(cmd)} exited {proc.returncode}\n{output[-6000:]}"
    return output


def result(out, rank=0):
    with open(os.path.join(out, f"rank{rank}.json")) as f:
        return json.load(f)


@pytest.mark.parametrize("saved_ranks,restored_ranks,sliced", [(2, 1, True), (1, 2, False)])
def test_checkpoint_moves_between_world_sizes(tmp_path, saved_ranks, restored_ranks, sliced):
    """Train and save on ``saved_ranks``; restore on ``restored_ranks`` and evaluate: same AUC and predictions."""
    slicing = ["--row_slice_threshold", 100] if sliced else []
    trained, restored = tmp_path / "trained", tmp_path / "restored"
    run(worker(trained, "--save", trained / "ckpt", *slicing, ranks=saved_ranks))
    # --steps equals the checkpoint's step: the restored run only evaluates.
    run(worker(restored, "--restore", trained / "ckpt", "--save", restored / "ckpt", *slicing, ranks=restored_ranks))
    a, b = result(trained), result(restored)
    assert b["start"] == STEPS and b["losses"] == {}
    # Same weights; the logits may differ by float32 summation order (row slices are summed); measured: 0.0.
    np.testing.assert_allclose(b["scores"], a["scores"], rtol=0, atol=1e-6)
    assert abs(a["auc"] - b["auc"]) < 1e-9, (a["auc"], b["auc"])
    assert a["dense"] == b["dense"]
    # Saved again by the other world size (its own shards, its own placement): the same whole tables, bit for bit.
    for t in range(4):
        np.testing.assert_array_equal(read_table(str(restored / "ckpt"), t), read_table(str(trained / "ckpt"), t))
