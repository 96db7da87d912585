"""CPU defaults of dlrm.py / dcnv2.py (issue 18): NVIDIA's --batch_size 65536 (14.8 GB and 2 steps per epoch on a
100k-row CPU run) is replaced on a CPU unless given; a GPU and explicit flags keep NVIDIA's values. The selection
tests are arithmetic on parsed flags (no TensorFlow step); one short run checks the first line of output."""
import argparse

import pytest

from conftest import make_dataset, tiny_model_flags
from dlrm_dcnv2 import cpu_defaults
from dlrm_dcnv2.cli import read_flags
from dlrm_dcnv2.data import DataConfig
from dlrm_dcnv2.train import main
from recsys_common.logger import read_log

GIB = 2 ** 30
DIMS = [128] * 26  # NVIDIA's DLRM tables


def _apply(argv, model="dlrm", on_gpu=False, world_size=1, memory=23 * GIB, rows=100_000, monkeypatch=None):
    """The flags as the run's config holds them: as typed, overlaid with the CPU defaults' choices."""
    if monkeypatch is not None:
        monkeypatch.setattr(cpu_defaults, "train_rows", lambda data: rows)
    args, given = read_flags(["--dataset_path", "/nonexistent"] + argv, model)
    lr = {"dlrm": 24.0, "dcnv2": 0.0001}[model]
    chosen, line = cpu_defaults.choose_cpu_defaults(args, model, given, None, on_gpu=on_gpu, world_size=world_size,
                                                    embedding_dims=DIMS, gpu_learning_rate=lr, memory_bytes=memory)
    return argparse.Namespace(**{**vars(args), **chosen}), line


def test_cpu_picks_batch_rate_and_schedule_for_100k_rows(monkeypatch):
    args, line = _apply([], monkeypatch=monkeypatch)
    # 100k rows / 100 steps -> 1000 -> the floor 1024; SGD: 24 x 1024/65536; schedule over 98 steps
    assert (args.batch_size, args.learning_rate) == (1024, 0.375)
    assert (args.warmup_steps, args.decay_start_step, args.decay_steps) == (12, 73, 37)
    assert args.valid_batch_size == 8192  # 1/8 of 23 GiB at 196 KB per row
    assert line.startswith("dlrm.py: CPU defaults: --batch_size 1024 (the floor 1024; NVIDIA's GPU default is 65536)")
    # DCNv2 (Adam): the square-root rule
    args, _ = _apply([], model="dcnv2", monkeypatch=monkeypatch)
    assert args.learning_rate == pytest.approx(0.0001 / 8)


def test_gpu_keeps_nvidia_values(monkeypatch):
    args, line = _apply([], on_gpu=True, monkeypatch=monkeypatch)
    assert line is None and (args.batch_size, args.valid_batch_size, args.learning_rate) == (65536, 65536, 24.0)
    assert (args.warmup_steps, args.decay_start_step, args.decay_steps) == (8000, 48000, 24000)


def test_given_flags_win(monkeypatch):
    # --batch_size given, even NVIDIA's own value: batch, rate and schedule stay; the unset valid batch is chosen
    args, line = _apply(["--batch_size", "65536"], monkeypatch=monkeypatch)
    assert (args.batch_size, args.learning_rate, args.warmup_steps) == (65536, 24.0, 8000)
    assert line == "dlrm.py: CPU defaults: --valid_batch_size 8192. Pass --batch_size (and the rest) to choose."
    args, line = _apply(["--learning_rate", "2", "--warmup_steps", "5", "--valid_batch_size", "777"],
                        monkeypatch=monkeypatch)
    assert (args.batch_size, args.learning_rate, args.warmup_steps, args.valid_batch_size) == (1024, 2.0, 5, 777)
    assert "--learning_rate 2 as given" in line and "--warmup_steps" not in line and "--decay_steps 37" in line


def test_dataset_smaller_than_a_batch_and_memory_bound(monkeypatch):
    # 600 rows over 4 ranks: one step of all of them, a multiple of 4
    args, line = _apply([], rows=600, world_size=4, monkeypatch=monkeypatch)
    assert args.batch_size == 600 and "whole training set of 600 rows" in line
    # a large dataset on a 4 GiB laptop: memory binds (1/8 of 4 GiB at 196 KB per row -> 2048)
    args, line = _apply([], rows=10 ** 8, memory=4 * GIB, monkeypatch=monkeypatch)
    assert args.batch_size == 2048 and "GiB RAM" in line


def test_rows_are_counted_from_the_files(tmp_path):
    data = make_dataset(tmp_path / "d", train_rows=3000, test_rows=100)
    def data_of(argv):
        return DataConfig.from_flags(read_flags(argv, "dlrm")[0])
    assert cpu_defaults.train_rows(data_of(["--dataset_path", data])) == 3000
    assert cpu_defaults.train_rows(data_of(["--dataset_type", "synthetic"])) is None


def test_run_prints_the_choice_first(small_dataset, tmp_path, capsys):
    flags = tiny_model_flags("dlrm")
    for flag in ("--batch_size", "--valid_batch_size", "--warmup_steps"):
        i = flags.index(flag)
        del flags[i:i + 2]
    log = str(tmp_path / "log.json")
    results = main(flags + ["--dataset_path", small_dataset, "--cpu", "--seed", "1", "--log_path", log], model="dlrm")
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("dlrm.py: CPU defaults: --batch_size 1024 (the floor 1024;")
    assert "--learning_rate 1 as given" in first  # tiny_model_flags sets DLRM's rate
    params = read_log(log, kinds=("LOG",))[0]["data"]
    assert (params["batch_size"], params["learning_rate"]) == (1024, 1.0)
    assert results["global_step"] == 8  # 8192 rows / 1024, not 0 steps of NVIDIA's 65536
