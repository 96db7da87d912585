"""Checkpoints move between world sizes, through the real entry points under ``horovodrun --gloo``.

A checkpoint written by ``horovodrun -np 2 python dlrm.py`` (row-sliced tables: every rank writes the rows of its
shards into the shared whole-table files) is evaluated by one process with ``--mode eval
--restore_checkpoint_path``, and one written by one ``dcnv2.py`` process is evaluated on two ranks (table-wise):
the evaluation gives the training run's final AUC and loss. (Exact resume after a SIGKILL: test_checkpoint_main.py;
the format on every placement: test_checkpoint_format.py.)

Measured: identical AUC (approximate and exact) both ways; the BCE differed by 1e-16 (float64 summation order of
the gathered predictions).
"""
import os
import sys

import pytest

from conftest import RECIPE_DIR, subprocess_env
from recsys_common.logger import read_log
from recsys_testing import horovod_env, horovodrun_command, run_process_group
from dlrm_dcnv2.checkpointing import list_checkpoints, read_state

TIMEOUT_S = 180
COMMON = ["--batch_size", "256", "--valid_batch_size", "1024", "--embedding_dim", "8", "--bottom_mlp_dims", "16,8",
          "--top_mlp_dims", "16,1", "--warmup_steps", "4", "--decay_start_step", "100", "--decay_steps", "100",
          "--max_steps", "20", "--seed", "3", "--cpu", "--print_freq", "10"]
MODELS = {"dlrm": ["--learning_rate", "0.5"],
          "dcnv2": ["--learning_rate", "0.01", "--num_cross_layers", "1", "--cross_layer_projection_dim", "4"]}


def command(model, ranks, dataset, *args):
    cmd = [sys.executable, os.path.join(RECIPE_DIR, f"{model}.py"), "--dataset_path", dataset, *COMMON,
           *MODELS[model], *map(str, args)]
    return horovodrun_command(ranks, cmd) if ranks > 1 else cmd


def run(cmd):
    return run_process_group(cmd, cwd=RECIPE_DIR, env=horovod_env(subprocess_env(), 60), timeout=TIMEOUT_S)


def summary(log_path):
    return [r["data"] for r in read_log(log_path) if r["step"] == []][-1]


@pytest.mark.parametrize("model,saved_ranks,restored_ranks,placement", [
    ("dlrm", 2, 1, ["--row_slice_threshold", "1000"]),
    ("dcnv2", 1, 2, []),
])
def test_checkpoint_restores_on_another_world_size(small_dataset, tmp_path, model, saved_ranks, restored_ranks,
                                                   placement):
    ckpt = str(tmp_path / "ckpt")
    run(command(model, saved_ranks, small_dataset, *placement, "--save_checkpoint_path", ckpt,
                "--log_path", tmp_path / "train.json"))
    [(step, path)] = list_checkpoints(ckpt)
    assert step == 20 and read_state(path)["world_size"] == saved_ranks
    output = run(command(model, restored_ranks, small_dataset, *placement, "--mode", "eval",
                         "--restore_checkpoint_path", ckpt, "--log_path", tmp_path / "eval.json"))
    assert f"saved by {saved_ranks} rank(s), restored on {restored_ranks}" in output
    trained, evaluated = summary(tmp_path / "train.json"), summary(tmp_path / "eval.json")
    assert evaluated["mode"] == "eval" and trained["world_size"] == saved_ranks
    assert evaluated["auc_exact"] == pytest.approx(trained["auc_exact"], abs=1e-9)
    assert evaluated["auc"] == pytest.approx(trained["auc"], abs=1e-9)
    assert evaluated["loss"] == pytest.approx(trained["loss"], abs=1e-9)
