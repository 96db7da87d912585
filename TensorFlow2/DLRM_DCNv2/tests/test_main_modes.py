"""--mode eval / inference from a checkpoint, a diverging run, impossible flag combinations, and the entry scripts."""
import os
import subprocess
import sys

import pytest

from conftest import RECIPE_DIR, subprocess_env, tiny_model_flags
from dlrm_dcnv2.cli import UsageError
from dlrm_dcnv2.train import main
from recsys_common.logger import read_log


@pytest.fixture(scope="module")
def trained(small_dataset, tmp_path_factory):
    """A DCNv2 trained one epoch with a final checkpoint (and its final evaluation's reliability diagram next to
    the log); returns (flags, results, checkpoint root, log path)."""
    out = tmp_path_factory.mktemp("trained")
    flags = tiny_model_flags("dcnv2") + ["--dataset_path", small_dataset, "--seed", "1"]
    log = str(out / "log.json")
    results = main(flags + ["--save_checkpoint_path", str(out / "ckpt"), "--log_path", log, "--reliability_plot",
                            str(out / "reliability.png")], model="dcnv2")
    return flags, results, str(out / "ckpt"), log


def test_train_logs_parameters_progress_and_summary(trained):
    _, results, _, log = trained
    records = read_log(log, kinds=("LOG",))
    assert records[0]["step"] == "PARAMETER" and records[0]["data"]["learning_rate"] == 0.003
    summary = [r for r in records if r["step"] == []]
    assert len(summary) == 1
    assert summary[0]["data"]["auc"] == pytest.approx(results["auc"])
    assert summary[0]["data"]["global_step"] == 32
    progress = [r for r in records if isinstance(r["step"], list) and r["step"] and "loss" in r["data"]]
    assert [r["step"][1] for r in progress] == [32]  # --print_freq 1000: only the last step of the run
    metadata = {r["metric"]: r["metadata"] for r in read_log(log, kinds=("METADATA",))}
    assert metadata["throughput"] == {"unit": "samples/s"} and "auc" in metadata


def test_eval_mode_reproduces_the_final_evaluation(trained):
    flags, results, ckpt, _ = trained
    evaluated = main(flags + ["--mode", "eval", "--restore_checkpoint_path", ckpt], model="dcnv2")
    assert evaluated["mode"] == "eval"
    assert evaluated["auc"] == pytest.approx(results["auc"], abs=1e-6)
    assert evaluated["auc_exact"] == pytest.approx(results["auc_exact"], abs=1e-6)
    assert evaluated["loss"] == pytest.approx(results["loss"], abs=1e-6)
    assert evaluated["samples"] == 2048


CLICK_KEYS = ("log_loss", "normalized_entropy", "calibration")


def test_train_reports_click_metrics_next_to_auc_and_draws_the_reliability_diagram(trained):
    """Issue 33: log loss, NE and calibration in the results, the eval log lines, the summary and the metadata;
    --reliability_plot writes the final evaluation's PNG."""
    _, results, _, log = trained
    assert results["log_loss"] == pytest.approx(results["loss"], rel=1e-9)   # the same BCE, from the same sums
    assert 0.5 < results["normalized_entropy"] < 1.0     # trained (AUC > 0.5): better than the base rate
    assert 0.5 < results["calibration"] < 2.0
    assert "calibration_corrected" not in results        # no down-sampling: no corrected figures
    records = read_log(log, kinds=("LOG",))
    summary = [r for r in records if r["step"] == []][0]["data"]
    evals = [r["data"] for r in records if isinstance(r["step"], list) and r["step"] and "eval_auc" in r["data"]]
    for key in CLICK_KEYS:
        assert summary[key] == pytest.approx(results[key]) and evals[-1][f"eval_{key}"] == pytest.approx(results[key])
    metadata = {r["metric"]: r["metadata"] for r in read_log(log, kinds=("METADATA",))}
    assert all(key in metadata for key in CLICK_KEYS)
    png = os.path.join(os.path.dirname(log), "reliability.png")
    with open(png, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    # the log keeps the final evaluation's buckets: plot_log draws the diagram from it alone
    from recsys_common import metrics as common_metrics, plot_log
    buckets, sums = plot_log.reliability_from_log(log)
    assert sum(b[0] for b in buckets) == sums[0] and common_metrics.ctr_metrics_from_sums(sums)["calibration"] == \
        pytest.approx(results["calibration"], rel=1e-9)
    drawn = plot_log.main([log, "--output", os.path.join(os.path.dirname(log), "from_log")])
    assert any(p.endswith("reliability.png") for p in drawn)


def test_eval_mode_click_metrics_and_reliability_plot(trained, tmp_path, capsys):
    flags, results, ckpt, _ = trained
    png = tmp_path / "eval.png"
    evaluated = main(flags + ["--mode", "eval", "--restore_checkpoint_path", ckpt, "--reliability_plot", str(png)],
                     model="dcnv2")
    for key in CLICK_KEYS:
        assert evaluated[key] == pytest.approx(results[key], abs=1e-6)
    out = capsys.readouterr().out
    assert f"| log loss {evaluated['log_loss']:.5f} | NE {evaluated['normalized_entropy']:.5f} | calibration " in out
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_eval_mode_without_checkpoint_is_untrained(trained):
    flags, results, _, _ = trained
    untrained = main(flags + ["--mode", "eval"], model="dcnv2")
    assert abs(untrained["auc"] - 0.5) < 0.1 < results["auc"] - 0.5


def test_inference_mode_reports_every_batch_size(trained):
    flags, _, ckpt, _ = trained
    results = main(flags + ["--mode", "inference", "--restore_checkpoint_path", ckpt, "--inference_batch_sizes",
                            "64,256", "--inference_steps", "20", "--inference_warmup_steps", "3"], model="dcnv2")
    assert sorted(results["inference"]) == ["256", "64"]
    for size, r in results["inference"].items():
        assert r["batch_size"] == int(size) and r["steps"] == 20 and len(r["latencies_ms"]) == 20
        assert 0 < r["latency_p90_ms"] <= r["latency_p95_ms"] <= r["latency_p99_ms"] <= max(r["latencies_ms"])
        assert r["throughput"] == pytest.approx(int(size) / (r["latency_mean_ms"] / 1000.0))


def test_diverging_run_stops_with_the_step(small_dataset):
    flags = tiny_model_flags("dlrm") + ["--dataset_path", small_dataset, "--seed", "1", "--learning_rate", "1e20",
                                        "--warmup_steps", "0"]
    with pytest.raises(FloatingPointError, match=r"loss is nan at step \d+ \(epoch 0, batch \d+\).*--learning_rate"):
        main(flags, model="dlrm")


@pytest.mark.parametrize("extra, match", [
    (["--embedding_dim", "16,16,16,16,16,16,16,8"], "--interaction dot_custom_cuda needs one embedding width"),
    (["--embedding_dim", "8"], "--bottom_mlp_dims 32,16 ends with 16 but --embedding_dim is 8"),
])
def test_dlrm_flag_combinations_that_cannot_work(small_dataset, extra, match):
    with pytest.raises(UsageError, match=match):
        main(tiny_model_flags("dlrm") + ["--dataset_path", small_dataset] + extra, model="dlrm")


def test_dcnv2_accepts_per_table_embedding_dims(small_dataset):
    results = main(tiny_model_flags("dcnv2") + ["--dataset_path", small_dataset, "--max_steps", "3", "--seed", "1",
                                                "--embedding_dim", "4,8,16,4,8,16,4,8"], model="dcnv2")
    assert results["global_step"] == 3


def _run(script, *argv):
    return subprocess.run([sys.executable, os.path.join(RECIPE_DIR, script), *argv], env=subprocess_env(),
                          capture_output=True, text=True, timeout=180)


def test_entry_scripts_exit_non_zero_with_one_line_errors(small_dataset, tmp_path):
    diverged = _run("dlrm.py", *tiny_model_flags("dlrm"), "--dataset_path", small_dataset, "--learning_rate",
                    "1e20", "--warmup_steps", "0", "--seed", "1")
    assert diverged.returncode == 1, diverged.stderr[-2000:]
    assert "error: FloatingPointError: training diverged: the loss is nan at step" in diverged.stderr
    no_model = _run("main.py", "--dataset_type", "synthetic")
    assert no_model.returncode == 2 and "main.py needs --model" in no_model.stderr
    bad_flag = _run("dcnv2.py", "--dataset_type", "synthetic", "--top_mlp_dims", "8,4")
    assert bad_flag.returncode == 2 and "error: --top_mlp_dims 8,4: the last layer must have width 1" \
        in bad_flag.stderr


def test_main_py_with_model_trains(small_dataset, tmp_path):
    done = _run("main.py", "--model", "dcnv2", *tiny_model_flags("dcnv2"), "--dataset_path", small_dataset,
                "--max_steps", "4", "--print_freq", "2", "--seed", "1")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "training dcnv2: 4 steps (32 per epoch, global batch 256, 1 rank(s), float32)" in done.stdout
    assert "step 2/4 | loss" in done.stdout and "samples/s | ETA" in done.stdout
    assert "eval at step 4: auc" in done.stdout


def test_xla_with_nvidias_custom_dot_op_is_refused(small_dataset, monkeypatch):
    """With tensorflow_dot_based_interact installed (NGC image), --xla cannot compile it: a clear error, no run."""
    from dlrm_dcnv2.model import interaction
    monkeypatch.setattr(interaction, "custom_dot_op", lambda: (lambda features, bottom: bottom))
    with pytest.raises(ValueError, match="--interaction dot_custom_cuda with --xla"):
        main(tiny_model_flags("dlrm") + ["--dataset_path", small_dataset, "--xla"], model="dlrm")
