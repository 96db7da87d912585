"""Tables in files over several processes (``torchrun`` + ``--embedding_memory_budget_gb``, gloo on the CPU;
``dlrm.model.table_sharding``; issue 32): every table split by rows, each process's shards in its own files.

Two processes train the tables one process trains (bit for bit for single-hot ids, given the same gradient, in
``table_sharding_worker.py``); the whole model trains to one process's model up to float summation order; a SIGKILL
then a resume equals the uninterrupted run bit for bit; a storage or checkpoint of another number of processes is
refused, naming both numbers.
"""
import os

import pytest
import torch

from conftest import RECIPE_DIR, subprocess_env, train_args
from dlrm.checkpointing import CheckpointError, checkpoint_name, list_checkpoints, read_tensors
from dlrm.model import table_files
from dlrm.model.table_files import TableStorageError
from dlrm.model.table_sharding import check_storage_layout, row_range
from dlrm.train import main
from recsys_testing import run_torchrun_nodes
from test_checkpoint_resume import run_and_kill, run_to_end, summary

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread")]

# Every table in files: the budget holds one step's working set (a process of two looks up rows for the global
# batch of 256) and nothing more.
ALL_IN_FILES = str(table_files.step_working_set(256, [1] * 8, 16) / 2**30)
# Measured on 2026-11-28 (Intel Xeon, 2 cores; 60 SGD steps): the 2-process run has the 1-process run's AUC, its
# test loss differs by 2e-10 (relative), its tables by at most 6e-8 and its MLPs by 1.2e-7: DDP adds two half-batch
# MLP gradients where one process sums the whole batch (float32 sums in another order), and the MLPs' difference
# reaches the tables' gradients. The tolerances are test_distributed.py's (tables: 16x the measured difference).
AUC_TOLERANCE, LOSS_TOLERANCE, TABLE_TOLERANCE = 2e-6, 1e-6, 1e-6


def tables_args(dataset, tmp_path, name, *more):
    return train_args(dataset, tmp_path / f"{name}.json", "--embedding_memory_budget_gb", ALL_IN_FILES,
                      "--embedding_storage_dir", str(tmp_path / f"{name}_tables"),
                      "--save_checkpoint_path", str(tmp_path / name), *more)


def torchrun(args):
    launchers = run_torchrun_nodes(args, nnodes=1, nproc_per_node=2, rendezvous="static", cwd=RECIPE_DIR,
                                   env=subprocess_env(), timeout=240)
    assert [r.returncode for r in launchers] == [0]


def test_row_range_covers_every_row_once_also_for_tables_smaller_than_the_world():
    for rows in (1, 2, 5, 7, 300):
        for world in (1, 2, 3, 4):
            ranges = [row_range(rows, r, world) for r in range(world)]
            assert ranges[0][0] == 0 and ranges[-1][1] == rows
            assert all(a[1] == b[0] and a[0] <= a[1] for a, b in zip(ranges, ranges[1:])), ranges
    assert [row_range(1, r, 2) for r in range(2)] == [(0, 1), (1, 1)]   # the second process owns no row
    assert [row_range(10, r, 3) for r in range(3)] == [(0, 4), (4, 8), (8, 10)]


def test_a_storage_serves_only_its_number_of_processes(tmp_path):
    assert check_storage_layout(str(tmp_path / "two"), 2) is None          # new: marked as two processes'
    assert check_storage_layout(str(tmp_path / "two"), 2) is None
    for other in (1, 3):
        assert "holds the table shards of 2 process(es), this run has " + str(other) in \
            check_storage_layout(str(tmp_path / "two"), other)
    (tmp_path / "one").mkdir()
    (tmp_path / "one" / "tables.json").write_text("{}")                    # a one-process storage
    assert check_storage_layout(str(tmp_path / "one"), 1) is None
    assert "holds the table shards of 1 process(es), this run has 2" in check_storage_layout(str(tmp_path / "one"), 2)


def test_shards_take_the_steps_of_one_process_on_the_global_batch(tmp_path):
    """SGD and Adagrad, single-hot and multi-hot, a table smaller than the world, uneven batches, a bad id."""
    torchrun([os.path.join("tests", "table_sharding_worker.py"), str(tmp_path)])


EVERY, MAX_STEPS = 7, 60


def run_args(dataset, tmp_path, name, *more):
    """SGD, a checkpoint every 7 steps (never at an epoch's end of 32). Batches in file order: shuffling permutes
    local batches, of 256 rows on one process and of 128 on two, so the two would see other global batches. (Adagrad
    is compared in the worker, given the same gradient: end to end, its eps of 1e-10 magnifies the float-order noise
    of gradients near 1e-10: a gradient of 4e-10 differing by 1.5 % moved a weight 7e-5 apart in 3 steps, measured.)"""
    return tables_args(dataset, tmp_path, name, "--epochs",
                       "10", "--max_steps", str(MAX_STEPS), "--test_freq", "25", "--checkpoint_every_steps",
                       str(EVERY), *more)


@pytest.fixture(scope="module")
def two_processes(small_dataset, tmp_path_factory):
    """An uninterrupted run of 2 processes: its directory and summary."""
    tmp_path = tmp_path_factory.mktemp("two_processes")
    run_to_end(run_args(small_dataset, tmp_path, "two"), 2)
    return tmp_path, summary(tmp_path / "two.json")


def test_two_processes_train_the_model_of_one_and_refuse_another_number(small_dataset, tmp_path, two_processes):
    directory, two = two_processes
    one = main(run_args(small_dataset, tmp_path, "one"))
    assert two["world_size"] == 2 and two["test_samples"] == 2048
    assert two["auc"] == pytest.approx(one["auc"], abs=AUC_TOLERANCE) and one["auc"] > 0.55
    assert two["test_loss"] == pytest.approx(one["test_loss"], rel=LOSS_TOLERANCE)
    for rank in (0, 1):   # each process's shards, in files of its own
        names = os.listdir(directory / "two_tables" / f"rank_{rank}")
        assert sum(n.endswith(".f32") for n in names) == 8, names
    single = read_tensors(tmp_path / "one" / checkpoint_name(MAX_STEPS))
    sharded = read_tensors(directory / "two" / checkpoint_name(MAX_STEPS))   # the shards assembled: whole tables
    assert sorted(single) == sorted(sharded) and "tables/7" in sharded
    for key, value in single.items():
        torch.testing.assert_close(sharded[key], value, rtol=0, atol=TABLE_TOLERANCE, msg=key)
    # one process evaluates the checkpoint of two (its tables read from both storages, into tables in RAM)
    evaluated = main(train_args(small_dataset, tmp_path / "eval.json", "--mode", "test", "--embedding_type",
                                "multi_table", "--load_checkpoint_path", str(directory / "two")))
    assert evaluated["auc"] == pytest.approx(two["auc"], abs=1e-6)
    # ... but resuming it needs two: the storage and the checkpoint say so
    with pytest.raises(TableStorageError, match=r"holds the table shards of 2 process\(es\), this run has 1"):
        main(run_args(small_dataset, directory, "two", "--load_checkpoint_path", str(directory / "two")))
    with pytest.raises(CheckpointError, match="saved by 2 processes.*resume it with 2 processes, not 1"):
        main(run_args(small_dataset, tmp_path, "elsewhere", "--load_checkpoint_path", str(directory / "two")))


def test_sigkill_of_two_processes_then_resume_equals_the_uninterrupted_run(small_dataset, tmp_path, two_processes):
    directory, straight = two_processes
    run_and_kill(run_args(small_dataset, tmp_path, "crashed"), 2, str(tmp_path / "crashed"))
    (step, _), = list_checkpoints(tmp_path / "crashed")[-1:]
    assert step % EVERY == 0 and step < MAX_STEPS
    run_to_end(run_args(small_dataset, tmp_path, "crashed", "--load_checkpoint_path", str(tmp_path / "crashed")), 2)
    resumed = summary(tmp_path / "crashed.json")
    assert resumed["global_step"] == straight["global_step"] == MAX_STEPS
    for key in ("auc", "test_loss", "train_loss", "best_auc"):
        assert resumed[key] == straight[key], key
    left = read_tensors(directory / "two" / checkpoint_name(MAX_STEPS))
    right = read_tensors(tmp_path / "crashed" / checkpoint_name(MAX_STEPS))
    assert sorted(left) == sorted(right) and "tables/0" in left
    for key, value in left.items():
        assert torch.equal(right[key], value), key
