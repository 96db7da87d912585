"""inference.py, benchmark.py and prepare_dataset.sh on tiny inputs."""
import json
import os
import subprocess

import pytest

import inference
from conftest import NCF_DIR
from recsys_common.logger import read_log
from recsys_testing import import_script


benchmark = import_script(os.path.join(NCF_DIR, "benchmarks", "training.py"), "ncf_benchmark_training")


class FakeClock:
    """``time.perf_counter`` returning a scripted sequence, so timing code is checked against known durations."""

    def __init__(self, readings):
        self.readings = list(readings)

    def perf_counter(self):
        return self.readings.pop(0)


def test_inference_latency_percentiles_and_throughput_from_known_latencies(tmp_path, monkeypatch):
    latencies_ms = [3, 1, 4, 10, 5, 9, 2, 6, 8, 7]  # p90 9.1, p95 9.55, p99 9.91 (linear interpolation), mean 5.5
    warmup = 2
    per_batch_size = [0.0] * warmup  # a warm-up batch reads the clock once and is not timed
    for k, ms in enumerate(latencies_ms, start=1):
        per_batch_size += [100.0 * k, 100.0 * k + ms / 1000.0]
    clock = FakeClock(per_batch_size * 2)
    monkeypatch.setattr(inference, "time", clock)
    rows = inference.main(["--n_users", "50", "--n_items", "40", "--factors", "4", "--layers", "8", "4",
                           "--batch_sizes", "1,64", "--num_batches", "10", "--num_warmup", str(warmup),
                           "--log_path", str(tmp_path / "inf.json")])
    assert clock.readings == []  # every reading used: warm-up batches were not timed
    assert [r["batch_size"] for r in rows] == [1, 64]
    for row in rows:
        assert row["latency_mean_ms"] == pytest.approx(5.5)
        assert (row["latency_p90_ms"], row["latency_p95_ms"], row["latency_p99_ms"]) == \
            pytest.approx((9.1, 9.55, 9.91))
        assert row["throughput_samples_per_s"] == pytest.approx(row["batch_size"] / 0.0055)


def test_inference_on_the_real_clock_logs_one_row_per_batch_size(tmp_path):
    rows = inference.main(["--n_users", "50", "--n_items", "40", "--factors", "4", "--layers", "8", "4",
                           "--batch_sizes", "1,64", "--num_batches", "5", "--num_warmup", "1",
                           "--log_path", str(tmp_path / "inf.json")])
    logged = [r["data"] for r in read_log(str(tmp_path / "inf.json"))[1:]]
    assert logged == rows and [r["batch_size"] for r in rows] == [1, 64]


def test_inference_rejects_a_bad_checkpoint(tmp_path):
    (tmp_path / "bad.pth").write_bytes(b"not a checkpoint")
    with pytest.raises(inference.CheckpointError):
        inference.main(["--load_checkpoint_path", str(tmp_path / "bad.pth"), "--log_path", str(tmp_path / "l.json")])


def test_benchmark_throughputs_and_ratio_from_known_epoch_times(tmp_path, monkeypatch):
    # three clock readings per epoch (start, training done, evaluation done); recipe first, then naive
    clock = FakeClock([0, 2, 2.5, 10, 14, 15,      # recipe: training 2 s and 4 s, evaluation 0.5 s and 1 s
                       20, 28, 30, 40, 56, 60])   # naive: training 8 s and 16 s, evaluation 2 s and 4 s
    monkeypatch.setattr(benchmark, "time", clock)
    result = benchmark.main(["--shape", "tiny", "-e", "2", "-b", "4096", "-f", "4", "--layers", "8", "4",
                             "--dropout", "0", "-t", "0", "--output_json", str(tmp_path / "bench.json")])
    assert clock.readings == []
    users, _, positives = benchmark.SHAPES["tiny"]
    train_rows, eval_rows = positives * (1 + 4), users * 101  # -n 4 (default), 1 + 100 candidates per user
    recipe, naive = result["recipe"], result["naive"]
    for impl in (recipe, naive):
        assert (impl["train_rows_per_epoch"], impl["eval_rows_per_epoch"]) == (train_rows, eval_rows)
    assert recipe["train_samples_per_s"] == pytest.approx((train_rows / 2 + train_rows / 4) / 2)  # median of 2
    assert recipe["eval_samples_per_s"] == pytest.approx((eval_rows / 0.5 + eval_rows / 1) / 2)
    assert naive["train_samples_per_s"] == pytest.approx((train_rows / 8 + train_rows / 16) / 2)
    assert (result["train_speedup"], result["eval_speedup"]) == pytest.approx((4.0, 4.0))
    assert (recipe["time_to_target_s"], recipe["total_time_s"], naive["time_to_target_s"]) == \
        pytest.approx((2.5, 7.5, 10.0))
    assert json.load(open(tmp_path / "bench.json"))["train_speedup"] == pytest.approx(4.0)


def test_benchmark_output_json_never_clobbers_a_file_that_is_not_a_result(tmp_path, capsys):
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes, not JSON\n")
    with pytest.raises(FileExistsError, match="is not a JSON file"):  # refused before benchmarking
        benchmark.main(["--shape", "tiny", "-e", "1", "--no_naive", "--output_json", str(notes)])
    assert notes.read_text() == "my notes, not JSON\n"


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
