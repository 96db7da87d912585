"""Embedding tables in files (``--embedding_memory_budget_gb``, ``dlrm.model.table_files``; issue 32, item 1): the
same weights as in RAM bit for bit, Adagrad as torch's, a bounded resident set, exact resume, clear file errors."""
import errno
import os

import pytest
import torch

from dlrm.model import MultiTableEmbeddings
from dlrm.model import table_files
from dlrm.model.table_files import TableStorageError, TieredTableEmbeddings, plan_tables

SIZES = [50, 7, 300]
HOTNESS = [1, 3, 2]


def _ids(generator, batch=16):
    return torch.cat([torch.randint(0, 50, (batch, 1), generator=generator),
                      torch.randint(-1, 7, (batch, 3), generator=generator),
                      torch.randint(-1, 300, (batch, 2), generator=generator)], 1)


def _train(in_files, storage, adagrad, steps=5):
    torch.manual_seed(0)
    emb = TieredTableEmbeddings(SIZES, 4, in_files, storage_dir=str(storage), adagrad=adagrad, hotness=HOTNESS)
    initial = {k: v.clone() for k, v in emb.state_dict().items()}
    emb.lr = 0.1
    generator = torch.Generator().manual_seed(1)
    for _ in range(steps):
        (emb(_ids(generator)).sum(dim=(1, 2)) ** 2).mean().backward()
        emb.release_pages()
    return emb, initial


@pytest.mark.parametrize("adagrad", [False, True], ids=["sgd", "adagrad"])
def test_tables_in_files_train_bit_for_bit_as_in_ram(tmp_path, adagrad):
    in_ram, initial = _train([False] * 3, tmp_path / "none", adagrad)
    for in_files in ([True] * 3, [True, False, True]):
        in_file, _ = _train(in_files, tmp_path / "".join("f" if f else "r" for f in in_files), adagrad)
        assert len(in_file.files) == sum(in_files) * (2 if adagrad else 1)
        for key, value in in_ram.state_dict().items():
            assert torch.equal(in_file.state_dict()[key], value), key
    for key in ("tables.0.weight", "tables.1.weight", "tables.2.weight"):
        assert not torch.equal(in_ram.state_dict()[key], initial[key]), f"{key} never moved: vacuous"
    files = sorted(n for n in os.listdir(tmp_path / "fff") if n.endswith(".f32"))
    assert files[:2] == (["adagrad_sum_0.f32", "adagrad_sum_1.f32"] if adagrad else ["table_0.f32", "table_1.f32"])


def test_adagrad_in_the_backward_equals_torch_adagrad_on_the_summed_gradient(tmp_path):
    torch.manual_seed(0)
    ours = TieredTableEmbeddings(SIZES, 4, [True] * 3, storage_dir=str(tmp_path), adagrad=True, eps=1e-10,
                                 hotness=HOTNESS)
    ours.lr = 0.05
    reference = MultiTableEmbeddings(SIZES, 4, sparse=True, hotness=HOTNESS)
    for table, source in zip(reference.tables, ours.tables):
        table.weight.data.copy_(source.weight.detach())
    optimizer = torch.optim.Adagrad(reference.parameters(), lr=0.05, eps=1e-10)
    generator = torch.Generator().manual_seed(3)
    for _ in range(4):
        ids = _ids(generator)
        (ours(ids) ** 2).sum().backward()
        optimizer.zero_grad()
        (reference(ids) ** 2).sum().backward()
        optimizer.step()
    for table, source in zip(reference.tables, ours.tables):
        torch.testing.assert_close(source.weight.detach(), table.weight.detach(), rtol=0, atol=1e-6)


def test_the_budget_keeps_the_smallest_tables_in_ram():
    assert plan_tables([10, 1000, 100], 4, None, False) == [False, False, False]
    assert plan_tables([10, 1000, 100], 4, (10 + 100) * 16, False) == [False, True, False]
    assert plan_tables([10, 1000, 100], 4, (10 + 100) * 16, True) == [False, True, True]   # Adagrad: twice the bytes
    assert plan_tables([10, 1000, 100], 4, 0, False) == [True, True, True]
    assert plan_tables([10, 1000, 100], 4, (10 + 100) * 16, False, reserved_bytes=100) == [False, True, True]


def _rss_file_bytes():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssFile:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no RssFile in /proc/self/status")


def test_the_resident_set_stays_bounded_while_every_row_is_touched(tmp_path):
    """Two 48 MiB tables in files, every row updated: without releasing, the mapped pages would all stay resident."""
    rows = 3 << 20   # x 4 floats x 4 bytes = 48 MiB per table
    emb = TieredTableEmbeddings([rows, rows], 4, [True, True], storage_dir=str(tmp_path))
    emb.lr = 0.01
    before = _rss_file_bytes()
    for start in range(0, rows, 1 << 18):
        ids = torch.arange(start, min(start + (1 << 18), rows)).repeat(2, 1).T.contiguous()
        emb(ids).sum().backward()
        emb.release_pages()
    assert _rss_file_bytes() - before < 16 << 20   # pages of 96 MiB of tables, minus what the kernel keeps mapped
    assert float(emb.tables[1].weight[rows - 1].abs().sum()) > 0


def test_the_resident_set_stays_bounded_while_evaluating_every_row(tmp_path):
    """Lookups without gradients (evaluation, --mode test) drop the pages they map as training does."""
    rows = 3 << 20   # x 4 floats x 4 bytes = 48 MiB per table
    emb = TieredTableEmbeddings([rows, rows], 4, [True, True], storage_dir=str(tmp_path))
    emb.release_pages()
    before = _rss_file_bytes()
    with torch.no_grad():
        for start in range(0, rows, 1 << 18):
            emb(torch.arange(start, min(start + (1 << 18), rows)).repeat(2, 1).T.contiguous())
    assert _rss_file_bytes() - before < 16 << 20   # 96 MiB of pages were read


def test_hot_pages_stay_mapped_under_the_limit_and_are_dropped_above_it(tmp_path):
    rows = 1 << 20   # 16 MiB per table of 4 floats
    emb = TieredTableEmbeddings([rows], 4, [True], storage_dir=str(tmp_path), mapped_limit_bytes=8 << 20)
    emb.release_pages()
    before = _rss_file_bytes()
    with torch.no_grad():
        emb(torch.arange(0, 1 << 18)[:, None])          # 4 MiB of pages: under the limit, they stay mapped
    emb.after_step()
    kept = _rss_file_bytes() - before
    assert 3 << 20 < kept < 6 << 20, kept
    with torch.no_grad():
        emb(torch.arange(0, rows)[:, None])             # 16 MiB: dropped whenever a piece passes the limit
    emb.after_step()
    assert _rss_file_bytes() - before < 8 << 20         # all 16 MiB would still be mapped without the budget
    emb.release_pages()
    assert _rss_file_bytes() - before < 1 << 20


def test_file_errors_name_the_file(tmp_path, monkeypatch):
    TieredTableEmbeddings(SIZES, 4, [True] * 3, storage_dir=str(tmp_path / "a"))
    with open(tmp_path / "a" / "table_2.f32", "r+b") as f:
        f.truncate(100)   # a table cut short (a full disk, a copy interrupted)
    with pytest.raises(TableStorageError, match="table_2.f32: 100 bytes"):
        TieredTableEmbeddings(SIZES, 4, [True] * 3, storage_dir=str(tmp_path / "a"))
    with pytest.raises(TableStorageError, match="tables of another model"):
        TieredTableEmbeddings([50, 7, 301], 4, [True] * 3, storage_dir=str(tmp_path / "a"))
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "notes.txt").write_text("a user's file")
    with pytest.raises(TableStorageError, match="not empty"):
        TieredTableEmbeddings(SIZES, 4, [True] * 3, storage_dir=str(tmp_path / "b"))
    assert os.listdir(tmp_path / "b") == ["notes.txt"]   # refused before anything of ours was written there

    def no_space(fd, offset, length):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(table_files.os, "posix_fallocate", no_space)
    with pytest.raises(TableStorageError, match=r"table_0.f32: cannot reserve 800 bytes .*No space left"):
        TieredTableEmbeddings(SIZES, 4, [True] * 3, storage_dir=str(tmp_path / "c"))
    assert sorted(os.listdir(tmp_path / "c")) == ["lock", "tables.json"]   # no half-made table file
    monkeypatch.undo()
    TieredTableEmbeddings(SIZES, 4, [True] * 3, storage_dir=str(tmp_path / "c"))   # with space again: made anew
    with pytest.raises(ValueError, match="smaller than one batch's rows: 4096 rows x 6 ids"):
        table_files.check_budget_holds_a_batch(2**20, 4096, HOTNESS, dim=4)
    table_files.check_budget_holds_a_batch(2**28, 4096, HOTNESS, dim=4)   # 256 MiB: holds
    with pytest.raises(IndexError, match="categorical feature 2: id 300 outside its table of 300 rows"):
        TieredTableEmbeddings(SIZES, 4, [False] * 3, hotness=HOTNESS)(torch.tensor([[0, 1, -1, -1, 300, -1]]))


def _run(dataset, tmp_path, name, budget, *more):
    """``budget``: "all" (every table in files: the budget is one step's working set) or GiB."""
    from dlrm.train import main
    if budget == "all":
        budget = table_files.step_working_set(256, [1] * 8, 8) / 2**30
    return main(["--base_device", "cpu", "--dataset", str(dataset), "--batch_size", "256", "--embedding_dim", "8",
                 "--bottom_mlp_sizes", "16,8", "--top_mlp_sizes", "16,1", "--adagrad", "--lr", "0.05", "--nofp16",
                 "--embedding_memory_budget_gb", str(budget), "--embedding_storage_dir", str(tmp_path / f"{name}_t"),
                 "--save_checkpoint_path", str(tmp_path / name), "--log_path", str(tmp_path / f"{name}.json"),
                 "--max_steps", "12", *more])


def test_training_with_tables_in_files_equals_ram_and_resumes_exactly(small_dataset, tmp_path):
    from dlrm.checkpointing import checkpoint_name, read_tensors
    in_ram = _run(small_dataset, tmp_path, "ram", 100)
    in_files = _run(small_dataset, tmp_path, "files", "all")
    assert in_files["auc"] == in_ram["auc"] and in_files["train_loss"] == in_ram["train_loss"]
    assert len([n for n in os.listdir(tmp_path / "files_t") if n.endswith(".f32")]) == 2 * 8   # 8 tables, each with its accumulator
    _run(small_dataset, tmp_path, "resumed", "all", "--max_steps", "5")
    resumed = _run(small_dataset, tmp_path, "resumed", "all", "--load_checkpoint_path", str(tmp_path / "resumed"))
    assert resumed["auc"] == in_files["auc"]
    left = read_tensors(tmp_path / "files" / checkpoint_name(12))
    right = read_tensors(tmp_path / "resumed" / checkpoint_name(12))
    assert any(k.endswith("adagrad_sum") for k in left)
    for key, value in left.items():
        assert torch.equal(value, right[key]), key


def test_the_benchmark_runs_the_same_model_from_ram_and_from_files(tmp_path):
    import json
    import subprocess
    import sys
    from conftest import RECIPE_DIR, subprocess_env
    out = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, "benchmarks/table_files.py", "--file_gb", "0.01", "--ram_gb", "0.005",
                           "--budget_gb", "0.015", "--steps", "3", "--warmup", "1", "--batch", "64",
                           "--embedding_dim", "8", "--checkpoint_every", "3", "--storage", str(tmp_path),
                           "--output", str(out)],
                          cwd=RECIPE_DIR, env=subprocess_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["in_ram"]["in_files_gb"] == 0 and report["in_files"][0]["in_files_gb"] > 0.005
    in_files = report["in_files"][0]   # the tables in RAM and the MLPs (2.5 MB); with the tables in files: 10.6 MB
    assert len(in_files["checkpoint_written_mb"]) == 1 and in_files["checkpoint_written_mb"][0] < 7
    assert in_files["journal_mb_per_step"] > 0 and "journal_mb_per_step" in report["in_ram"]
    assert os.listdir(tmp_path) == ["bench.json"]   # the run removed the table files it made


def test_the_checkpoints_nan_check_reads_tables_in_ram_in_blocks(tmp_path, monkeypatch):
    """The NaN/inf check before a checkpoint made temporaries the size of each table kept in RAM (isfinite of a whole
    3M-row table: +3 GB resident, measured at 2x RAM); it checks row blocks of at most FINITE_CHECK_ELEMENTS now,
    and still finds a NaN in the last block."""
    monkeypatch.setattr(table_files, "FINITE_CHECK_ELEMENTS", 64)
    emb = TieredTableEmbeddings([100, 50], 4, [False, True], storage_dir=str(tmp_path), adagrad=True)
    checked, isfinite = [], torch.isfinite
    monkeypatch.setattr(torch, "isfinite", lambda t: checked.append(t.numel()) or isfinite(t))
    assert bool(emb.changed_rows_finite())
    assert checked and max(checked) <= 64
    with torch.no_grad():
        emb.tables[0].weight[99, 3] = float("nan")
    assert not bool(emb.changed_rows_finite())
