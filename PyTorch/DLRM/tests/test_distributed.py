"""Hybrid parallel on 2 CPU processes (gloo): TorchRec shards the tables, DDP replicates the MLPs.

Checks that 2-process training (table-wise and row-wise sharding) equals 1-process training on the same global batches,
that AUC covers every test row from both processes, and that checkpoints move between 1 and 2 processes.
"""
import os
import subprocess
import sys

import pytest

from conftest import RECIPE_DIR, subprocess_env, train_args
from dlrm.model import torchrec_available
from dlrm.scripts.main import main

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not torchrec_available(), reason="torchrec/fbgemm not installed")]


def torchrun(args, port):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={port}",
           "-m", "dlrm.scripts.main", *args]
    proc = subprocess.run(cmd, cwd=RECIPE_DIR, env=subprocess_env(), capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return proc


def summary(log_path):
    from recsys_common.logger import read_log
    records = [r for r in read_log(str(log_path)) if r["step"] == []]
    assert records, f"no summary in {log_path}"
    return records[-1]["data"]


def test_two_processes_match_one_and_checkpoints_move(small_dataset, tmp_path):
    base = lambda log, *extra: train_args(small_dataset, tmp_path / log, *extra)  # noqa: E731
    main(base("init.json", "--embedding_type", "torchrec_fused", "--max_steps", "0",
              "--save_checkpoint_path", str(tmp_path / "init")))
    reference = main(base("ref.json", "--embedding_type", "multi_table", "--max_steps", "20",
                          "--load_checkpoint_path", str(tmp_path / "init"),
                          "--save_checkpoint_path", str(tmp_path / "ref")))

    # 2 processes, table-wise: same global batches (256 = 2 x 128) from the same initial weights -> same model
    torchrun(base("tw.json", "--embedding_type", "torchrec_fused", "--sharding_type", "table_wise",
                  "--max_steps", "20", "--load_checkpoint_path", str(tmp_path / "init"),
                  "--save_checkpoint_path", str(tmp_path / "tw")), port=29641)
    tw = summary(tmp_path / "tw.json")
    assert tw["world_size"] == 2 and tw["embedding_type"] == "torchrec_fused"
    assert tw["test_samples"] == 2048              # both processes' predictions were gathered
    assert tw["auc"] == pytest.approx(reference["auc"], abs=2e-6)
    assert tw["test_loss"] == pytest.approx(reference["test_loss"], rel=1e-5)
    assert tw["auc"] > 0.55

    # checkpoint saved by 1 process, evaluated by 2 row-wise-sharded processes
    torchrun(base("rw.json", "--mode", "test", "--embedding_type", "torchrec_fused", "--sharding_type", "row_wise",
                  "--load_checkpoint_path", str(tmp_path / "ref")), port=29643)
    rw = summary(tmp_path / "rw.json")
    assert rw["auc"] == pytest.approx(reference["auc"], abs=1e-6)
    assert rw["test_samples"] == 2048

    # checkpoint saved by 2 processes, evaluated by 1
    single = main(base("single.json", "--mode", "test", "--embedding_type", "torchrec_fused",
                       "--load_checkpoint_path", str(tmp_path / "tw")))
    assert single["auc"] == pytest.approx(tw["auc"], abs=1e-6)
    assert os.path.isfile(tmp_path / "tw" / "step_000000020" / "meta.json")  # the final checkpoint, at step 20
