"""inference.py, benchmark.py and prepare_dataset.sh on tiny inputs."""
import os
import subprocess

import pytest

import benchmark
import inference
from conftest import NCF_DIR


def test_inference_reports_latency_per_batch_size(tmp_path):
    rows = inference.main(["--n_users", "50", "--n_items", "40", "--factors", "4", "--layers", "8", "4",
                           "--batch_sizes", "1,64", "--num_batches", "5", "--num_warmup", "1",
                           "--log_path", str(tmp_path / "inf.json")])
    assert [r["batch_size"] for r in rows] == [1, 64]
    assert all(r["latency_p99_ms"] >= r["latency_p90_ms"] > 0 and r["throughput_samples_per_s"] > 0 for r in rows)


def test_inference_rejects_a_bad_checkpoint(tmp_path):
    (tmp_path / "bad.pth").write_bytes(b"not a checkpoint")
    with pytest.raises(SystemExit):
        inference.main(["--load_checkpoint_path", str(tmp_path / "bad.pth"), "--log_path", str(tmp_path / "l.json")])


def test_benchmark_prints_both_implementations_and_their_ratio():
    result = benchmark.main(["--shape", "tiny", "-e", "1", "-b", "4096", "-f", "4", "--layers", "8", "4",
                             "--dropout", "0"])
    for impl in ("recipe", "naive"):
        assert result[impl]["train_samples_per_s"] > 0 and result[impl]["eval_samples_per_s"] > 0
    assert result["train_speedup"] == pytest.approx(
        result["recipe"]["train_samples_per_s"] / result["naive"]["train_samples_per_s"])


def test_prepare_dataset_byo_csv_and_missing_file(tmp_path, env_with_pythonpath):
    raw = tmp_path / "raw"
    (raw / "mine").mkdir(parents=True)
    (raw / "mine" / "ratings.csv").write_text("user_id,item_id,timestamp\n1,1,1\n1,2,2\n2,1,3\n2,3,4\n3,2,5\n3,3,6\n")
    env = dict(env_with_pythonpath, PYTHON=os.environ.get("PYTHON", __import__("sys").executable))
    script = os.path.join(NCF_DIR, "prepare_dataset.sh")
    ok = subprocess.run(["bash", script, "mine", str(raw), str(tmp_path / "cache")], env=env, capture_output=True,
                        text=True)
    assert ok.returncode == 0, ok.stderr
    assert (tmp_path / "cache" / "mine" / "feature_spec.yaml").is_file()
    missing = subprocess.run(["bash", script, "other", str(raw), str(tmp_path / "cache")], env=env,
                             capture_output=True, text=True)
    assert missing.returncode != 0 and "other/ratings.csv not found" in missing.stderr
