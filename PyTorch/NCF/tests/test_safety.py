"""A diverged model never looks good, and nothing a user wrote is overwritten.

NaN scores count as misses; a NaN/inf training loss stops the run at its step with the last good checkpoints kept;
``-k`` at or above the candidates per user is refused; checkpoint files ncf.py did not write are never replaced;
``--resume`` continues the earlier run's log.
"""
import os
import subprocess
import sys
from contextlib import nullcontext

import numpy as np
import pytest
import torch
from torch import nn

from neumf import checkpointing as ncf_checkpointing, cli as ncf_cli, evaluation as ncf_evaluation, train as ncf_train
import neumf
from conftest import NCF_DIR
from neumf.data import EvalSet, NCFData, load_dataset
from recsys_common.logger import read_log
from recsys_testing import free_port

SMALL = ["-b", "2048", "-n", "1", "-l", "0.01", "-b1", "0.9", "-b2", "0.999", "-f", "8", "--layers", "16", "8",
         "--valid_batch_size", "5000", "--seed", "3"]


def run(tiny_data, tmp_path, *extra, log="log.json"):
    return ncf_train.main(["--data", tiny_data, *SMALL, "--log_path", str(tmp_path / log), *extra])


class Lookup(nn.Module):
    """Scores from a fixed [users, items] table."""

    def __init__(self, table):
        super().__init__()
        self.table = torch.as_tensor(table, dtype=torch.float32)

    def forward(self, users, items):
        return self.table[users, items]


def test_nan_scores_count_as_misses():
    nan = float("nan")
    # 3 users, 4 candidates each (positive first): items 0..3 for every user
    table = [[nan, 0.1, 0.2, 0.3],   # NaN positive: used to compare as "nothing beats it" -> a hit with NDCG 1
             [0.5, nan, 0.9, 0.1],   # a NaN negative: used to be ignored -> rank 1, a hit at K=2
             [0.9, 0.1, 0.2, 0.3]]   # a clean hit at rank 0
    data = NCFData(np.zeros(1, np.int64), np.zeros(1, np.int64), np.repeat(np.arange(3), 4), np.tile(np.arange(4), 3),
                   np.tile(np.array([1, 0, 0, 0], np.float32), 3), 3, 4, 4)
    metrics = ncf_evaluation.evaluate(Lookup(table), EvalSet(data, 0, 1, torch.device("cpu")), 2, 100, nullcontext)
    assert metrics["hr"] == pytest.approx(1 / 3) and metrics["ndcg"] == pytest.approx(1 / 3)
    assert metrics["nan_users"] == 2
    everything_nan = ncf_evaluation.evaluate(Lookup(np.full((3, 4), nan)), EvalSet(data, 0, 1, torch.device("cpu")), 2, 100,
                                  nullcontext)
    assert everything_nan["hr"] == 0 and everything_nan["ndcg"] == 0 and everything_nan["nan_users"] == 3


def test_topk_at_or_above_the_candidates_per_user_is_refused(tiny_data, tmp_path):
    with pytest.raises(ncf_cli.ConfigurationError, match="-k/--topk 101 must be below the number of candidates per user"):
        run(tiny_data, tmp_path, "-e", "1", "-k", "101")  # tiny_data: 1 positive + 100 negatives per user
    assert not (tmp_path / "log.json").exists()  # refused before anything was written
    data = load_dataset(tiny_data)
    with pytest.raises(ncf_cli.ConfigurationError, match="every user counts as a hit"):
        ncf_evaluation.evaluate(neumf.GMF(data.num_users, data.num_items, 4), EvalSet(data, 0, 1, torch.device("cpu")), 200,
                     5000, nullcontext)


def test_a_diverging_loss_stops_at_its_step_and_keeps_the_last_good_checkpoint(tiny_data, tmp_path, monkeypatch):
    rows = len(load_dataset(tiny_data).train_users) * 2  # -n 1
    steps = -(-rows // 2048)
    forward, calls = neumf.NeuMF.forward, []

    def diverges_in_epoch_1_step_3(self, users, items):
        out = forward(self, users, items)
        if self.training:
            calls.append(1)
            if len(calls) > steps + 3:
                return out * float("nan")
        return out
    monkeypatch.setattr(neumf.NeuMF, "forward", diverges_in_epoch_1_step_3)
    ckpt = tmp_path / "ckpt"
    with pytest.raises(ncf_train.TrainingDivergedError) as error:
        # -t 0.9: a NaN model used to score HR 1.0, be saved as best and stop as "target reached"
        run(tiny_data, tmp_path, "-e", "4", "-t", "0.9", "--checkpoint_dir", str(ckpt))
    err = str(error.value)
    assert f"epoch 1, step 3 (of {steps}): the training loss is nan; stopped before applying it" in err
    assert "last.pth (after epoch 0)" in err and "model.pth (best, epoch 0" in err
    for name in ("model.pth", "last.pth"):
        state = torch.load(ckpt / name, weights_only=True)
        assert state["epoch"] == 0 and state["time_to_target"] is None
        assert all(torch.isfinite(t).all() for t in state["model"].values()), name
    records = read_log(str(tmp_path / "log.json"))
    assert [r["step"] for r in records] == ["PARAMETER", [0], [1]]  # no summary claiming a result
    assert "the training loss is nan" in records[-1]["data"]["error"]


def test_checkpoint_files_ncf_did_not_write_are_never_replaced(tiny_data, tmp_path):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    data = load_dataset(tiny_data)
    foreign = neumf.NeuMF(data.num_users, data.num_items, 8, [16, 8], 0.5).state_dict()
    torch.save(foreign, ckpt / "model.pth")  # e.g. NVIDIA's bare model.pth
    before = (ckpt / "model.pth").read_bytes()
    with pytest.raises(ncf_checkpointing.CheckpointError, match="model.pth: exists and was not written by ncf.py"):
        run(tiny_data, tmp_path, "-e", "1", "--checkpoint_dir", str(ckpt))
    assert (ckpt / "model.pth").read_bytes() == before and os.listdir(ckpt) == ["model.pth"]
    # its weights can still be the start of a run, into another directory
    run(tiny_data, tmp_path, "-e", "1", "--load_checkpoint_path", str(ckpt / "model.pth"),
        "--checkpoint_dir", str(tmp_path / "new"), log="new.json")
    # checkpoints of an earlier ncf.py run are this tool's own: a new run replaces them
    again = run(tiny_data, tmp_path, "-e", "1", "--checkpoint_dir", str(tmp_path / "new"), log="again.json")
    assert torch.load(tmp_path / "new" / "last.pth", weights_only=True)["best_hr"] == again["best_hr@10"]


def test_resume_appends_to_the_earlier_log(tiny_data, tmp_path):
    ckpt = str(tmp_path / "ckpt")
    run(tiny_data, tmp_path, "-e", "2", "--checkpoint_dir", ckpt)
    run(tiny_data, tmp_path, "-e", "3", "--checkpoint_dir", ckpt, "--resume")
    steps = [r["step"] for r in read_log(str(tmp_path / "log.json"))]
    assert steps == ["PARAMETER", [0], [1], [], "PARAMETER", [2], []]


@pytest.mark.slow
def test_a_loss_that_diverges_on_one_rank_stops_every_rank_at_that_step(tiny_data, tmp_path, env_with_pythonpath):
    from neumf.data import shard_bounds
    positives = shard_bounds(len(load_dataset(tiny_data).train_users), 0, 2)[1]
    steps = -(-positives * 2 // 1024)  # -n 1; -b 2048 over 2 ranks
    env = dict(env_with_pythonpath, NAN_AFTER=str(steps + 3))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_addr=127.0.0.1",
           f"--master_port={free_port()}", os.path.join(NCF_DIR, "tests", "ddp_nan_worker.py"), str(tmp_path),
           "--data", tiny_data, *SMALL, "-e", "3", "--log_path", str(tmp_path / "log.json")]
    proc = subprocess.run(cmd, env=env, cwd=NCF_DIR, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0  # a diverged run is a failed job
    for rank in (0, 1):
        code, threads, message = (tmp_path / f"rank{rank}.txt").read_text().split("\n", 2)
        assert code == "2", proc.stderr[-3000:]
        assert threads == "[]", f"rank {rank}: the error exit left the process group up: {threads}"
        assert f"epoch 1, step 3 (of {steps}): the training loss is nan on at least one rank" in message
