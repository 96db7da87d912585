"""End to end in one process: training reaches a real AUC, checkpoints resume exactly, test and inference modes."""
import numpy as np
import pytest

from conftest import train_args
from dlrm.model import torchrec_available
from dlrm.scripts.main import main
from dlrm.utils.checkpointing import read_tensors

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
    assert result["train_throughput"] > 0
    assert (tmp_path / "log.json").read_text().count("DLLL") > 2


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
    result = main(["--mode", "inference_benchmark", "--synthetic_dataset", "--synthetic_dataset_table_sizes",
                   "100,200,300", "--inference_benchmark_batch_sizes", "1,64", "--inference_benchmark_steps", "20",
                   "--embedding_type", "multi_table", "--log_path", str(tmp_path / "log.json"),
                   "--embedding_dim", "16", "--bottom_mlp_sizes", "32,16", "--top_mlp_sizes", "32,1",
                   "--base_device", "cpu"])
    for batch_size in ("1", "64"):
        r = result["inference"][batch_size]
        assert r["throughput"] > 0
        assert 0 < r["latency_mean_ms"] and r["latency_p90_ms"] <= r["latency_p95_ms"] <= r["latency_p99_ms"]
