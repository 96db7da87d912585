"""CPU defaults of main.py (issue 18): NVIDIA's --global_batch_size 131072 (a 105k-row CPU run refused: no full
batch) is replaced on a CPU unless given; a GPU and explicit flags keep NVIDIA's values. The selection tests are
arithmetic on parsed flags (no TensorFlow step); one short run checks the first line of output."""
import pytest

from recsys_common.logger import read_log
from wide_deep import cli
from wide_deep.train import main

GIB = 2 ** 30
WIDTH = 8000   # floats per row, about NVIDIA's model (5 x 1024 hidden units and its embeddings)


def _apply(argv, on_cpu=True, world_size=1, memory=23 * GIB, rows=105_386, monkeypatch=None):
    """The run's frozen config (``args``) and the CPU-defaults line, as ``main.py`` settles them."""
    monkeypatch.setattr(cli, "model_width", lambda spec, path, hidden: WIDTH)
    argv = ["--dataset_path", "/nonexistent"] + argv
    flags, given = cli.parse_flags(argv)
    return cli.build_config(flags, given, on_cpu=on_cpu, world_size=world_size, spec=None, memory_bytes=memory,
                            train_rows=rows)


def test_cpu_picks_batch_and_both_rates_for_105k_rows(monkeypatch):
    args, line = _apply([], monkeypatch=monkeypatch)
    # 105,386 rows / 100 steps -> 1053 -> 1024; FTRL and RMSprop: the square-root rule, sqrt(1024/131072) = 1/11.3
    assert args.global_batch_size == 1024
    assert args.deep_learning_rate == pytest.approx(0.00012 * (1024 / 131072) ** 0.5, rel=5e-3)
    assert args.linear_learning_rate == pytest.approx(0.02 * (1024 / 131072) ** 0.5, rel=5e-3)
    assert args.eval_batch_size == 8192   # 1/8 of 23 GiB at 27.8 B x 8000 per row
    assert line.startswith("main.py: CPU defaults: --global_batch_size 1024 (at least 100 steps over 105386 training "
                           "rows per epoch; NVIDIA's GPU default is 131072) and --deep_learning_rate 1.06e-05")
    assert args.deep_warmup_epochs == 6   # in epochs: unchanged


def test_gpu_keeps_nvidia_values(monkeypatch):
    args, line = _apply([], on_cpu=False, monkeypatch=monkeypatch)
    assert line is None
    assert (args.global_batch_size, args.eval_batch_size, args.deep_learning_rate, args.linear_learning_rate) == \
        (131072, 131072, 0.00012, 0.02)


def test_given_flags_win(monkeypatch):
    args, line = _apply(["--global_batch_size", "131072", "--eval_batch_size", "131072"], monkeypatch=monkeypatch)
    assert line is None and (args.global_batch_size, args.deep_learning_rate) == (131072, 0.00012)
    args, line = _apply(["--linear_learning_rate", "0.1"], monkeypatch=monkeypatch)
    assert (args.global_batch_size, args.linear_learning_rate) == (1024, 0.1)
    assert "--linear_learning_rate" not in line and "--deep_learning_rate 1.06e-05" in line


def test_dataset_smaller_than_a_batch(monkeypatch):
    # the 105k-row set was refused by NVIDIA's 131072; 700 rows over 2 ranks are one step of all of them
    args, line = _apply([], rows=700, world_size=2, monkeypatch=monkeypatch)
    assert args.global_batch_size == 700 and "whole training set of 700 rows" in line
    args, line = _apply([], rows=10 ** 9, memory=2 * GIB, monkeypatch=monkeypatch)
    assert args.global_batch_size == 1024 and "GiB RAM" in line   # memory binds: 2 GiB / 8 / 222 KB -> 1024


def test_run_prints_the_choice_first(etl_training, tmp_path, capsys):
    flags = ["--dataset_path", etl_training, "--cpu", "--num_epochs", "1", "--deep_warmup_epochs", "1",
             "--deep_hidden_units", "32", "32",
             "--results_dir", str(tmp_path / "results"), "--model_dir", str(tmp_path / "ckpt"), "--print_freq",
             "1000"]
    main(flags)
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("main.py: CPU defaults: --global_batch_size 1024 (the floor 1024;")
    params = read_log(str(tmp_path / "results" / "log.json"))[0]["data"]
    assert params["global_batch_size"] == 1024 and params["given_flags"] == sorted(
        ["dataset_path", "cpu", "num_epochs", "deep_warmup_epochs", "deep_hidden_units", "results_dir", "model_dir",
         "print_freq"])
