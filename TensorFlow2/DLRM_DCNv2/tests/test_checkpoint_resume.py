"""Training that survives a SIGKILL, and checkpoints that move between world sizes (``tests/checkpoint_worker.py``).

* kill: a run with periodic checkpoints is SIGKILLed (its whole process group) once a checkpoint exists; the same
  command resumed from the checkpoint directory ends with the losses, weights and AUC of an uninterrupted run,
  bit for bit (SGD, and Adam with the recipe's LazyAdam for the tables);
* a checkpoint written by ``horovodrun -np 2`` (every rank writing its shards) restores on one rank, and one written
  by one rank restores on two, with the same evaluation AUC and predictions.
"""
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from conftest import RECIPE_DIR, subprocess_env
from dlrm_dcnv2.utils.checkpointing import list_checkpoints, read_table

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
VENV_BIN = os.path.dirname(sys.executable)
WORKER = os.path.join(TESTS_DIR, "checkpoint_worker.py")
STEPS, EVERY = 40, 10
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


def run_and_kill(cmd, checkpoint_dir, log_path):
    """Start ``cmd``; SIGKILL its process group as soon as a periodic checkpoint is complete."""
    with open(log_path, "w+") as log:
        proc = subprocess.Popen(cmd, cwd=RECIPE_DIR, env=env(), stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        deadline = time.monotonic() + TIMEOUT_S
        try:
            while not list_checkpoints(checkpoint_dir):
                assert proc.poll() is None, "the run ended before its first checkpoint:\n" + _tail(log)
                assert time.monotonic() < deadline, f"no checkpoint after {TIMEOUT_S} s:\n" + _tail(log)
                time.sleep(0.005)
            os.killpg(proc.pid, signal.SIGKILL)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            returncode = proc.wait(timeout=60)
        assert returncode == -signal.SIGKILL, f"exit {returncode}, not killed:\n" + _tail(log)


def _tail(log):
    log.flush()
    log.seek(0)
    return log.read()[-5000:]


def result(out, rank=0):
    with open(os.path.join(out, f"rank{rank}.json")) as f:
        return json.load(f)


def adam_available():
    try:
        from dlrm_dcnv2.nn.optimizers import create_optimizers  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.mark.parametrize("optimizer", ["sgd", pytest.param("adam", marks=pytest.mark.skipif(
    not adam_available(), reason="dlrm_dcnv2.nn.optimizers (LazyAdam) not written yet"))])
def test_sigkill_then_resume_equals_uninterrupted(tmp_path, optimizer):
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    run(worker(straight, "--optimizer", optimizer, "--save", straight / "ckpt"))
    ckpt = killed / "ckpt"
    killed.mkdir()
    kill_cmd = worker(killed, "--optimizer", optimizer, "--every", EVERY, "--save", ckpt, "--step_delay", 0.05)
    run_and_kill(kill_cmd, str(ckpt), str(killed / "killed.log"))
    saved = [step for step, _ in list_checkpoints(str(ckpt))]
    assert saved and saved[-1] < STEPS and saved[-1] % EVERY == 0, saved
    assert not (killed / "rank0.json").exists()  # it really died mid-run
    # The resumed run: the same command plus --restore_checkpoint_path = the checkpoint directory.
    run(kill_cmd[:-2] + ["--restore", str(ckpt)])

    a, b = result(straight), result(killed)
    assert b["start"] == saved[-1]
    assert sorted(map(int, b["losses"])) == list(range(saved[-1] + 1, STEPS + 1))
    assert {k: a["losses"][k] for k in b["losses"]} == b["losses"]  # bitwise (float.hex)
    assert a["dense"] == b["dense"] and a["auc"] == b["auc"] and a["scores"] == b["scores"]
    final = [s for s, _ in list_checkpoints(str(ckpt))]
    assert final[-1] == STEPS and len(final) <= 2  # --keep 2
    for t in range(4):
        np.testing.assert_array_equal(read_table(str(ckpt), t), read_table(str(straight / "ckpt"), t))
        if optimizer == "adam":
            for slot in ("m", "v"):
                np.testing.assert_array_equal(read_table(str(ckpt), t, slot),
                                              read_table(str(straight / "ckpt"), t, slot))


@pytest.mark.parametrize("saved_ranks,restored_ranks,sliced", [(2, 1, False), (1, 2, False), (2, 1, True)])
def test_checkpoint_moves_between_world_sizes(tmp_path, saved_ranks, restored_ranks, sliced):
    """Train and save on ``saved_ranks``; restore on ``restored_ranks`` and evaluate: same AUC and predictions."""
    slicing = ["--row_slice_threshold", 100] if sliced else []
    trained, restored = tmp_path / "trained", tmp_path / "restored"
    run(worker(trained, "--save", trained / "ckpt", *slicing, ranks=saved_ranks))
    # --steps equals the checkpoint's step: the restored run only evaluates.
    run(worker(restored, "--restore", trained / "ckpt", *slicing, ranks=restored_ranks))
    a, b = result(trained), result(restored)
    assert b["start"] == STEPS and b["losses"] == {}
    # Same weights; the logits differ at most by float32 summation order (row slices are summed): measured 0.
    np.testing.assert_allclose(b["scores"], a["scores"], rtol=0, atol=1e-6)
    assert abs(a["auc"] - b["auc"]) < 1e-9, (a["auc"], b["auc"])
    assert a["dense"] == b["dense"]
