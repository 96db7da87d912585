"""Multi-process failures on 2 CPU processes (gloo): a NaN loss on one rank stops every rank at the same step, and a
checkpoint directory the processes do not share is refused before the first step. Each launcher must end as the
test expects, never hang: every launch has a timeout that fails the test by name.

Kept apart from ``test_distributed.py`` (training equality) so that each file's torchrun launches stay short.
"""
import os

import pytest

from conftest import RECIPE_DIR, subprocess_env, train_args
from dlrm.model import torchrec_available
from recsys_testing import run_torchrun_nodes

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not torchrec_available(), reason="torchrec/fbgemm not installed")]


def test_a_nan_loss_on_one_rank_stops_every_rank_at_that_step(tmp_path):
    """The training loop's NaN guard agrees across ranks (as NCF's): only rank 1's loss is NaN, at step 2, and both
    ranks stop there (CPU: checked every step) or at the next check (CUDA way: step 3), naming the first bad step."""
    import json
    run_torchrun_nodes([os.path.join("tests", "nonfinite_worker.py"), str(tmp_path)], nnodes=1, nproc_per_node=2,
                       rendezvous="static", cwd=RECIPE_DIR, env=subprocess_env(), timeout=120)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    for rank, result in enumerate(ranks):
        assert result["per_step"]["stopped_at"] == 2, (rank, result)
        assert result["deferred"]["stopped_at"] == 3, (rank, result)
        assert "at step 2 on 1 rank(s)" in result["per_step"]["message"], result
        assert "became NaN or infinite at step 2 on at least one rank" in result["deferred"]["message"], result
    assert "training loss became nan at step 2" in ranks[1]["per_step"]["message"]


def test_a_checkpoint_directory_the_processes_do_not_share_is_refused_before_training(small_dataset, tmp_path):
    """Every process writes its shards into rank 0's checkpoint directory, so a multi-node job needs it on a shared
    file system. Two processes given different directories (as node-local disks would be) both stop before the
    first step, naming the flag, instead of each writing a partial checkpoint."""
    import sys
    from recsys_testing import free_port, run_process_group
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_addr=127.0.0.1",
               f"--master_port={free_port()}", os.path.join("tests", "per_rank_main.py"),
               *train_args(small_dataset, tmp_path / "log.json", "--max_steps", "4", "--save_checkpoint_path",
                           str(tmp_path / "node{rank}" / "ckpt"))]
    status, output = run_process_group(command, cwd=RECIPE_DIR, env=subprocess_env(), timeout=150,
                                       expect_success=False)
    assert status != 0, output[-3000:]
    assert output.count("1 of 2 ranks do not see the files rank 0 writes there") == 2, output[-3000:]
    assert os.listdir(tmp_path / "node0" / "ckpt") == [] and not (tmp_path / "node1").exists()
    if (tmp_path / "log.json").exists():
        from recsys_common.logger import read_log
        assert not [r for r in read_log(str(tmp_path / "log.json")) if "loss" in r["data"]]  # not one step
