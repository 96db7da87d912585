"""Hybrid parallel on 2 CPU processes (gloo): TorchRec shards the tables, DDP replicates the MLPs.

Checks that 2-process training equals 1-process training on the same global batches, table-wise and row-wise (the
CPU row-wise sharder's forward and backward), on one node and on two nodes (two torchrun launchers on loopback, c10d
rendezvous, as the README's multi-node command); that AUC, log loss, NE and calibration cover every test row from
both processes; and that checkpoints move between 1 and 2 processes. Every launcher must exit 0: an abort at exit after a good run fails.
Failures (a NaN on one rank, a checkpoint directory not shared) are in ``test_distributed_failures.py``.
"""
import os

import pytest

from conftest import RECIPE_DIR, subprocess_env, train_args
from dlrm.model import torchrec_available
from dlrm.train import main
from recsys_testing import run_torchrun_nodes
from recsys_common.torch_distributed import live_gloo_threads

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread"),
              pytest.mark.skipif(not torchrec_available(), reason="torchrec/fbgemm not installed")]

# Measured on 2026-11-24 (AMD EPYC, 2 cores; 20 steps of the small model): the 2-process runs (table-wise, row-wise,
# two nodes: all three identical) differ from the 1-process run by 9.6e-7 in AUC and 4e-10 (relative) in test loss,
# from float32 sums in another order (DDP averages two half-batch gradients). About 2x and 2500x margins.
AUC_TOLERANCE = 2e-6
LOSS_TOLERANCE = 1e-6


def torchrun(args, nnodes=1, nproc_per_node=2, rendezvous="static"):
    """``python -m dlrm.scripts.main ARGS`` under torchrun on free loopback ports; every launcher must exit 0."""
    return run_torchrun_nodes(["-m", "dlrm.scripts.main", *args], nnodes=nnodes, nproc_per_node=nproc_per_node,
                              rendezvous=rendezvous, cwd=RECIPE_DIR, env=subprocess_env(), timeout=240)


def summary(log_path):
    from recsys_common.logger import read_log
    records = [r for r in read_log(str(log_path)) if r["step"] == []]
    assert records, f"no summary in {log_path}"
    return records[-1]["data"]


@pytest.fixture(scope="module")
def reference(small_dataset, tmp_path_factory):
    """Initial weights saved by 1 process with plain EmbeddingBag tables, and 20 steps of 1-process training from them
    (global batch 256)."""
    tmp = tmp_path_factory.mktemp("dlrm_reference")
    main(train_args(small_dataset, tmp / "init.json", "--embedding_type", "multi_table", "--max_steps", "0",
                    "--save_checkpoint_path", str(tmp / "init")))
    result = main(train_args(small_dataset, tmp / "ref.json", "--embedding_type", "multi_table", "--max_steps", "20",
                             "--load_checkpoint_path", str(tmp / "init"), "--save_checkpoint_path", str(tmp / "ref")))
    return {"init": tmp / "init", "ref": tmp / "ref", "result": result}


def assert_matches_reference(run, reference_result):
    assert run["world_size"] == 2 and run["embedding_type"] == "torchrec_fused"
    assert run["test_samples"] == 2048              # both processes' predictions were scored
    # ... but no process held them all: the AUC gathers only the smaller class (at most half the rows).
    assert 0 < run["test_auc_rows_gathered"] <= run["test_samples"] // 2, run
    assert run["auc"] == pytest.approx(reference_result["auc"], abs=AUC_TOLERANCE)
    assert run["test_loss"] == pytest.approx(reference_result["test_loss"], rel=LOSS_TOLERANCE)
    assert run["auc"] > 0.55                        # and the model learned: the comparison is not of two untrained
    # log loss, NE and calibration: each process's four sums all-reduced (nothing gathered) give the 1-process figures;
    # the counts are exact, the sums differ as the test loss does (the same float32 model up to summation order)
    assert run["test_ctr_sums"][:2] == reference_result["test_ctr_sums"][:2] == [2048.0, run["test_ctr_sums"][1]]
    for key in ("test_log_loss", "test_normalized_entropy", "test_calibration"):
        assert run[key] == pytest.approx(reference_result[key], rel=LOSS_TOLERANCE), key
    assert sum(bucket[0] for bucket in run["test_reliability_sums"]) == 2048


def test_teardown_leaves_no_gloo_thread(small_dataset, tmp_path):
    """main() drops its model (DMP holds the group) and tears the group down: no gloo thread may outlive it, since one
    still running when the interpreter exits can abort the process after a good run."""
    before = live_gloo_threads()
    main(train_args(small_dataset, tmp_path / "log.json", "--embedding_type", "torchrec_fused", "--max_steps", "3",
                    "--save_checkpoint_path", str(tmp_path / "ckpt")))
    assert live_gloo_threads() == before


def test_two_nodes_match_one_process_and_their_checkpoint_loads_in_one(small_dataset, tmp_path, reference):
    """Table-wise on two torchrun launchers as two nodes of one process each, c10d rendezvous on 127.0.0.1 (the
    README's multi-node command): the same global batches (256 = 2 x 128) from the same initial weights (saved by one
    process with plain EmbeddingBag tables) give the same model; its checkpoint, saved by 2 processes, is evaluated by
    1 process."""
    launchers = torchrun(train_args(small_dataset, tmp_path / "nodes.json", "--embedding_type", "torchrec_fused",
                                    "--sharding_type", "table_wise", "--max_steps", "20",
                                    "--load_checkpoint_path", str(reference["init"]),
                                    "--save_checkpoint_path", str(tmp_path / "tw")),
                         nnodes=2, nproc_per_node=1, rendezvous="c10d")
    assert [r.returncode for r in launchers] == [0, 0]
    two_nodes = summary(tmp_path / "nodes.json")
    assert_matches_reference(two_nodes, reference["result"])
    # the 2-process run's final checkpoint is complete (meta.json is written last; layout of dlrm.checkpointing)
    assert os.path.isfile(tmp_path / "tw" / "step_000000020" / "meta.json")
    single = main(train_args(small_dataset, tmp_path / "single.json", "--mode", "test", "--embedding_type",
                             "torchrec_fused", "--load_checkpoint_path", str(tmp_path / "tw")))
    assert single["auc"] == pytest.approx(two_nodes["auc"], abs=1e-6)


def test_row_wise_training_on_one_node_matches_one_process(small_dataset, tmp_path, reference):
    """Row-wise sharding splits every table's rows over both processes of one node (static rendezvous): each lookup
    and each gradient crosses them. The initial weights (1 process, plain tables) load into the row-wise shards, and
    the shards, saved by 2 processes, load into 1 process's whole tables."""
    torchrun(train_args(small_dataset, tmp_path / "rw_train.json", "--embedding_type", "torchrec_fused",
                        "--sharding_type", "row_wise", "--max_steps", "20",
                        "--load_checkpoint_path", str(reference["init"]),
                        "--save_checkpoint_path", str(tmp_path / "rw"), "--reliability_plot", str(tmp_path / "rw.png")))
    rw = summary(tmp_path / "rw_train.json")
    assert_matches_reference(rw, reference["result"])
    single = main(train_args(small_dataset, tmp_path / "single.json", "--mode", "test", "--embedding_type",
                             "multi_table", "--load_checkpoint_path", str(tmp_path / "rw")))
    assert single["auc"] == pytest.approx(rw["auc"], abs=1e-6)
    for key in ("test_log_loss", "test_normalized_entropy", "test_calibration"):
        assert single[key] == pytest.approx(rw[key], rel=1e-6), key
    assert open(tmp_path / "rw.png", "rb").read(8) == b"\x89PNG\r\n\x1a\n"   # written once, by rank 0
