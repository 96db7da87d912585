"""benchmarks/dataloader.py: counts exactly the timed batches of the simulated rank and writes its JSON."""
import json

from dataloader import main


def test_counts_timed_batches_of_the_simulated_rank(small_dataset, tmp_path):
    out = tmp_path / "bench.json"
    result = main(["--dataset_path", small_dataset, "--batch_size", "512", "--max_batches", "3",
                   "--warmup_batches", "2", "--world_size", "2", "--rank", "1", "--output_json", str(out)])
    assert result["batches"] == 3 and result["local_samples"] == 3 * 256
    assert abs(result["global_samples_per_s"] - 2 * result["local_samples_per_s"]) <= 0.2
    assert json.loads(out.read_text())["batches"] == 3
    whole = main(["--dataset_type", "synthetic", "--batch_size", "64", "--synthetic_dataset_train_batches", "4",
                  "--synthetic_dataset_cardinalities", "5,6", "--synthetic_dataset_hotness", "1,2"])
    assert whole["batches"] == 2 and whole["local_samples"] == 2 * 64   # 4 batches, 2 untimed warm-up
