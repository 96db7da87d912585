"""The checkpoint file format: whole-table ``.npy`` files written shard by shard, read back on any placement.

These tests need no Horovod: several ranks are simulated by threads of one process (the collectives of
``checkpointing`` replaced by a ``threading.Barrier`` and a shared slot), so the real save protocol runs (rank 0
creates the files, every rank writes its shards, rank 0 commits) on placements of 1, 2 and 3 ranks.
"""
import json
import os
import threading

import numpy as np
import pytest
import tensorflow as tf

from dlrm_dcnv2.distributed.hvd_utils import Context
from dlrm_dcnv2.distributed.placement import plan_placement
from dlrm_dcnv2.model.sparse_model import SparseModel
from dlrm_dcnv2 import checkpointing
from dlrm_dcnv2.checkpointing import CheckpointError, CheckpointManager, list_checkpoints

TABLES = [40, 7, 23, 5]
DIMS = [8, 4, 8, 2]
CONFIG = {"model": "dlrm", "table_sizes": TABLES, "embedding_dims": DIMS, "bottom_mlp_dims": [8, 4]}


class SlotOptimizer:
    """An embedding optimizer with per-variable state like LazyAdam's (``slot_variables(var) -> {m, v}``)."""

    def __init__(self):
        self.iterations = tf.Variable(0, dtype=tf.int64)
        self._slots = {}

    def build(self, variables):
        for v in variables:
            self._slots.setdefault(v.ref(), {"m": tf.Variable(tf.zeros_like(v)), "v": tf.Variable(tf.zeros_like(v))})

    def slot_variables(self, var):
        return self._slots.get(var.ref(), {})


class Model:
    """``.sparse`` + ``.dense``, as RecModel exposes them."""

    def __init__(self, placement, ctx, seed):
        self.sparse = SparseModel(TABLES, DIMS, 1, placement, ctx, seed=seed)
        self.dense = tf.keras.Sequential([tf.keras.layers.Dense(4), tf.keras.layers.Dense(1)])
        self.dense.build((None, 3))


def whole_tables(seed):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((r, d)).astype(np.float32) for r, d in zip(TABLES, DIMS)]


def make_rank(world, rank, values, slot_values=None, **plan):
    """Rank ``rank``'s model of a ``world``-rank job whose tables hold ``values`` (and slots ``slot_values``)."""
    placement = plan_placement(TABLES, DIMS, world, **plan)
    model = Model(placement, Context(rank, world, rank), seed=rank + 11)
    optimizer = SlotOptimizer()
    optimizer.build([v for _, v in model.sparse.shard_variables])
    for spec, var in model.sparse.shard_variables:
        (r0, r1), (c0, c1) = spec.rows, spec.cols
        var.assign(values[spec.table][r0:r1, c0:c1])
        if slot_values is not None:
            for name, slot in optimizer.slot_variables(var).items():
                slot.assign(slot_values[name][spec.table][r0:r1, c0:c1])
    return model, optimizer


class ThreadCollectives:
    """Collectives of ``world`` threads (one per simulated rank), patched into ``checkpointing``."""

    def __init__(self, world):
        self.barrier = threading.Barrier(world, timeout=60)
        self.slot = {}

    def install(self, monkeypatch):
        monkeypatch.setattr(checkpointing, "_barrier", lambda ctx: self.barrier.wait())
        monkeypatch.setattr(checkpointing, "_all_ranks_true", lambda flag, ctx: self._gather(flag, ctx, all))
        monkeypatch.setattr(checkpointing, "_broadcast_text", lambda text, ctx: self._gather(text, ctx, lambda v: v[0]))
        monkeypatch.setattr(checkpointing, "_agree", lambda flag, ctx: self._gather(flag, ctx, lambda v: v[0]))
        # The managers of the simulated ranks are built one after the other in one thread; the check that the ranks
        # share the directory (a collective of its own) has its tests in common/tests/test_shared_storage.py.
        monkeypatch.setattr(checkpointing, "_check_shared", lambda root, ctx: None)

    def _gather(self, value, ctx, combine):
        self.barrier.wait()
        self.slot[ctx.rank] = value
        self.barrier.wait()
        result = combine([self.slot[r] for r in sorted(self.slot)])
        self.barrier.wait()
        return result


def run_ranks(world, fn):
    """Run ``fn(rank)`` in ``world`` threads; re-raise the first error; return the results in rank order."""
    results, errors = [None] * world, []

    def target(rank):
        try:
            results[rank] = fn(rank)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=target, args=(r,), name=f"rank{r}") for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    if errors:
        raise errors[0]
    return results


PLANS = {
    "one_rank": (1, {}),
    "table_wise_2": (2, {}),
    "column_sliced_2": (2, {"column_slice_threshold": 100}),
    "row_sliced_3": (3, {"row_slice_threshold": 100}),
    "data_parallel_2": (2, {"data_parallel_threshold": 30}),
    "basic_3": (3, {"strategy": "basic"}),
}


def save_with(tmp_path, monkeypatch, world, plan, values, slots, step=6, keep=0):
    collectives = ThreadCollectives(world)
    collectives.install(monkeypatch)
    ranks = [make_rank(world, r, values, slots, **plan) for r in range(world)]
    for _, opt in ranks:
        opt.iterations.assign(step)
    root = str(tmp_path / "ckpt")
    paths = run_ranks(world, lambda r: checkpointing.save_checkpoint(
        root, step, ranks[r][0], (None, ranks[r][1]), Context(r, world, r), CONFIG, epoch=0, batch_in_epoch=step,
        keep=keep))
    assert len(set(paths)) == 1
    return root, paths[0]


@pytest.mark.parametrize("saved_on", sorted(PLANS))
def test_sharded_save_writes_whole_tables(tmp_path, monkeypatch, saved_on):
    world, plan = PLANS[saved_on]
    values = whole_tables(1)
    slots = {"m": whole_tables(2), "v": whole_tables(3)}
    root, path = save_with(tmp_path, monkeypatch, world, plan, values, slots)
    assert list_checkpoints(root) == [(6, path)]
    assert os.path.basename(path) == "step_000000006"
    for t in range(len(TABLES)):
        np.testing.assert_array_equal(checkpointing.read_table(root, t), values[t])
        for name in ("m", "v"):
            np.testing.assert_array_equal(checkpointing.read_table(root, t, name), slots[name][t])
    with open(os.path.join(path, "state.json")) as f:
        state = json.load(f)
    assert state["global_step"] == 6 and state["world_size"] == world and state["embedding_slots"] == ["m", "v"]
    assert state["optimizer_iterations"]["embedding"] == 6
    assert sorted(os.listdir(tmp_path / "ckpt")) == ["step_000000006"]  # no staging directory left


@pytest.mark.parametrize("saved_on,restored_on", [("table_wise_2", "one_rank"), ("one_rank", "row_sliced_3"),
                                                  ("column_sliced_2", "basic_3"), ("row_sliced_3", "data_parallel_2")])
def test_restore_on_another_placement(tmp_path, monkeypatch, saved_on, restored_on):
    world, plan = PLANS[saved_on]
    values = whole_tables(4)
    slots = {"m": whole_tables(5), "v": whole_tables(6)}
    root, _ = save_with(tmp_path, monkeypatch, world, plan, values, slots)
    new_world, new_plan = PLANS[restored_on]
    for rank in range(new_world):
        model, optimizer = make_rank(new_world, rank, whole_tables(99), None, **new_plan)
        state = checkpointing.restore_checkpoint(root, model, (None, optimizer), Context(rank, new_world, rank),
                                                 CONFIG)
        assert state["global_step"] == 6 and state["batch_in_epoch"] == 6
        assert int(optimizer.iterations.numpy()) == 6
        for spec, var in model.sparse.shard_variables:
            (r0, r1), (c0, c1) = spec.rows, spec.cols
            np.testing.assert_array_equal(var.numpy(), values[spec.table][r0:r1, c0:c1])
            for name, slot in optimizer.slot_variables(var).items():
                np.testing.assert_array_equal(slot.numpy(), slots[name][spec.table][r0:r1, c0:c1])


def test_dense_weights_and_optimizer_round_trip(tmp_path):
    values = whole_tables(7)
    model, _ = make_rank(1, 0, values)
    dense_optimizer = tf.keras.optimizers.Adam(0.01)
    x = tf.constant(np.random.default_rng(0).standard_normal((16, 3)), tf.float32)

    def step(m, opt):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(m.dense(x) - 1.0))
        opt.apply_gradients(zip(tape.gradient(loss, m.dense.trainable_variables), m.dense.trainable_variables))
        return float(loss)

    for _ in range(3):
        step(model, dense_optimizer)
    root = str(tmp_path / "ckpt")
    checkpointing.save_checkpoint(root, 3, model, (dense_optimizer, None), Context(), CONFIG)
    expected = [step(model, dense_optimizer) for _ in range(3)]

    fresh, _ = make_rank(1, 0, whole_tables(8))
    fresh_optimizer = tf.keras.optimizers.Adam(0.01)
    checkpointing.restore_checkpoint(root, fresh, (fresh_optimizer, None), Context(), CONFIG)
    assert int(fresh_optimizer.iterations.numpy()) == 3
    assert [step(fresh, fresh_optimizer) for _ in range(3)] == expected  # bitwise: slots restored too
    for a, b in zip(model.dense.weights, fresh.dense.weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_config_mismatch_names_the_flag(tmp_path):
    model, _ = make_rank(1, 0, whole_tables(1))
    root = str(tmp_path / "ckpt")
    checkpointing.save_checkpoint(root, 1, model, None, Context(), CONFIG)
    with pytest.raises(CheckpointError, match=r"bottom_mlp_dims.*\[8, 4\].*\[16, 4\].*--bottom_mlp_dims"):
        checkpointing.restore_checkpoint(root, model, None, Context(), dict(CONFIG, bottom_mlp_dims=[16, 4]))
    with pytest.raises(CheckpointError, match=r"model: checkpoint 'dlrm', flags 'dcnv2'.*dlrm.py / dcnv2.py"):
        checkpointing.restore_checkpoint(root, model, None, Context(), dict(CONFIG, model="dcnv2"))
    with pytest.warns(UserWarning, match="batch_size 64 -> 128"):
        checkpointing.save_checkpoint(root, 2, model, None, Context(), CONFIG, training={"batch_size": 64})
        checkpointing.restore_checkpoint(root, model, None, Context(), CONFIG, training={"batch_size": 128})


def test_slot_state_of_another_optimizer_is_refused(tmp_path):
    model, _ = make_rank(1, 0, whole_tables(1))
    root = str(tmp_path / "ckpt")
    checkpointing.save_checkpoint(root, 1, model, None, Context(), CONFIG)  # SGD-like: no slots saved
    fresh, optimizer = make_rank(1, 0, whole_tables(2))
    with pytest.raises(CheckpointError, match=r"no embedding optimizer state \['m', 'v'\].*--optimizer"):
        checkpointing.restore_checkpoint(root, fresh, (None, optimizer), Context(), CONFIG)
    checkpointing.restore_checkpoint(root, fresh, (None, optimizer), Context(), CONFIG, load_optimizer=False)


def test_table_file_of_wrong_shape_names_the_file(tmp_path):
    model, _ = make_rank(1, 0, whole_tables(1))
    root = str(tmp_path / "ckpt")
    path = checkpointing.save_checkpoint(root, 1, model, None, Context(), CONFIG)
    bad = os.path.join(path, "sparse", "table_2.npy")
    os.chmod(bad, 0o644)
    np.save(bad, np.zeros((23, 4), np.float32))
    with pytest.raises(CheckpointError, match=r"table_2\.npy: the table has shape \(23, 4\).*expects \(23, 8\)"):
        checkpointing.restore_checkpoint(root, model, None, Context())


def test_crash_mid_save_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    values = whole_tables(1)
    model, optimizer = make_rank(1, 0, values)
    root = str(tmp_path / "ckpt")
    first = checkpointing.save_checkpoint(root, 5, model, (None, optimizer), Context(), CONFIG)
    written = []

    def failing_write(path, rows, cols, value):
        if written:
            raise OSError("disk full (simulated)")
        written.append(path)
        original(path, rows, cols, value)

    original = checkpointing.write_table_slice
    monkeypatch.setattr(checkpointing, "write_table_slice", failing_write)
    for spec, var in model.sparse.shard_variables:
        var.assign(tf.zeros_like(var))
    with pytest.raises(OSError, match="disk full"):
        checkpointing.save_checkpoint(root, 10, model, (None, optimizer), Context(), CONFIG)
    assert list_checkpoints(root) == [(5, first)]
    assert sorted(os.listdir(root)) == ["step_000000005"]  # the staging directory went with the error
    assert checkpointing.resolve_checkpoint(root) == first
    np.testing.assert_array_equal(checkpointing.read_table(root, 0), values[0])


def test_stale_staging_directory_is_ignored_then_removed(tmp_path):
    model, _ = make_rank(1, 0, whole_tables(1))
    root = tmp_path / "ckpt"
    first = checkpointing.save_checkpoint(str(root), 5, model, None, Context(), CONFIG)
    # What a SIGKILL mid-save leaves: a staging directory with some files and no state.json.
    stale = root / ".step_000000010.tmp-abc123"
    (stale / "sparse").mkdir(parents=True)
    np.save(stale / "sparse" / "table_0.npy", np.zeros((40, 8), np.float32))
    (root / "step_000000099").mkdir()  # a half-visible directory without state.json is not a checkpoint either
    assert checkpointing.resolve_checkpoint(str(root)) == first
    checkpointing.save_checkpoint(str(root), 6, model, None, Context(), CONFIG)
    assert not stale.exists()
    assert sorted(os.listdir(root)) == ["step_000000005", "step_000000006", "step_000000099"]


def test_keep_prunes_only_our_files(tmp_path):
    model, _ = make_rank(1, 0, whole_tables(1))
    root = str(tmp_path / "ckpt")
    checkpointing.save_checkpoint(root, 1, model, None, Context(), CONFIG, keep=2)
    notes = os.path.join(root, "step_000000001", "my_notes.txt")
    with open(notes, "w") as f:
        f.write("keep me")
    checkpointing.save_checkpoint(root, 2, model, None, Context(), CONFIG, keep=2)
    checkpointing.save_checkpoint(root, 3, model, None, Context(), CONFIG, keep=2)
    checkpointing.save_checkpoint(root, 4, model, None, Context(), CONFIG, keep=2)
    assert [s for s, _ in list_checkpoints(root)] == [3, 4]
    assert sorted(os.listdir(root)) == ["step_000000001", "step_000000003", "step_000000004"]
    assert sorted(os.listdir(os.path.join(root, "step_000000001"))) == [".recsys_outputs.json", "my_notes.txt"]


def test_non_finite_weights_are_not_saved(tmp_path):
    model, _ = make_rank(1, 0, whole_tables(1))
    root = str(tmp_path / "ckpt")
    model.sparse.shard_variables[2][1][3, 1].assign(float("nan"))
    with pytest.raises(FloatingPointError, match="step 7 are NaN"):
        checkpointing.save_checkpoint(root, 7, model, None, Context(), CONFIG)
    assert list_checkpoints(root) == []


def test_restore_errors_name_the_path(tmp_path):
    model, _ = make_rank(1, 0, whole_tables(1))
    with pytest.raises(CheckpointError, match="nowhere: checkpoint not found"):
        checkpointing.restore_checkpoint(str(tmp_path / "nowhere"), model)
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="empty: no complete checkpoint"):
        checkpointing.restore_checkpoint(str(tmp_path / "empty"), model)
    step = tmp_path / "ckpt" / "step_000000001"
    step.mkdir(parents=True)
    (step / "state.json").write_text('{"format_version": 99, "global_step": 1, "tables": []}')
    with pytest.raises(CheckpointError, match="format 99; this code reads format 1"):
        checkpointing.restore_checkpoint(str(tmp_path / "ckpt"), model)


def test_manager_periodic_and_final(tmp_path):
    model, optimizer = make_rank(1, 0, whole_tables(1))
    root = str(tmp_path / "ckpt")
    manager = CheckpointManager(root, model, (None, optimizer), Context(), CONFIG, every_steps=3, keep=2)
    saved = [manager.maybe_save(step) for step in range(1, 8)]
    assert [s is not None for s in saved] == [False, False, True, False, False, True, False]
    assert manager.save(6) == saved[5]  # the final save at a step just saved writes nothing new
    manager.save(7)
    assert [s for s, _ in list_checkpoints(root)] == [6, 7]


def test_manager_minutes(tmp_path, monkeypatch):
    model, _ = make_rank(1, 0, whole_tables(1))
    clock = [1000.0]
    monkeypatch.setattr(checkpointing.time, "monotonic", lambda: clock[0])
    manager = CheckpointManager(str(tmp_path / "ckpt"), model, None, Context(), CONFIG, every_minutes=0.5)
    assert manager.maybe_save(1) is None
    clock[0] += 31
    assert manager.maybe_save(2) is not None
    clock[0] += 10
    assert manager.maybe_save(3) is None


def test_manager_minutes_follow_rank_zero(tmp_path, monkeypatch):
    """Two ranks with different clocks: rank 0's decision is everyone's, checked every TIME_CHECK_EVERY steps."""
    collectives = ThreadCollectives(2)
    collectives.install(monkeypatch)
    late = {"rank0": False, "rank1": True}
    monkeypatch.setattr(checkpointing.time, "monotonic",
                        lambda: 1e6 if late.get(threading.current_thread().name) else 0.0)
    managers = []
    for rank in range(2):
        model, _ = make_rank(2, rank, whole_tables(1))
        managers.append(CheckpointManager(str(tmp_path / "ckpt"), model, None, Context(rank, 2, rank), CONFIG,
                                          every_minutes=1.0))
    every = CheckpointManager.TIME_CHECK_EVERY
    assert run_ranks(2, lambda r: [managers[r].due(s) for s in (1, every)]) == [[False, False], [False, False]]
    late.update(rank0=True, rank1=False)
    assert run_ranks(2, lambda r: [managers[r].due(s) for s in (1, every)]) == [[False, True], [False, True]]


def test_manager_refuses_another_runs_checkpoints(tmp_path):
    model, _ = make_rank(1, 0, whole_tables(1))
    root = str(tmp_path / "ckpt")
    old = checkpointing.save_checkpoint(root, 4, model, None, Context(), CONFIG)
    with pytest.raises(CheckpointError, match="already holds checkpoints of another run.*--overwrite"):
        CheckpointManager(root, model, None, Context(), CONFIG, every_steps=2)
    resumed = CheckpointManager(root, model, None, Context(), CONFIG, every_steps=2, resumed_from=root)
    assert resumed.save(4) == old
    foreign = os.path.join(root, "README.txt")
    with open(foreign, "w") as f:
        f.write("user file")
    CheckpointManager(root, model, None, Context(), CONFIG, every_steps=2, overwrite=True)
    assert list_checkpoints(root) == [] and sorted(os.listdir(root)) == ["README.txt"]


KILLED_MID_SAVE = r'''
import os, sys, time
import numpy as np
sys.path[:0] = sys.argv[2:]
import tensorflow as tf
import test_checkpoint_format as t
from dlrm_dcnv2.distributed.hvd_utils import Context
from dlrm_dcnv2 import checkpointing
root = sys.argv[1]
model, optimizer = t.make_rank(1, 0, t.whole_tables(1), {"m": t.whole_tables(2), "v": t.whole_tables(3)})
checkpointing.save_checkpoint(root, 5, model, (None, optimizer), Context(), t.CONFIG)
original = checkpointing.write_table_slice
def write_then_hang(path, rows, cols, value):
    original(path, rows, cols, value)
    open(os.path.join(root, "..", "mid_save"), "w").close()
    time.sleep(600)  # the test SIGKILLs us here, mid-save
checkpointing.write_table_slice = write_then_hang
for _, var in model.sparse.shard_variables:
    var.assign(tf.zeros_like(var))
checkpointing.save_checkpoint(root, 10, model, (None, optimizer), Context(), t.CONFIG)
'''


def test_sigkill_mid_save_leaves_the_previous_checkpoint(tmp_path):
    """A real SIGKILL while step 10 is being written: step 5 stays the newest complete checkpoint, intact."""
    import signal
    import subprocess
    import sys
    import time
    from conftest import RECIPE_DIR, subprocess_env
    root = tmp_path / "ckpt"
    tests_dir = os.path.dirname(os.path.abspath(__file__))
    proc = subprocess.Popen([sys.executable, "-c", KILLED_MID_SAVE, str(root), tests_dir], cwd=RECIPE_DIR,
                            env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "mid_save").exists():
            assert proc.poll() is None, proc.stdout.read().decode()[-3000:]
            assert time.monotonic() < deadline, "the save never started"
            time.sleep(0.01)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
    assert proc.returncode == -signal.SIGKILL
    names = sorted(os.listdir(root))
    assert names[0] == ".step_000000010.tmp-" + names[0].split(".tmp-")[1] and names[1:] == ["step_000000005"]
    assert os.path.isfile(root / names[0] / "sparse" / "table_0.npy")  # it was killed part-way through the tables
    assert [s for s, _ in list_checkpoints(str(root))] == [5]
    values = whole_tables(1)
    model, optimizer = make_rank(1, 0, whole_tables(9))
    state = checkpointing.restore_checkpoint(str(root), model, (None, optimizer), Context(), CONFIG)
    assert state["global_step"] == 5
    for spec, var in model.sparse.shard_variables:
        np.testing.assert_array_equal(var.numpy(), values[spec.table])
    checkpointing.save_checkpoint(str(root), 6, model, None, Context(), CONFIG)  # cleans the killed one's leftovers
    assert sorted(os.listdir(root)) == ["step_000000005", "step_000000006"]


def test_sparse_model_without_shards_is_refused(tmp_path):
    class Opaque:
        table_sizes, embedding_dims = TABLES, DIMS

    model, _ = make_rank(1, 0, whole_tables(1))
    model.sparse = Opaque()
    with pytest.raises(CheckpointError, match="--use_mde_embeddings"):
        checkpointing.save_checkpoint(str(tmp_path / "ckpt"), 1, model, None, Context(), CONFIG)
    assert not (tmp_path / "ckpt").exists()


def test_a_step_directory_of_someone_else_is_refused_not_deleted(tmp_path):
    model, _ = make_rank(1, 0, whole_tables(1))
    root = tmp_path / "ckpt"
    (root / "step_000000004").mkdir(parents=True)
    (root / "step_000000004" / "state.json").write_text("{}")  # not ours: no manifest lists it
    with pytest.raises(FileExistsError, match=r"state\.json: exists and was not written by this tool"):
        checkpointing.save_checkpoint(str(root), 4, model, None, Context(), CONFIG)
    assert (root / "step_000000004" / "state.json").read_text() == "{}"
    assert sorted(os.listdir(root)) == ["step_000000004"]  # no staging directory left either
    assert sorted(os.listdir(root / "step_000000004")) == ["state.json"]
