"""Checkpoints of tables in files (issue 32): incremental (the files are the newest checkpoint's tables plus an undo
journal), atomic, resumable after a crash at any point, and clear about what they cannot give (an older checkpoint,
a damaged file, a full disk, a storage in use)."""
import errno
import os
import shutil

import numpy as np
import pytest
import torch

from dlrm.checkpointing import checkpoint_name, list_checkpoints, read_tensors
from dlrm.model import table_files, table_storage
from dlrm.model.table_files import TableStorageError, TieredTableEmbeddings, read_checkpoint_tables

SIZES = [50, 7, 300]
HOTNESS = [1, 3, 2]
IN_FILES = [True, False, True]   # table 1 stays in RAM: checkpoints write it as a file of their generation


def _make(storage):
    emb = TieredTableEmbeddings(SIZES, 4, IN_FILES, storage_dir=str(storage), adagrad=True, hotness=HOTNESS)
    emb.lr = 0.1
    return emb


def _ids(generator, batch=16):
    return torch.cat([torch.randint(0, 50, (batch, 1), generator=generator),
                      torch.randint(-1, 7, (batch, 3), generator=generator),
                      torch.randint(-1, 300, (batch, 2), generator=generator)], 1)


def _steps(emb, generator, steps):
    for _ in range(steps):
        (emb(_ids(generator)).sum(dim=(1, 2)) ** 2).mean().backward()
        emb.after_step()


def _state(emb):
    return {key: value.detach().clone() for key, value in emb.state_dict().items()}


def _assert_state(emb, expected):
    for key, value in expected.items():
        assert torch.equal(emb.state_dict()[key], value), key


def _checkpointed_then_crashed(storage, more_steps=3):
    """A run that checkpointed (generation 1) and then trained on, killed before its next checkpoint: returns the
    checkpoint's record and the weights it holds."""
    emb, generator = _make(storage), torch.Generator().manual_seed(1)
    _steps(emb, generator, 2)
    record = emb.prepare_commit(1)
    emb.commit(1)
    saved = _state(emb)
    _steps(emb, generator, more_steps)
    for key in ("tables.0.weight", "tables.2.adagrad_sum", "tables.1.weight"):
        assert not torch.equal(emb.state_dict()[key], saved[key]), f"{key} never changed after the checkpoint"
    emb.close()   # the kill: no commit; the changed rows are in the files (the page cache) and in journal.1
    return record, saved


def test_a_run_killed_after_a_checkpoint_resumes_it_exactly_and_the_journal_holds_only_changed_rows(tmp_path):
    record, saved = _checkpointed_then_crashed(tmp_path)
    journal = tmp_path / "journal.1"
    row_bytes = 2 * 4 * 4   # weight and accumulator rows of 4 floats
    assert 0 < journal.stat().st_size < (50 + 300) * (row_bytes + 8) + 1024   # rows, not the tables or pages
    assert sorted(n for n in os.listdir(tmp_path) if ".gen" in n) == ["adagrad_sum_1.gen1.f32", "table_1.gen1.f32"]
    # A model without the storage (evaluation, serving) reads the checkpoint's tables, undoing the changes in its copy
    tables = read_checkpoint_tables([record], "step_2")
    for t in range(3):
        assert torch.equal(tables[f"tables/{t}"], saved[f"tables.{t}.weight"])
        assert torch.equal(tables[f"tables/{t}/adagrad_sum"], saved[f"tables.{t}.adagrad_sum"])
    on_disk = np.fromfile(tmp_path / "table_0.f32", dtype=np.float32).reshape(50, 4)
    assert not np.array_equal(on_disk, saved["tables.0.weight"].numpy())   # ...and left the files as they were

    resumed = _make(tmp_path)
    with pytest.raises(TableStorageError, match="holds the tables of checkpoint generation 1 .* resume it"):
        _steps(resumed, torch.Generator().manual_seed(5), 1)   # training from fresh weights would overwrite them
    resumed.restore(1, record["token"])
    _assert_state(resumed, saved)
    assert not journal.exists()
    resumed.restore(1, record["token"])   # idempotent
    _assert_state(resumed, saved)


def test_a_torn_or_damaged_last_record_is_ignored(tmp_path):
    record, saved = _checkpointed_then_crashed(tmp_path / "s")
    # A record for a row the run never changed after the checkpoint, as the crash would leave it: cut short, or with
    # its last byte damaged. Applied, it would set the row to 7.
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    fake = table_storage.UndoJournal(str(scratch), 1)
    fake.add(0, np.array([49]), np.full((1, 4), 7.0, np.float32))
    fake.sync()
    fake.close()
    whole = (scratch / "journal.1").read_bytes()[table_storage._HEADER.size:]
    for tail in (whole[:len(whole) - 3], whole[:-5] + bytes([whole[-5] ^ 1]) + whole[-4:]):
        storage = tmp_path / f"copy{len(tail)}"
        shutil.copytree(tmp_path / "s", storage)
        with open(storage / "journal.1", "ab") as f:
            f.write(tail)
        record = dict(record, storage_dir=str(storage))
        assert torch.equal(read_checkpoint_tables([record], "ckpt")["tables/0"], saved["tables.0.weight"])
        resumed = _make(storage)
        resumed.restore(1, record["token"])
        _assert_state(resumed, saved)
        resumed.close()


def test_a_crash_between_the_checkpoints_rename_and_its_commit(tmp_path):
    emb, generator = _make(tmp_path / "s"), torch.Generator().manual_seed(1)
    _steps(emb, generator, 2)
    first = emb.prepare_commit(1)
    emb.commit(1)
    at_first = _state(emb)
    _steps(emb, generator, 2)
    second = emb.prepare_commit(2)   # the checkpoint directory of generation 2 is renamed into place, then the kill
    at_second = _state(emb)
    emb.close()
    shutil.copytree(tmp_path / "s", tmp_path / "t")

    resumed = _make(tmp_path / "s")   # resuming the newest checkpoint completes its commit: the files are its tables
    resumed.restore(2, second["token"])
    _assert_state(resumed, at_second)
    assert table_storage.read_manifest(str(tmp_path / "s"))["generation"] == 2
    assert not (tmp_path / "s" / "journal.1").exists() and not (tmp_path / "s" / "table_1.gen1.f32").exists()
    resumed.close()

    older = _make(tmp_path / "t")   # resuming the one before instead rolls back to it...
    older.restore(1, first["token"])
    _assert_state(older, at_first)
    older.close()
    newer = _make(tmp_path / "t")   # ...after which the newer checkpoint's tables are gone: refused, never mixed
    with pytest.raises(TableStorageError, match="generation 2, the storage holds generation 1: an older checkpoint"):
        newer.restore(2, second["token"])


def test_an_older_checkpoint_or_another_runs_is_refused(tmp_path):
    emb, generator = _make(tmp_path), torch.Generator().manual_seed(1)
    records = []
    for generation in (1, 2):
        _steps(emb, generator, 1)
        records.append(emb.prepare_commit(generation))
        emb.commit(generation)
    emb.close()
    with pytest.raises(TableStorageError, match="older checkpoint"):
        read_checkpoint_tables([records[0]], "step_1")
    resumed = _make(tmp_path)
    with pytest.raises(TableStorageError, match=f"{tmp_path}: the checkpoint needs its tables at generation 1, the "
                                                f"storage holds generation 2: an older checkpoint"):
        resumed.restore(1, records[0]["token"])
    with pytest.raises(TableStorageError, match="generation 2, the storage holds generation 2"):
        resumed.restore(2, "a token of another run")   # the same number from another run's storage
    resumed.restore(2, records[1]["token"])


def test_two_runs_on_one_storage_are_refused(tmp_path):
    first = _make(tmp_path)
    with pytest.raises(TableStorageError, match=rf"{tmp_path}/lock: .* in use by another process \(pid {os.getpid()}"):
        _make(tmp_path)
    with pytest.raises(TableStorageError, match="in use by another process"):   # a reader too, while it trains
        read_checkpoint_tables([{"storage_dir": str(tmp_path)}], "step_1")
    first.close()
    _make(tmp_path).close()


def _no_space(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_a_full_disk_while_journaling_stops_the_step_before_any_row_changes(tmp_path, monkeypatch):
    emb, generator = _make(tmp_path), torch.Generator().manual_seed(1)
    _steps(emb, generator, 1)
    emb.prepare_commit(1)
    emb.commit(1)
    before = _state(emb)
    emb(_ids(generator))   # creates journal.1
    header = (tmp_path / "journal.1").stat().st_size
    monkeypatch.setattr(table_storage, "write_at", _no_space)
    with pytest.raises(TableStorageError, match=r"journal\.1: cannot write the undo journal, so the step was not "
                                                r"taken.*No space left on device"):
        _steps(emb, generator, 1)
    monkeypatch.undo()
    _assert_state(emb, before)   # no weight, no accumulator, no table in RAM moved
    assert (tmp_path / "journal.1").stat().st_size == header
    _steps(emb, generator, 2)    # with space again the rows of the failed step are journaled when they change
    emb.close()
    resumed = _make(tmp_path)
    resumed.restore(1)
    _assert_state(resumed, before)


def test_a_full_disk_while_preparing_a_checkpoint_keeps_the_previous_one(tmp_path, monkeypatch):
    emb, generator = _make(tmp_path), torch.Generator().manual_seed(1)
    _steps(emb, generator, 1)
    emb.prepare_commit(1)
    emb.commit(1)
    before = _state(emb)
    _steps(emb, generator, 1)
    monkeypatch.setattr(table_storage, "write_at", _no_space)
    with pytest.raises(TableStorageError, match=r"table_1.gen2.f32: cannot write the table \(No space left"):
        emb.prepare_commit(2)
    monkeypatch.undo()
    assert not [n for n in os.listdir(tmp_path) if "gen2" in n]   # nothing half-written
    assert table_storage.read_manifest(str(tmp_path))["prepared"] is None
    emb.close()
    resumed = _make(tmp_path)
    resumed.restore(1)
    _assert_state(resumed, before)


def test_a_damaged_storage_is_refused_at_resume_naming_the_file(tmp_path):
    record, _ = _checkpointed_then_crashed(tmp_path / "s")
    for damage, error in [
            (lambda d: open(d / "table_2.f32", "r+b").truncate(100), r"table_2.f32: 100 bytes, a \[300, 4\]"),
            (lambda d: os.remove(d / "adagrad_sum_0.f32"), "adagrad_sum_0.f32: missing from a storage that holds"),
            (lambda d: open(d / "table_1.gen1.f32", "r+b").truncate(10), r"table_1.gen1.f32: 10 bytes, a \[7, 4\]"),
            (lambda d: os.remove(d / "adagrad_sum_1.gen1.f32"), "adagrad_sum_1.gen1.f32: missing")]:
        storage = tmp_path / f"damaged{len(os.listdir(tmp_path))}"
        shutil.copytree(tmp_path / "s", storage)
        damage(storage)
        with pytest.raises(TableStorageError, match=error):
            _make(storage).restore(1, record["token"])
        with pytest.raises(TableStorageError, match=error.replace(" from a storage that holds", "")):
            read_checkpoint_tables([dict(record, storage_dir=str(storage))], "step_2")


# ------------------------------------------------------------------------------------------ through the recipe
def _train(dataset, tmp_path, name, *more):
    """Tables 5 and 10 rows in RAM, the others in files (the budget: a step's working set and 1000 bytes)."""
    from dlrm.train import main
    budget = (table_files.step_working_set(256, [1] * 8, 8) + 1000) / 2 ** 30
    return main(["--base_device", "cpu", "--dataset", str(dataset), "--batch_size", "256", "--embedding_dim", "8",
                 "--bottom_mlp_sizes", "16,8", "--top_mlp_sizes", "16,1", "--adagrad", "--lr", "0.05", "--nofp16",
                 "--embedding_memory_budget_gb", str(budget), "--embedding_storage_dir", str(tmp_path / f"{name}_t"),
                 "--save_checkpoint_path", str(tmp_path / name), "--log_path", str(tmp_path / f"{name}.json"),
                 "--max_steps", "12", "--checkpoint_every_steps", "4", *more])


def test_a_full_disk_at_a_checkpoint_stops_the_run_and_the_previous_checkpoint_resumes_exactly(
        small_dataset, tmp_path, monkeypatch):
    from dlrm.train import main
    straight = _train(small_dataset, tmp_path, "straight")
    assert sorted(n for n in os.listdir(tmp_path / "straight_t") if ".gen" in n) == [
        "adagrad_sum_6.gen3.f32", "adagrad_sum_7.gen3.f32", "table_6.gen3.f32", "table_7.gen3.f32"]
    real_write_at = table_storage.write_at

    def full_at_generation_2(fd, data, offset):   # the disk fills while the 2nd checkpoint writes a table in RAM
        if ".gen2.f32" in os.readlink(f"/proc/self/fd/{fd}"):
            _no_space()
        return real_write_at(fd, data, offset)
    monkeypatch.setattr(table_storage, "write_at", full_at_generation_2)
    with pytest.raises(TableStorageError, match=r"checkpoint not written: .*table_6.gen2.f32: cannot write the "
                                                r"table \(No space left"):
        _train(small_dataset, tmp_path, "full")
    monkeypatch.undo()
    assert [step for step, _ in list_checkpoints(tmp_path / "full")] == [4]
    resumed = _train(small_dataset, tmp_path, "full", "--load_checkpoint_path", str(tmp_path / "full"))
    assert resumed["auc"] == straight["auc"] and resumed["train_loss"] == straight["train_loss"]
    left, right = (read_tensors(tmp_path / name / checkpoint_name(12)) for name in ("straight", "full"))
    assert "tables/0" in left and "tables/7/adagrad_sum" in left and "dense/top_mlp.layers.0.weight" in left
    for key, value in left.items():
        assert torch.equal(value, right[key]), key
    # A model with every table in RAM (no --embedding_memory_budget_gb) evaluates it from the storage
    tested = main(["--base_device", "cpu", "--dataset", str(small_dataset), "--embedding_dim", "8",
                   "--bottom_mlp_sizes", "16,8", "--top_mlp_sizes", "16,1", "--nofp16", "--mode", "test",
                   "--load_checkpoint_path", str(tmp_path / "full"), "--log_path", str(tmp_path / "test.json")])
    assert tested["auc"] == straight["auc"]
    from dlrm import serving   # ...and so does serving (deploy, export)
    model, _, _ = serving.load_model(str(tmp_path / "full"))
    assert torch.equal(model.state_dict()["embeddings.tables.3.weight"], left["tables/3"])


@pytest.mark.slow
def test_sigkill_then_resume_with_tables_in_files_equals_the_uninterrupted_run(small_dataset, tmp_path):
    """As test_checkpoint_resume's kill test, with every table but the two smallest in files and Adagrad: the kill
    lands after a checkpoint, mid-epoch, with rows changed since (undone from the journal at resume)."""
    from conftest import train_args
    from test_checkpoint_resume import assert_same_weights, run_and_kill, run_to_end, summary
    every, max_steps = 7, 60
    budget = (table_files.step_working_set(256, [1] * 8, 16) + 2000) / 2 ** 30   # tables of 5 and 10 rows in RAM

    def args(name, *more):
        return train_args(small_dataset, tmp_path / f"{name}.json", "--shuffle_batch_order", "--epochs", "10",
                          "--max_steps", str(max_steps), "--test_freq", "50", "--adagrad", "--lr", "0.05",
                          "--embedding_memory_budget_gb", str(budget), "--embedding_storage_dir",
                          str(tmp_path / f"{name}_tables"), "--save_checkpoint_path", str(tmp_path / name),
                          "--checkpoint_every_steps", str(every), *more)

    run_to_end(args("straight"), 1)
    run_and_kill(args("crashed"), 1, str(tmp_path / "crashed"))
    (step, newest), = list_checkpoints(tmp_path / "crashed")[-1:]
    assert step % every == 0 and step < max_steps
    with open(os.path.join(newest, "meta.json")) as f:
        assert '"table_storage"' in f.read()
    assert not os.path.exists(os.path.join(newest, "model", "table_0"))   # the tables are not copied
    run_to_end(args("crashed", "--load_checkpoint_path", str(tmp_path / "crashed")), 1)
    straight, resumed = summary(tmp_path / "straight.json"), summary(tmp_path / "crashed.json")
    for key in ("auc", "test_loss", "train_loss", "best_auc", "test_samples", "global_step"):
        assert resumed[key] == straight[key], key
    final = checkpoint_name(max_steps)
    assert_same_weights(tmp_path / "straight" / final, tmp_path / "crashed" / final)
    assert "tables/7/adagrad_sum" in read_tensors(tmp_path / "crashed" / final)


def test_a_checkpoint_of_tables_in_ram_resumes_into_tables_in_files(small_dataset, tmp_path):
    """The tables come from the checkpoint into a new storage (then journaled from there): the same run."""
    from dlrm.train import main

    def run(name, budget, *more):
        return main(["--base_device", "cpu", "--dataset", str(small_dataset), "--batch_size", "256",
                     "--embedding_dim", "8", "--bottom_mlp_sizes", "16,8", "--top_mlp_sizes", "16,1", "--adagrad",
                     "--lr", "0.05", "--nofp16", "--embedding_memory_budget_gb", str(budget),
                     "--save_checkpoint_path", str(tmp_path / name), "--log_path", str(tmp_path / f"{name}.json"),
                     "--max_steps", "10", *more])
    in_files = ["--embedding_storage_dir", str(tmp_path / "tables")]
    straight = run("straight", 100)                   # every table in RAM, no storage: tables in the checkpoint
    run("switched", 100, "--max_steps", "5")
    assert os.path.isdir(tmp_path / "switched" / checkpoint_name(5) / "model" / "table_7")
    all_in_files = table_files.step_working_set(256, [1] * 8, 8) / 2 ** 30
    resumed = run("switched", all_in_files, "--load_checkpoint_path", str(tmp_path / "switched"), *in_files)
    assert resumed["auc"] == straight["auc"] and resumed["train_loss"] == straight["train_loss"]
    assert len([n for n in os.listdir(tmp_path / "tables") if n.endswith(".f32")]) == 16
    left, right = (read_tensors(tmp_path / name / checkpoint_name(10)) for name in ("straight", "switched"))
    assert torch.equal(left["tables/3"], right["tables/3"])
    assert torch.equal(left["dense/embeddings.tables.3.adagrad_sum"], right["tables/3/adagrad_sum"])


def test_a_model_without_files_reads_whole_tables_from_the_row_shards_of_several_processes(tmp_path):
    """Each process's storage holds a row range of every table (``row_offsets``): a RAM model gets whole tables."""
    records, shards = [], []
    for rank, (start, rows) in enumerate([(0, 30), (30, 20)]):   # table 0 (50 rows) split at row 30
        shard = TieredTableEmbeddings([rows, 3], 4, [True, False], storage_dir=str(tmp_path / f"rank_{rank}"),
                                      adagrad=True)
        shard.row_offsets, shard.global_table_sizes = [start, 3 * rank], [50, 6]
        records.append(shard.prepare_commit(1))
        shard.commit(1)
        shards.append(_state(shard))
        shard.close()
    tables = read_checkpoint_tables(records, "step_1")
    assert torch.equal(tables["tables/0"], torch.cat([shards[0]["tables.0.weight"], shards[1]["tables.0.weight"]]))
    assert torch.equal(tables["tables/1"], torch.cat([shards[0]["tables.1.weight"], shards[1]["tables.1.weight"]]))
    assert tables["tables/0/adagrad_sum"].shape == (50, 4)
