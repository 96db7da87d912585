"""CPU defaults (issues 18 and 35): NVIDIA's GPU values (-b 2**20, one step per epoch on ML-100k, 5.3 GB peak; a model
and Adam betas tuned for that batch) are replaced on CPU. With none of -b -l -f --layers --dropout -b1 -b2 given, the
published NeuMF's settings (``CPU_MODEL``, -b 256, -l 0.001); with one of them but not -b, NVIDIA's model at a batch
from the data and the RAM and a rate scaled from the one measured on CPUs (``CPU_ANCHOR_LEARNING_RATE`` at
``CPU_ANCHOR_BATCH``), not from NVIDIA's; explicit flags always win, and on a GPU nothing changes."""
import math

import pytest
import torch

from neumf import cli as ncf_cli, train as ncf_train, tune as ncf_tune
from recsys_common.logger import read_log

GIB = 2 ** 30
NVIDIA_MODEL = dict(factors=64, layers=[256, 256, 128, 64])
ML100K_ROWS = 99057 * 5  # convert.py's training positives of ML-100k, each with -n 4 negatives


def cpu_rate(batch):
    return ncf_cli.CPU_ANCHOR_LEARNING_RATE * math.sqrt(batch / ncf_cli.CPU_ANCHOR_BATCH)


def test_small_dataset_gets_many_steps_and_the_cpu_measured_rate():
    batch, lr, reason = ncf_cli.choose_cpu_batch(ML100K_ROWS, memory_bytes=23 * GIB, **NVIDIA_MODEL)
    assert batch == 4096 and ML100K_ROWS // batch >= ncf_cli.CPU_MIN_STEPS_PER_EPOCH  # 121 steps, not 1
    assert lr == pytest.approx(cpu_rate(4096), rel=1e-3)
    assert lr > 10 * 0.0045 * math.sqrt(4096 / 2 ** 20)   # NVIDIA's rate scaled down (0.00028) barely learned
    assert reason.startswith("-b 4096 (at least 100 steps over 495285 training rows")
    assert "measured on CPUs" in reason


def test_memory_bounds_a_large_dataset_and_nvidia_caps_it():
    ml20m_rows = 19_861_770 * 5
    batch, lr, reason = ncf_cli.choose_cpu_batch(ml20m_rows, memory_bytes=16 * GIB, **NVIDIA_MODEL)
    # 1/8 of 16 GiB at 4.6 bytes x width 1088 per row: 429k rows -> 2**18
    assert batch == 2 ** 18 and "GiB RAM" in reason
    assert lr == pytest.approx(min(cpu_rate(2 ** 18), ncf_cli.CPU_MAX_LEARNING_RATE), rel=1e-3)
    huge, lr, reason = ncf_cli.choose_cpu_batch(10 ** 10, memory_bytes=4096 * GIB, **NVIDIA_MODEL)
    assert huge == 2 ** 20 and lr <= ncf_cli.CPU_MAX_LEARNING_RATE and "NVIDIA's value" in reason
    tiny, _, reason = ncf_cli.choose_cpu_batch(5000, memory_bytes=16 * GIB, **NVIDIA_MODEL)
    assert tiny == ncf_cli.CPU_MIN_BATCH and "floor" in reason


def test_accumulation_counts_in_the_steps_and_the_rate():
    batch, lr, _ = ncf_cli.choose_cpu_batch(ML100K_ROWS, memory_bytes=23 * GIB, grads_accumulated=4, **NVIDIA_MODEL)
    assert batch == 1024 and lr == pytest.approx(cpu_rate(4096), rel=1e-3)


def test_no_model_flag_gets_the_published_neumf():
    values, reason = ncf_cli.choose_cpu_model(ML100K_ROWS)
    assert values == dict(ncf_cli.CPU_MODEL, batch_size=256, learning_rate=0.001)
    assert values["layers"] == (64, 32, 16, 8) and values["dropout"] == 0 and values["beta1"] == 0.9
    assert reason.startswith(f"the published NeuMF's settings: -f {ncf_cli.CPU_MODEL['factors']} --layers 64 32 16 8 ")
    # ML-20m: -b 256 would be 390k steps per epoch; doubled to 8192 (12k steps), -l by sqrt(32) up to the cap
    values, reason = ncf_cli.choose_cpu_model(19_861_770 * 5)
    assert values["batch_size"] == 8192 and "sqrt(8192/256), capped" in reason
    assert values["learning_rate"] == min(0.001 * math.sqrt(32), ncf_cli.CPU_MAX_LEARNING_RATE)
    assert ncf_cli.choose_cpu_model(8_000_000)[0]["learning_rate"] == pytest.approx(0.001 * math.sqrt(2), rel=1e-2)
    # the step count counts accumulated batches; a training set smaller than a batch is one step
    assert ncf_cli.choose_cpu_model(19_861_770 * 5, grads_accumulated=4)[0]["batch_size"] == 2048
    assert ncf_cli.choose_cpu_model(100)[0]["batch_size"] == 100


def _settle(argv, device="cpu", train_rows=ML100K_ROWS):
    argv = ["--data", "d", *argv]
    given = frozenset(ncf_cli.given_flags(ncf_cli.build_parser(), argv))
    return ncf_cli.settle(ncf_cli.parse_args(argv), given, torch.device(device), train_rows, memory_bytes=23 * GIB)


def test_any_model_flag_keeps_nvidias_model():
    paper = _settle([])
    assert (paper.factors, paper.layers, paper.dropout, paper.beta1, paper.beta2, paper.batch_size) == \
        (ncf_cli.CPU_MODEL["factors"], (64, 32, 16, 8), 0.0, 0.9, 0.999, 256)
    assert "none of -b -l -f --layers --dropout -b1 -b2 was given" in paper.cpu_defaults
    # --mode test builds the same model, so that the checkpoint a CPU run wrote loads
    assert _settle(["--mode", "test"]).factors == ncf_cli.CPU_MODEL["factors"]
    for flag in (["-b1", "0.25"], ["--dropout", "0.5"], ["-f", "64"], ["--layers", "256", "256", "128", "64"]):
        config = _settle(flag)
        assert (config.layers, config.batch_size) == ((256, 256, 128, 64), 4096) and config.beta2 in (0.5, 0.999)
        assert config.cpu_defaults.startswith(f"ncf.py: CPU defaults: NVIDIA's model ({flag[0]} given) at -b 4096")
    assert _settle(["-f", "64", "--mode", "test"]).cpu_defaults is None
    gpu = _settle([], device="cuda")
    assert gpu.cpu_defaults is None and (gpu.factors, gpu.batch_size, gpu.beta1) == (64, 2 ** 20, 0.25)


def test_tune_trials_keep_the_settled_model():
    argv = ["--data", "d", "--tune"]
    args = ncf_cli.parse_args(argv)
    given = frozenset(ncf_cli.given_flags(ncf_cli.build_parser(), argv))
    settled = dict(batch_size=256, layers=[64, 32, 16, 8], dropout=0.0, beta1=0.9, beta2=0.999)
    trial_args, fixed = ncf_tune.trial_flags(args, given, ncf_tune.Trial(0.002, 8, 32), settled)
    config = ncf_cli.settle(trial_args, fixed, torch.device("cpu"), ML100K_ROWS)
    assert (config.learning_rate, config.negative_samples, config.factors, config.layers, config.beta1,
            config.batch_size, config.tune) == (0.002, 8, 32, (64, 32, 16, 8), 0.9, 256, False)
    assert config.cpu_defaults is None


def _params(tmp_path, log):
    return read_log(str(tmp_path / log))[0]["data"]


def test_run_prints_the_choice_first_and_given_flags_win(tiny_data, tmp_path, capsys):
    base = ["--data", tiny_data, "-e", "1", "-f", "8", "--layers", "16", "8", "--seed", "3", "--device", "cpu"]
    ncf_train.main(base + ["--log_path", str(tmp_path / "auto.json")])
    first = capsys.readouterr().out.splitlines()[0]
    params = _params(tmp_path, "auto.json")
    batch, lr, reason = ncf_cli.choose_cpu_batch(params["train_positives"] * 5, 8, [16, 8],
                                                 ncf_cli.machine_memory_bytes())
    assert first == f"ncf.py: CPU defaults: NVIDIA's model (-f, --layers given) at {reason}. Pass -b (and -l) to choose."
    assert (params["batch_size"], params["learning_rate"]) == (batch, lr) and batch < 2 ** 20
    assert params["cpu_defaults"] == first
    # -b given, even equal to NVIDIA's default: both of NVIDIA's values stay
    ncf_train.main(base + ["-b", str(2 ** 20), "--log_path", str(tmp_path / "b.json")])
    assert "CPU defaults" not in capsys.readouterr().out
    params = _params(tmp_path, "b.json")
    assert (params["batch_size"], params["learning_rate"]) == (2 ** 20, 0.0045)
    # -l given alone: the batch is chosen, the rate is the user's; the flags as typed stay untouched
    argv = base + ["-l", "0.01"]
    args = ncf_cli.parse_args(argv)
    given = frozenset(ncf_cli.given_flags(ncf_cli.build_parser(), argv))
    config = ncf_cli.settle(args, given, torch.device("cpu"), 495285, memory_bytes=23 * GIB)
    assert (config.batch_size, config.learning_rate) == (4096, 0.01)
    assert (args.batch_size, args.learning_rate) == (2 ** 20, 0.01)
    assert config.cpu_defaults.endswith("-l 0.01 as given. Pass -b (and -l) to choose.")
    # on a GPU NVIDIA's values stay
    args = ncf_cli.parse_args(base)
    config = ncf_cli.settle(args, frozenset(ncf_cli.given_flags(ncf_cli.build_parser(), base)),
                            torch.device("cuda", 0), 495285)
    assert config.cpu_defaults is None and config.batch_size == 2 ** 20
