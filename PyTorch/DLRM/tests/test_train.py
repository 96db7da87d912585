"""End to end in one process: training reaches a real AUC, checkpoints resume exactly, test and inference modes."""
import numpy as np
import pytest

from conftest import train_args
from dlrm.model import torchrec_available
from dlrm.train import main
from dlrm.checkpointing import read_tensors

FUSED = pytest.mark.skipif(not torchrec_available(), reason="torchrec/fbgemm not installed")


@pytest.mark.parametrize("embedding_type", ["multi_table", pytest.param("torchrec_fused", marks=FUSED)])
def test_training_learns_the_synthetic_task(small_dataset, tmp_path, embedding_type):
    result = main(train_args(small_dataset, tmp_path / "log.json", "--embedding_type", embedding_type, "--epochs", "2",
                             "--decay_steps", "0"))
    assert result["embedding_type"] == embedding_type
    assert result["global_step"] == 2 * (8192 // 256)
    assert result["test_samples"] == 2048
    assert len(result["evaluations"]) == 2  # --test_freq unset: once per epoch
    assert result["auc"] > 0.62, result["auc"]   # the generator's hidden model: chance is 0.5
    assert result["train_loss"] < 0.69
    assert (tmp_path / "log.json").read_text().count("DLLL") > 2


def test_train_throughput_matches_the_logged_step_times(small_dataset, tmp_path):
    """The summary's throughput covers exactly the steps after --benchmark_warmup_steps, at the global batch size.

    With --print_freq 1 the log records every step's wall time, measured by its own clock reads; the timed window
    (steps 9..24, no evaluation inside: it runs after --max_steps) holds exactly those 16 intervals plus two bits of
    bookkeeping, so its length is at least their sum and not much more.
    """
    from recsys_common.logger import read_log
    log = tmp_path / "log.json"
    args = train_args(small_dataset, log, "--embedding_type", "multi_table", "--max_steps", "24",
                      "--benchmark_warmup_steps", "8")
    args[args.index("--print_freq") + 1] = "1"
    result = main(args)
    step_times = {r["step"][1]: r["data"]["step_time"] for r in read_log(str(log))
                  if len(r["step"]) == 2 and "step_time" in r["data"]}
    assert sorted(step_times) == list(range(1, 25))
    timed = sum(step_times[s] for s in range(9, 25))
    window = result["train_step_time"] * 16
    assert timed <= window <= 1.3 * timed + 0.05, (timed, window)
    # throughput: the global batch (256) over the step time; a per-process batch or a count of warmup steps would
    # fail here or above
    assert 256 * 16 / (1.3 * timed + 0.05) <= result["train_throughput"] <= 256 * 16 / timed


@FUSED
def test_exact_resume_and_test_mode(small_dataset, tmp_path):
    common = train_args(small_dataset, tmp_path / "log.json", "--embedding_type", "torchrec_fused",
                        "--shuffle_batch_order", "--epochs", "2")
    straight = main(common + ["--max_steps", "40", "--save_checkpoint_path", str(tmp_path / "straight")])
    main(common + ["--max_steps", "20", "--save_checkpoint_path", str(tmp_path / "half")])
    resumed = main(common + ["--max_steps", "40", "--load_checkpoint_path", str(tmp_path / "half"),
                             "--save_checkpoint_path", str(tmp_path / "resumed")])
    assert resumed["global_step"] == straight["global_step"] == 40  # 32 steps per epoch: resumed mid-epoch 1
    assert resumed["auc"] == straight["auc"] and resumed["test_loss"] == straight["test_loss"]
    straight_tensors, resumed_tensors = read_tensors(tmp_path / "straight"), read_tensors(tmp_path / "resumed")
    assert sorted(straight_tensors) == sorted(resumed_tensors) and "tables/7" in straight_tensors
    for name, value in straight_tensors.items():
        np.testing.assert_array_equal(value.numpy(), resumed_tensors[name].numpy(), err_msg=name)
    # --mode test on the checkpoint reproduces the final evaluation, in either embedding implementation
    for embedding_type in ("torchrec_fused", "multi_table"):
        tested = main(train_args(small_dataset, tmp_path / "log.json", "--mode", "test", "--embedding_type",
                                 embedding_type, "--load_checkpoint_path", str(tmp_path / "straight")))
        assert tested["auc"] == pytest.approx(straight["auc"], abs=1e-6)
        assert tested["test_samples"] == 2048


def test_amp_bf16_and_auc_threshold_early_stop(small_dataset, tmp_path):
    result = main(train_args(small_dataset, tmp_path / "log.json", "--embedding_type", "multi_table", "--amp",
                             "--test_freq", "4", "--auc_threshold", "0.55"))
    assert result["amp"] == "bfloat16"  # --amp on a CPU means bfloat16 autocast
    assert result["auc"] >= 0.55
    assert result["global_step"] < 8192 // 256  # stopped early
    assert result["global_step"] % 4 == 0


def test_inference_benchmark_reports_latency_percentiles(tmp_path):
    import time
    started = time.perf_counter()
    result = main(["--mode", "inference_benchmark", "--synthetic_dataset", "--synthetic_dataset_table_sizes",
                   "100,200,300", "--inference_benchmark_batch_sizes", "1,64", "--inference_benchmark_steps", "20",
                   "--embedding_type", "multi_table", "--log_path", str(tmp_path / "log.json"),
                   "--embedding_dim", "16", "--bottom_mlp_sizes", "32,16", "--top_mlp_sizes", "32,1",
                   "--base_device", "cpu"])
    wall_ms = (time.perf_counter() - started) * 1000.0
    timed_ms = 0.0
    for batch_size in ("1", "64"):
        r = result["inference"][batch_size]
        latencies = np.array(r["latencies_ms"])
        assert len(latencies) == 20  # --inference_benchmark_steps, warmup steps excluded
        timed_ms += latencies.sum()
        assert r["latency_mean_ms"] == pytest.approx(latencies.mean(), rel=1e-12)
        ordered = np.sort(latencies)
        for q in (90, 95, 99):  # linear interpolation between the two closest ranks (NumPy's default)
            rank = q / 100 * (len(ordered) - 1)
            low = int(rank)
            expected = ordered[low] + (rank - low) * (ordered[low + 1] - ordered[low])
            assert r[f"latency_p{q}_ms"] == pytest.approx(expected, rel=1e-9)
        assert r["throughput"] == pytest.approx(int(batch_size) / (latencies.mean() / 1000.0), rel=1e-12)
    assert timed_ms < wall_ms  # the latencies are real intervals inside the run
    # the summary in the log carries the figures but not the per-step list
    from recsys_common.logger import read_log
    logged = [r for r in read_log(str(tmp_path / "log.json")) if r["step"] == []][-1]["data"]["inference"]
    assert logged["64"]["latency_p99_ms"] == result["inference"]["64"]["latency_p99_ms"]
    assert "latencies_ms" not in logged["64"]
