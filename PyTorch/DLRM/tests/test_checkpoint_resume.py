"""Training that survives a crash: periodic checkpoints, a real SIGKILL mid-epoch, and an exact resume.

The kill tests run the recipe as users do (``python -m dlrm.scripts.main``, and ``torchrun`` with 2 processes), wait
until a periodic checkpoint exists, SIGKILL the run (the whole process group under torchrun), resume it from the
checkpoint directory with the same command plus ``--load_checkpoint_path``, and compare with an uninterrupted run of
the same command: final AUC, test loss, training loss, and every weight and optimizer state, bit for bit.
"""
import json
import os
import pickle
import random
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from conftest import RECIPE_DIR, subprocess_env, train_args
from dlrm.model import torchrec_available
from dlrm.train import command_line, main
from dlrm import checkpointing
from dlrm.checkpointing import CheckpointError, list_checkpoints, read_tensors
from recsys_testing import free_port

FUSED = pytest.mark.skipif(not torchrec_available(), reason="torchrec/fbgemm not installed")
STEPS_PER_EPOCH = 8192 // 256
# Checkpoints every 7 steps up to step 220 never fall on an epoch boundary (32 steps): the kill lands mid-epoch.
EVERY, MAX_STEPS = 7, 220


def command(args, processes):
    if processes == 1:
        return [sys.executable, "-m", "dlrm.scripts.main", *args]
    return [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={processes}",
            f"--master_addr=127.0.0.1", f"--master_port={free_port()}", "-m", "dlrm.scripts.main", *args]


def run_to_end(args, processes):
    proc = subprocess.run(command(args, processes), cwd=RECIPE_DIR, env=subprocess_env(), capture_output=True,
                          text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]


def run_and_kill(args, processes, checkpoint_dir):
    """Start the run, SIGKILL it (its whole process group) once a periodic checkpoint exists; returns its output."""
    log = open(os.path.join(os.path.dirname(checkpoint_dir), "killed.out"), "w+")
    proc = subprocess.Popen(command(args, processes), cwd=RECIPE_DIR, env=subprocess_env(), stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 300
    try:
        while not list_checkpoints(checkpoint_dir):
            assert proc.poll() is None, "the run ended before its first checkpoint:\n" + _tail(log)
            assert time.monotonic() < deadline, "no checkpoint after 300 s:\n" + _tail(log)
            time.sleep(0.01)
        kill_tree(proc.pid)
    finally:
        returncode = proc.wait(timeout=60)
    assert returncode == -signal.SIGKILL, f"exit {returncode}, not killed:\n" + _tail(log)
    return _tail(log)


def descendants(pid):
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            children = [int(c) for c in f.read().split()]
    except FileNotFoundError:
        return []
    return children + [d for c in children for d in descendants(c)]


def kill_tree(pid):
    """SIGKILL a run as a machine failure would: the launcher's process group and every worker's.

    torchrun starts each worker in a session of its own (``start_new_session``), so killing the launcher's process
    group alone would leave the workers training on, orphaned.
    """
    groups = set()
    for p in [pid, *descendants(pid)]:
        try:
            groups.add(os.getpgid(p))
        except ProcessLookupError:  # already gone
            pass
    for group in groups:
        try:
            os.killpg(group, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for group in groups - {pid}:  # the workers are not our children: wait until they are gone
        deadline = time.monotonic() + 60
        while _alive(group) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(group), f"process {group} survived SIGKILL"


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _tail(log):
    log.flush()
    log.seek(0)
    return log.read()[-5000:]


def summary(log_path):
    from recsys_common.logger import read_log
    records = [r for r in read_log(str(log_path)) if r["step"] == []]
    assert records, f"no summary in {log_path}"
    return records[-1]["data"]


def assert_same_weights(a, b):
    left, right = read_tensors(a), read_tensors(b)
    assert sorted(left) == sorted(right)
    assert "tables/0" in left and "dense/top_mlp.layers.0.weight" in left
    for name, value in left.items():
        assert torch.equal(value, right[name]), name


@pytest.mark.slow
@pytest.mark.parametrize("processes,extra", [
    # one process: plain tables with Adam for both parts, so optimizer moments must resume too
    (1, ["--embedding_type", "multi_table", "--Adam_embedding_optimizer", "--Adam_MLP_optimizer", "--lr", "0.01"]),
    # two processes: TorchRec tables sharded row-wise over the processes, fused SGD, DDP MLPs
    pytest.param(2, ["--embedding_type", "torchrec_fused", "--sharding_type", "row_wise"], marks=FUSED),
], ids=["1-process", "2-processes"])
def test_sigkill_mid_epoch_then_resume_equals_uninterrupted_run(small_dataset, tmp_path, processes, extra):
    def args(name, *more):
        return train_args(small_dataset, tmp_path / f"{name}.json", "--shuffle_batch_order", "--epochs", "10",
                          "--max_steps", str(MAX_STEPS), "--test_freq", "50", "--save_checkpoint_path",
                          str(tmp_path / name), "--checkpoint_every_steps", str(EVERY), *extra, *more)

    run_to_end(args("straight"), processes)
    run_and_kill(args("crashed"), processes, str(tmp_path / "crashed"))
    (step, newest), = list_checkpoints(tmp_path / "crashed")[-1:]
    assert step % EVERY == 0 and step % STEPS_PER_EPOCH and step < MAX_STEPS  # killed mid-epoch, mid-run
    run_to_end(args("crashed", "--load_checkpoint_path", str(tmp_path / "crashed")), processes)

    straight, resumed = summary(tmp_path / "straight.json"), summary(tmp_path / "crashed.json")
    assert resumed["global_step"] == straight["global_step"] == MAX_STEPS
    for key in ("auc", "test_loss", "train_loss", "best_auc", "test_samples"):
        assert resumed[key] == straight[key], key
    assert straight["auc"] > 0.6
    # the log was appended to: the killed run's records, then the resumed run's, which names its checkpoint
    text = (tmp_path / "crashed.json").read_text()
    assert text.count('"resumed_from"') == 1 and newest in text
    final = checkpointing.checkpoint_name(MAX_STEPS)
    assert_same_weights(tmp_path / "straight" / final, tmp_path / "crashed" / final)
    if processes == 2:  # sharded save: each process wrote only its own rows of each row-wise-sharded table
        index = checkpointing._safe_reader(str(tmp_path / "crashed" / final / "model" / "table_0")).read_metadata()
        table_chunks = {}
        for key, info in index.storage_data.items():
            if key.fqn == "tables/0":
                table_chunks.setdefault(str(info.relative_path), []).append(tuple(key.offset))
        assert sorted(table_chunks) == ["__0_0.distcp", "__1_0.distcp"], table_chunks
        assert table_chunks["__0_0.distcp"] == [(0, 0)] and table_chunks["__1_0.distcp"] == [(500, 0)]
    # --keep_checkpoints 2 (default): the final one and the one before it
    assert [s for s, _ in list_checkpoints(tmp_path / "crashed")] == [MAX_STEPS - MAX_STEPS % EVERY, MAX_STEPS]


def test_periodic_checkpoints_by_minutes_keep_the_newest(small_dataset, tmp_path):
    result = main(train_args(small_dataset, tmp_path / "log.json", "--embedding_type", "multi_table", "--max_steps",
                             "10", "--save_checkpoint_path", str(tmp_path / "ck"), "--checkpoint_every_minutes",
                             "1e-9", "--keep_checkpoints", "3"))
    # every step is due (1e-9 minutes have always passed); the 3 newest are kept, the final one among them
    assert [s for s, _ in list_checkpoints(tmp_path / "ck")] == [8, 9, 10]
    assert result["checkpoint"] == str(tmp_path / "ck" / "step_000000010")
    (tmp_path / "ck" / "notes.txt").write_text("mine")
    # resuming from the directory picks its newest checkpoint, and never touches files it did not write
    resumed = main(train_args(small_dataset, tmp_path / "log.json", "--embedding_type", "multi_table", "--max_steps",
                              "12", "--save_checkpoint_path", str(tmp_path / "ck"), "--load_checkpoint_path",
                              str(tmp_path / "ck"), "--checkpoint_every_steps", "1", "--keep_checkpoints", "1"))
    assert resumed["global_step"] == 12
    assert sorted(os.listdir(tmp_path / "ck")) == ["notes.txt", "step_000000012"]


def test_new_run_refuses_a_directory_holding_another_runs_checkpoints(small_dataset, tmp_path):
    common = train_args(small_dataset, tmp_path / "log.json", "--embedding_type", "multi_table",
                        "--save_checkpoint_path", str(tmp_path / "ck"))
    main(common + ["--max_steps", "2"])
    with pytest.raises(CheckpointError, match="already holds checkpoints of another run"):
        main(common + ["--max_steps", "4"])
    # resuming it with nothing left to train leaves its checkpoint as it is (not rewritten)
    inode = os.stat(tmp_path / "ck" / "step_000000002").st_ino
    main(common + ["--max_steps", "2", "--load_checkpoint_path", str(tmp_path / "ck")])
    assert os.stat(tmp_path / "ck" / "step_000000002").st_ino == inode
    with pytest.raises(ValueError, match="need --save_checkpoint_path"):
        main(train_args(small_dataset, tmp_path / "log.json", "--checkpoint_every_steps", "2"))


@pytest.mark.parametrize("flag,field", [(["--hash_indices"], "hash_indices"),
                                        (["--embedding_dim", "8", "--bottom_mlp_sizes", "32,8"], "embedding_dim"),
                                        (["--top_mlp_sizes", "32,1"], "top_mlp_sizes"),
                                        (["--interaction_op", "cat"], "interaction_op"),
                                        (["--max_table_size", "100", "--hash_indices"], "table_sizes")])
def test_resume_refuses_a_different_model_configuration(small_dataset, tmp_path, flag, field):
    base = train_args(small_dataset, tmp_path / "log.json", "--embedding_type", "multi_table")
    main(base + ["--max_steps", "2", "--save_checkpoint_path", str(tmp_path / "ck")])
    with pytest.raises(CheckpointError, match=rf"meta.json: the checkpoint's model differs.*{field}: checkpoint") as e:
        main(base + flag + ["--max_steps", "4", "--load_checkpoint_path", str(tmp_path / "ck")])
    if field == "table_sizes":  # every differing field is named, not just the first
        assert "hash_indices: checkpoint False, flags True" in str(e.value)


def test_resume_warns_about_changed_batch_size_and_lr(small_dataset, tmp_path):
    base = train_args(small_dataset, tmp_path / "log.json", "--embedding_type", "multi_table")
    main(base + ["--max_steps", "2", "--save_checkpoint_path", str(tmp_path / "ck")])
    with pytest.warns(UserWarning, match=r"batch_size 256 -> 512, lr 0.5 -> 0.25"):
        result = main(base + ["--batch_size", "512", "--lr", "0.25", "--max_steps", "4", "--load_checkpoint_path",
                              str(tmp_path / "ck")])
    assert result["global_step"] == 4


def test_rng_state_is_restored(tmp_path):
    from dlrm.model.parallel import ModelConfig, build_trainable_model
    config = ModelConfig(13, [50, 20], ["a", "b"], 8, [16, 8], [16, 1])
    trainable = build_trainable_model(config, "multi_table", torch.device("cpu"), 1, 0.1)
    torch.manual_seed(1), np.random.seed(1), random.seed(1)
    path = checkpointing.save_checkpoint(str(tmp_path / "ck"), trainable, config.to_dict(), {"global_step": 3}, 0, 1)
    expected = (torch.rand(4), np.random.rand(4), random.random())
    torch.manual_seed(2), np.random.seed(2), random.seed(2)
    checkpointing.load_checkpoint(path, trainable, load_optimizer=True, config=config.to_dict())
    restored = (torch.rand(4), np.random.rand(4), random.random())
    assert torch.equal(restored[0], expected[0]) and np.array_equal(restored[1], expected[1])
    assert restored[2] == expected[2]


def test_non_finite_weights_are_never_saved(tmp_path):
    from dlrm.model.parallel import ModelConfig, build_trainable_model
    config = ModelConfig(13, [50, 20], ["a", "b"], 8, [16, 8], [16, 1])
    trainable = build_trainable_model(config, "multi_table", torch.device("cpu"), 1, 0.1)
    checkpointing.save_checkpoint(str(tmp_path / "ck"), trainable, config.to_dict(), {"global_step": 1}, 0, 1)
    with torch.no_grad():
        trainable.core.embeddings.tables[1].weight[3, 2] = float("nan")
    with pytest.raises(FloatingPointError, match="step 2 are NaN or infinite"):
        checkpointing.save_checkpoint(str(tmp_path / "ck"), trainable, config.to_dict(), {"global_step": 2}, 0, 1)
    assert [s for s, _ in list_checkpoints(tmp_path / "ck")] == [1]
    assert os.listdir(tmp_path / "ck") == ["step_000000001"]


@pytest.mark.parametrize("embedding_type", ["multi_table", pytest.param("torchrec_fused", marks=FUSED)])
def test_nan_loss_stops_naming_the_step_and_keeps_the_last_good_checkpoint(small_dataset, tmp_path, monkeypatch,
                                                                           capsys, embedding_type):
    # --lr 1e12 without warmup: finite loss at step 1, NaN from step 2 on
    args = train_args(small_dataset, tmp_path / "log.json", "--embedding_type", embedding_type, "--lr", "1e12",
                      "--warmup_steps", "0", "--max_steps", "30", "--save_checkpoint_path", str(tmp_path / "ck"),
                      "--checkpoint_every_steps", "1", "--keep_checkpoints", "0")
    monkeypatch.setattr(sys, "argv", ["dlrm.scripts.main", *args])
    assert command_line() == 1
    error = capsys.readouterr().err
    assert "training loss became nan at step 2" in error
    assert "the last good checkpoint, from step 1, is" in error
    assert [s for s, _ in list_checkpoints(tmp_path / "ck")] == [1]
    assert all(torch.isfinite(t).all() for t in read_tensors(tmp_path / "ck").values())


def test_old_format_and_tampered_checkpoints_are_refused(small_dataset, tmp_path):
    base = train_args(small_dataset, tmp_path / "log.json", "--embedding_type", "multi_table", "--mode", "test")
    old = tmp_path / "old"
    (old / "embeddings").mkdir(parents=True)
    (old / "meta.json").write_text(json.dumps({"format_version": 1, "num_tables": 8}))
    with pytest.raises(CheckpointError, match=r"checkpoint format 1 \(whole tables as embeddings"):
        main(base + ["--load_checkpoint_path", str(old)])
    (old / "meta.json").write_text("{truncated")
    with pytest.raises(CheckpointError, match=r"old/meta.json: not valid JSON"):
        main(base + ["--load_checkpoint_path", str(old)])

    main(train_args(small_dataset, tmp_path / "log.json", "--embedding_type", "multi_table", "--max_steps", "1",
                    "--save_checkpoint_path", str(tmp_path / "ck")))
    index = tmp_path / "ck" / "step_000000001" / "model" / "table_3" / ".metadata"

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {tmp_path / 'pwned'}",))

    index.write_bytes(pickle.dumps(Evil()))
    with pytest.raises(CheckpointError, match="refusing to load it"):
        main(base + ["--load_checkpoint_path", str(tmp_path / "ck")])
    assert not (tmp_path / "pwned").exists()


def test_deferred_nan_check_names_the_first_bad_step():
    """The CUDA way (no host sync per step: the first bad step is kept on the device), run on the CPU."""
    from dlrm.train import NonFiniteLoss
    guard = NonFiniteLoss(torch.device("cpu"), per_step=False)
    for step, loss in enumerate([0.7, 0.6, float("inf"), float("nan"), 0.5], start=1):
        guard.record(torch.tensor(loss), step)
    with pytest.raises(FloatingPointError, match="became NaN or infinite at step 3"):
        guard.check()
    fine = NonFiniteLoss(torch.device("cpu"), per_step=False)
    fine.record(torch.tensor(0.7), 1)
    fine.check()


@pytest.mark.parametrize("embedding_type", ["multi_table", pytest.param("torchrec_fused", marks=FUSED)])
def test_resume_with_the_float16_loss_scaler_is_exact(small_dataset, tmp_path, embedding_type):
    """Training with the float16 loss scaler (the CUDA default; its code path run here on the CPU) resumes exactly."""
    def run(name, *extra):
        return main(train_args(small_dataset, tmp_path / f"{name}.json", "--embedding_type", embedding_type, "--amp",
                               "--amp_dtype", "float16", "--max_steps", "12", "--save_checkpoint_path",
                               str(tmp_path / name), *extra))

    straight = run("straight", "--checkpoint_every_steps", "5", "--keep_checkpoints", "0")
    assert straight["amp"] == "float16"
    resumed = run("resumed", "--load_checkpoint_path", str(tmp_path / "straight" / "step_000000005"))
    assert resumed["auc"] == straight["auc"] and resumed["test_loss"] == straight["test_loss"]
    assert_same_weights(tmp_path / "straight", tmp_path / "resumed")
    saved = torch.load(tmp_path / "straight" / "step_000000005" / "dense.pt", weights_only=True)
    assert saved["scaler"]["scale"] == 8192.0


def test_loss_scaler_state_is_restored(tmp_path):
    from dlrm.model.parallel import ModelConfig, build_trainable_model
    config = ModelConfig(13, [50, 20], ["a", "b"], 8, [16, 8], [16, 1])
    trainable = build_trainable_model(config, "multi_table", torch.device("cpu"), 1, 0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=8192.0)
    scaler.scale(torch.ones(()))  # the scale becomes a tensor, as after a first step
    scaler.update(new_scale=1024.0)  # as after overflows backed the scale off
    path = checkpointing.save_checkpoint(str(tmp_path / "ck"), trainable, config.to_dict(), {"global_step": 4}, 0, 1,
                                         scaler)
    fresh = torch.amp.GradScaler("cpu", init_scale=8192.0)
    checkpointing.load_checkpoint(path, trainable, fresh, load_optimizer=True)
    assert fresh.get_scale() == 1024.0


def test_a_changed_world_size_warns():
    meta = {"training": {"batch_size": 256, "lr": 0.5, "world_size": 2}}
    with pytest.warns(UserWarning, match=r"ck: resuming with world_size 2 -> 1;"):
        checkpointing.warn_training_changes(meta, {"batch_size": 256, "lr": 0.5, "world_size": 1}, "ck")
