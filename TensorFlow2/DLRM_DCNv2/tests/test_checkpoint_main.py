"""Exact resume through the real entry points: ``dlrm.py`` (SGD) and ``dcnv2.py`` (Adam + LazyAdam).

Each model runs three times on the tiny split-binary dataset: uninterrupted; with periodic checkpoints, SIGKILLed
(its process group) once a checkpoint exists; and resumed with the same command plus
``--restore_checkpoint_path <the checkpoint directory>``. The resumed run must end exactly where the uninterrupted
one did: the per-step training losses after the checkpoint (``--print_freq 1`` log), the final evaluation, every
table, optimizer slot and dense weight of the final checkpoint, bit for bit. The run crosses an epoch boundary
after the checkpoint, so the data position (epoch, batch within the epoch) is restored too.
"""
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

from conftest import RECIPE_DIR, subprocess_env
from recsys_common.logger import read_log as read_dllogger
from recsys_testing import run_process_group
from dlrm_dcnv2.checkpointing import list_checkpoints, read_state, read_table

TIMEOUT_S = 180
# 8192 training rows / 64 = 128 steps per epoch; 170 steps cross into epoch 1; a checkpoint every 25 steps.
STEPS, EVERY = 170, 25
COMMON = ["--batch_size", "64", "--valid_batch_size", "1024", "--embedding_dim", "8", "--top_mlp_dims", "16,1",
          "--bottom_mlp_dims", "16,8", "--epochs", "2", "--max_steps", str(STEPS), "--print_freq", "1",
          "--seed", "3", "--cpu", "--warmup_steps", "10", "--decay_start_step", "100", "--decay_steps", "200",
          "--evals_per_epoch", "1"]
MODELS = {
    "dlrm": ("dlrm.py", ["--learning_rate", "0.3"]),
    "dcnv2": ("dcnv2.py", ["--learning_rate", "0.01", "--num_cross_layers", "2", "--cross_layer_projection_dim", "4"]),
}


def command(model, dataset, out, *extra):
    script, flags = MODELS[model]
    return [sys.executable, os.path.join(RECIPE_DIR, script), "--dataset_path", dataset, *COMMON, *flags,
            "--log_path", os.path.join(out, "log.json"), *extra]


def run(cmd):
    return run_process_group(cmd, cwd=RECIPE_DIR, env=subprocess_env(), timeout=TIMEOUT_S)


def run_and_kill(cmd, checkpoint_dir, log_path):
    with open(log_path, "w+") as log:
        proc = subprocess.Popen(cmd, cwd=RECIPE_DIR, env=subprocess_env(), stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        deadline = time.monotonic() + TIMEOUT_S
        try:
            while not list_checkpoints(checkpoint_dir):
                if proc.poll() is not None or time.monotonic() > deadline:
                    log.seek(0)
                    pytest.fail(f"no checkpoint before the run ended or timed out:\n{log.read()[-4000:]}")
                time.sleep(0.002)
            os.killpg(proc.pid, signal.SIGKILL)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            returncode = proc.wait(timeout=60)
        log.seek(0)
        assert returncode == -signal.SIGKILL, f"exit {returncode}, not killed:\n{log.read()[-4000:]}"


def read_log(path):
    """``({step: training loss}, [evaluation records], summary)`` from a DLLogger JSON log."""
    losses, evals, summary = {}, [], None
    for record in read_dllogger(path):  # LOG records (METADATA lines carry no step)
        step, data = record["step"], record["data"]
        if isinstance(step, list) and len(step) == 2:
            if "loss" in data:
                losses[step[1]] = data["loss"]
            if "eval_auc" in data:
                evals.append((step[1], {k: v for k, v in data.items() if "throughput" not in k}))
        elif step == []:
            summary = data
    return losses, evals, summary


def dense_tensors(checkpoint):
    reader = tf.train.load_checkpoint(os.path.join(checkpoint, "dense", "dense"))
    return {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()
            if name != "_CHECKPOINTABLE_OBJECT_GRAPH"}


@pytest.mark.parametrize("model", sorted(MODELS))
def test_sigkill_then_resume_equals_uninterrupted(small_dataset, tmp_path, model):
    straight, killed, resumed = (str(tmp_path / n) for n in ("straight", "killed", "resumed"))
    for d in (straight, killed, resumed):
        os.makedirs(d)
    run(command(model, small_dataset, straight, "--save_checkpoint_path", os.path.join(straight, "ckpt")))
    ckpt = os.path.join(killed, "ckpt")
    periodic = ["--save_checkpoint_path", ckpt, "--checkpoint_every_steps", str(EVERY)]
    run_and_kill(command(model, small_dataset, killed, *periodic), ckpt, os.path.join(killed, "out.txt"))
    saved = [s for s, _ in list_checkpoints(ckpt)]
    assert saved and saved[-1] % EVERY == 0 and saved[-1] < STEPS, saved
    state = read_state(list_checkpoints(ckpt)[-1][1])
    assert (state["epoch"], state["batch_in_epoch"]) == divmod(saved[-1], 128)
    output = run(command(model, small_dataset, resumed, *periodic, "--restore_checkpoint_path", ckpt))
    assert f"at step {saved[-1]}" in output, output[-3000:]

    a_losses, a_evals, a_summary = read_log(os.path.join(straight, "log.json"))
    b_losses, b_evals, b_summary = read_log(os.path.join(resumed, "log.json"))
    assert sorted(b_losses) == list(range(saved[-1] + 1, STEPS + 1))
    assert {s: a_losses[s] for s in b_losses} == b_losses  # float32 values logged exactly: bitwise equal
    assert a_evals[-1] == b_evals[-1] and a_evals[-1][0] == STEPS
    assert a_summary["auc_exact"] == b_summary["auc_exact"] and a_summary["train_loss"] == b_summary["train_loss"]

    final_a, final_b = list_checkpoints(os.path.join(straight, "ckpt"))[-1], list_checkpoints(ckpt)[-1]
    assert final_a[0] == final_b[0] == STEPS
    slots = read_state(final_b[1])["embedding_slots"]
    assert slots == (["m", "v"] if model == "dcnv2" else [])
    assert read_state(final_b[1])["optimizer_iterations"] == read_state(final_a[1])["optimizer_iterations"]
    for t in range(8):
        for slot in [None] + slots:
            np.testing.assert_array_equal(read_table(final_b[1], t, slot), read_table(final_a[1], t, slot))
    dense_a, dense_b = dense_tensors(final_a[1]), dense_tensors(final_b[1])
    assert sorted(dense_a) == sorted(dense_b)
    if model == "dcnv2":  # Adam's slots of the dense weights are in the dense checkpoint too
        assert any("OPTIMIZER_SLOT" in name for name in dense_a), sorted(dense_a)[:10]
    for name in dense_a:
        np.testing.assert_array_equal(dense_b[name], dense_a[name], err_msg=name)


def test_mismatch_and_foreign_checkpoints_are_refused(small_dataset, tmp_path):
    """In-process ``main``: a checkpoint of another model is refused naming the flag; a save directory holding
    another run's checkpoints is refused unless resumed from it or ``--overwrite``."""
    from dlrm_dcnv2.train import main
    from dlrm_dcnv2.checkpointing import CheckpointError
    ckpt = str(tmp_path / "ckpt")
    args = ["--dataset_path", small_dataset, *COMMON, *MODELS["dlrm"][1], "--max_steps", "3",
            "--log_path", str(tmp_path / "log.json"), "--overwrite"]
    main(args + ["--save_checkpoint_path", ckpt])
    assert [s for s, _ in list_checkpoints(ckpt)] == [3]
    with pytest.raises(CheckpointError, match=r"top_mlp_dims: checkpoint \[16, 1\], flags \[32, 1\].*--top_mlp_dims"):
        main(args + ["--top_mlp_dims", "32,1", "--restore_checkpoint_path", ckpt])
    with pytest.raises(CheckpointError, match=r"already holds checkpoints of another run.*--overwrite"):
        main([a for a in args if a != "--overwrite"] + ["--save_checkpoint_path", ckpt])
    result = main(args + ["--max_steps", "5", "--save_checkpoint_path", ckpt, "--restore_checkpoint_path", ckpt])
    assert result["global_step"] == 5 and [s for s, _ in list_checkpoints(ckpt)] == [3, 5]
    main(args + ["--max_steps", "2", "--save_checkpoint_path", ckpt])  # --overwrite: a new run replaces them
    assert [s for s, _ in list_checkpoints(ckpt)] == [2]
