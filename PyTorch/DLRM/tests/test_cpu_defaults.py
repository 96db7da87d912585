"""CPU defaults of dlrm.scripts.main (issue 18): NVIDIA's --batch_size 32768 (3 steps per epoch, all inside the
warmup, on a 100k-row CPU run) is replaced on a CPU unless given; a GPU and explicit flags keep NVIDIA's values.
The selection tests are arithmetic on parsed flags; one short run checks the first line of output."""
import pytest

from conftest import SMALL_MODEL, make_dataset
from dlrm.data import dataset_info, default_synthetic_info
from dlrm import cli
from dlrm.train import main
from recsys_common.logger import read_log

GIB = 2 ** 30
INFO = default_synthetic_info([1000] * 26, 13)   # NVIDIA's 26 tables


def _apply(argv, device="cpu", world_size=1, memory=23 * GIB, rows=100_000, monkeypatch=None):
    """``(config, line)``: the configuration built with the CPU defaults chosen in, and the line printed."""
    monkeypatch.setattr(cli, "train_rows", lambda flag_values, info: rows)
    flag_values, given_flags = cli.read_flags(["--dataset", "/nonexistent"] + argv)
    return cli.settle(flag_values, given_flags, device_type=device, world_size=world_size, info=INFO,
                      memory_bytes=memory)


def test_cpu_picks_batch_rate_and_schedule_for_100k_rows(monkeypatch):
    args, line = _apply([], monkeypatch=monkeypatch)
    # 100k rows / 100 steps -> the floor 1024; SGD: 28 x 1024/32768; NVIDIA's schedule over 97 steps
    assert (args.batch_size, args.lr) == (1024, 0.875)
    assert (args.warmup_steps, args.decay_start_step, args.decay_steps) == (5, 48, 61)
    assert args.test_batch_size == 32768   # 1/8 of 23 GiB fits NVIDIA's test batch
    assert line.startswith("dlrm.scripts.main: CPU defaults: --batch_size 1024 (the floor 1024; NVIDIA's GPU "
                           "default is 32768) and --lr 0.875 (NVIDIA's 28 x 1024/32768)")
    args, _ = _apply(["--Adam_MLP_optimizer"], monkeypatch=monkeypatch)
    assert args.lr == pytest.approx(28 / 32 ** 0.5, rel=5e-3)   # Adam: the square-root rule


def test_gpu_keeps_nvidia_values(monkeypatch):
    args, line = _apply([], device="cuda", monkeypatch=monkeypatch)
    assert line is None and (args.batch_size, args.test_batch_size, args.lr) == (32768, 32768, 28.0)
    assert (args.warmup_steps, args.decay_start_step, args.decay_steps) == (6400, 64000, 80000)


def test_given_flags_win(monkeypatch):
    args, line = _apply(["--batch_size", "32768", "--test_batch_size", "32768"], monkeypatch=monkeypatch)
    assert line is None and (args.batch_size, args.lr, args.warmup_steps) == (32768, 28.0, 6400)
    args, line = _apply(["--lr", "2", "--decay_steps", "7"], monkeypatch=monkeypatch)
    assert (args.batch_size, args.lr, args.decay_steps, args.warmup_steps) == (1024, 2.0, 7, 5)
    assert "--lr 2 as given" in line and "--decay_steps" not in line


def test_dataset_smaller_than_a_batch_and_memory_bound(monkeypatch):
    args, line = _apply([], rows=600, world_size=4, monkeypatch=monkeypatch)
    assert args.batch_size == 600 and "whole training set of 600 rows" in line
    # 1/8 of 1 GiB at about 50 KB per row -> 2048 (memory binds before NVIDIA's 32768)
    args, line = _apply([], rows=10 ** 8, memory=GIB, monkeypatch=monkeypatch)
    assert args.batch_size == 2048 and "GiB RAM" in line and args.test_batch_size == 2048


def test_rows_are_counted_from_the_files(tmp_path):
    data = make_dataset(tmp_path / "d", train_rows=3000, test_rows=100)
    info = dataset_info(data)
    assert cli.train_rows(cli.read_flags(["--dataset", data])[0], info) == 3000
    assert cli.train_rows(cli.read_flags(["--dataset", data, "--dataset_subset", "0.5"])[0], info) == 1500


def test_run_prints_the_choice_first(small_dataset, tmp_path, capsys):
    log = tmp_path / "log.json"
    results = main(["--dataset", small_dataset, "--nofp16", "--embedding_type", "multi_table", "--seed", "1",
                    "--log_path", str(log), *SMALL_MODEL])
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("dlrm.scripts.main: CPU defaults: --batch_size 1024 (the floor 1024;")
    params = read_log(str(log), kinds=("LOG",))[0]["data"]
    assert (params["batch_size"], params["lr"]) == (1024, 0.875)
    assert results["global_step"] == 8   # 8192 rows / 1024, where NVIDIA's 32768 is refused (fewer rows than a batch)
