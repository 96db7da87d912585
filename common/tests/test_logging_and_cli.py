"""DLLogger-compatible logs, plots, the shared-data locator, and --help of every command-line entry point."""
import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

import recsys_testing as testing
from recsys_common import plot_log, synthetic, transcode
from recsys_common.logger import Logger, hms, read_log


def test_log_lines_are_dllogger_json(tmp_path):
    path = tmp_path / "sub" / "log.json"
    log = Logger(str(path), stdout=False)
    log.metadata("hr@10", {"unit": None})
    log.log_parameters({"lr": 0.1, "layers": [256, 128]})
    log.log(step=(1, 20), data={"loss": 0.25, "throughput": 1e6})
    log.log(step=3, data={"hr@10": 0.5})
    log.log_summary({"best_hr": 0.7})
    log.close()
    lines = path.read_text().splitlines()
    assert all(line.startswith("DLLL {") for line in lines)
    records = [json.loads(line[5:]) for line in lines]
    assert records[0]["type"] == "METADATA" and records[0]["metric"] == "hr@10"
    for r in records[1:]:
        assert set(r) == {"timestamp", "datetime", "elapsedtime", "type", "step", "data"}
        float(r["timestamp"]), float(r["elapsedtime"])
    assert [r["step"] for r in records[1:]] == ["PARAMETER", [1, 20], [3], []]
    assert records[1]["data"]["layers"] == [256, 128]


def test_only_rank_zero_writes(tmp_path, capsys):
    log = Logger(str(tmp_path / "log.json"), rank=1)
    log.log(step=1, data={"loss": 1.0})
    log.close()
    assert not (tmp_path / "log.json").exists()
    assert capsys.readouterr().out == ""


def test_a_new_run_keeps_the_previous_log_as_a_numbered_backup(tmp_path, capsys):
    path = str(tmp_path / "log.json")
    for run in range(3):
        with Logger(path, stdout=False) as log:
            log.log(step=1, data={"run": run})
    assert [r["data"]["run"] for r in read_log(path)] == [2]
    assert [r["data"]["run"] for r in read_log(path + ".1")] == [0]
    assert [r["data"]["run"] for r in read_log(path + ".2")] == [1]
    assert f"the earlier log was kept as {path}.2" in capsys.readouterr().err


def test_a_resumed_run_appends_to_its_log(tmp_path):
    path = str(tmp_path / "log.json")
    with Logger(path, stdout=False) as log:
        log.log(step=1, data={"loss": 1.0})
    with Logger(path, stdout=False, append=True) as log:
        log.log(step=2, data={"loss": 0.5})
    assert [r["step"] for r in read_log(path)] == [[1], [2]]
    assert not os.path.exists(path + ".1")


def test_a_log_path_that_is_a_directory_is_refused(tmp_path):
    with pytest.raises(FileExistsError, match="is not a regular file"):
        Logger(str(tmp_path), stdout=False)


def test_stdout_lines_are_readable(tmp_path, capsys):
    Logger(None).log(step=(2, 5), data={"loss": 0.123456789})
    assert capsys.readouterr().out.strip() == "[step 2 5] loss: 0.123457"


def test_hms_is_the_training_loops_eta_format():
    # The three training loops print their ETA with it: hours grow past 24, seconds round down, no negative.
    assert [hms(s) for s in (0, 59.99, 61, 3600, 90061, -5)] == \
        ["0:00:00", "0:00:59", "0:01:01", "1:00:00", "25:01:01", "0:00:00"]
    assert hms(float("nan")) == hms(float("inf")) == "?"


def test_plot_log_writes_pngs(tmp_path):
    path = str(tmp_path / "log.json")
    log = Logger(path, stdout=False)
    log.log_parameters({"lr": 1})
    for epoch in range(5):
        log.log(step=epoch, data={"loss": 1.0 / (epoch + 1), "hr@10": 0.1 * epoch, "train_throughput": 1e5})
    log.log_summary({"best": 1})
    log.close()
    written = plot_log.main([path, "--output", str(tmp_path / "plots")])
    assert sorted(os.path.basename(w) for w in written) == ["loss.png", "metrics.png", "throughput.png"]
    for w in written:
        with open(w, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert len(read_log(path)) == 7


def test_plot_log_draws_the_reliability_diagram_from_a_summary_with_buckets(tmp_path):
    """An evaluation-only log (a summary, no step-indexed record) with reliability buckets gives reliability.png; a
    training log gives it beside the step plots; without buckets nothing changes (an empty log is still an error)."""
    from recsys_common.metrics import ctr_sums, reliability_sums
    rng = np.random.default_rng(0)
    logits = rng.normal(-1.0, 1.0, 500)
    labels = (rng.random(500) < 1 / (1 + np.exp(-logits))).astype(np.float64)
    buckets = reliability_sums(labels, logits=logits).tolist()
    evaluation_only, training = str(tmp_path / "test.json"), str(tmp_path / "train.json")
    with Logger(evaluation_only, stdout=False) as log:
        log.log_summary({"auc": 0.7, "test_ctr_sums": ctr_sums(labels, logits=logits).tolist(),
                         "test_reliability_sums": buckets})
    with Logger(training, stdout=False) as log:
        log.log(step=(0, 10), data={"loss": 0.6, "test_auc": 0.7})
        log.log_summary({"test_reliability_sums": buckets})      # the whole-set sums are optional
    written = plot_log.main([evaluation_only, "--output", str(tmp_path / "a")])
    assert [os.path.basename(w) for w in written] == ["reliability.png"]
    with open(written[0], "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    written = plot_log.main([training, "--output", str(tmp_path / "b")])
    assert sorted(os.path.basename(w) for w in written) == ["loss.png", "metrics.png", "reliability.png"]
    empty = str(tmp_path / "empty.json")
    with Logger(empty, stdout=False) as log:
        log.log_summary({"auc": 0.7})
    with pytest.raises(ValueError, match="nothing|no step"):
        plot_log.plot(empty, str(tmp_path / "c"))


def _plotted(path):
    """file name -> {label: (x data, y data)} of the Line2D objects plot_log draws, plus the x axis labels."""
    import matplotlib.pyplot as plt
    figures = plot_log.build_figures(path)
    out = {}
    for name, fig in figures.items():
        ax = fig.axes[0]
        out[name] = {"xlabel": ax.get_xlabel(),
                     **{line.get_label(): (list(line.get_xdata()), list(line.get_ydata())) for line in ax.get_lines()
                        if not line.get_label().startswith("_")}}
        plt.close(fig)
    return out


def test_plot_log_x_axis_is_the_logged_training_step(tmp_path):
    """The issue's run: 128 steps, print_freq 32, logged as DLRM does, (epoch, global_step); 64 steps per epoch."""
    path = str(tmp_path / "log.json")
    log = Logger(path, stdout=False)
    log.log_parameters({"print_freq": 32})
    for step in (32, 64, 96, 128):
        epoch = (step - 1) // 64
        log.log(step=(epoch, step), data={"loss": 1.0 / step, "lr": 0.1, "step_time": 0.01})
        log.log(step=(epoch, step), data={"test_auc": 0.5 + step / 1000, "test_loss": 2.0 / step})
    log.log(step=(1, 128), data={"early_stop": "AUC >= 0.6"})     # text: not plotted
    log.log_summary({"auc": 0.628})
    log.close()
    plotted = _plotted(path)
    assert sorted(plotted) == ["learning_rate.png", "loss.png", "metrics.png", "time.png"]
    assert plotted["loss.png"]["loss"] == ([32.0, 64.0, 96.0, 128.0], [1 / 32, 1 / 64, 1 / 96, 1 / 128])
    assert plotted["loss.png"]["test_loss"][0] == [32.0, 64.0, 96.0, 128.0]
    assert plotted["metrics.png"]["test_auc"][0] == [32.0, 64.0, 96.0, 128.0]
    assert plotted["loss.png"]["xlabel"].startswith("training step")
    # the epoch boundary: a dotted line after the last step logged in epoch 0
    import matplotlib.pyplot as plt
    fig = plot_log.build_figures(path)["loss.png"]
    boundaries = [list(line.get_xdata()) for line in fig.axes[0].get_lines() if line.get_linestyle() == ":"]
    assert boundaries == [[64.0, 64.0]]
    plt.close("all")


def test_plot_log_per_epoch_records_are_plotted_against_the_epoch(tmp_path):
    """NCF logs once per epoch with step (epoch,); its data also repeats the epoch, which is not a curve."""
    path = str(tmp_path / "log.json")
    log = Logger(path, stdout=False)
    for epoch in range(3):
        log.log(step=(epoch,), data={"epoch": epoch, "hr@10": 0.1 * (epoch + 1), "loss": 1.0 - 0.1 * epoch,
                                     "train_throughput": 1000.0 + epoch, "epoch_time": 2.0})
    log.close()
    plotted = _plotted(path)
    assert plotted["metrics.png"] == {"xlabel": "epoch", "hr@10": ([0.0, 1.0, 2.0], [0.1, 0.2, 0.30000000000000004])}
    assert plotted["throughput.png"]["train_throughput"][0] == [0.0, 1.0, 2.0]


def test_plot_log_steps_counted_within_each_epoch_become_fractional_epochs(tmp_path):
    path = str(tmp_path / "log.json")
    log = Logger(path, stdout=False)
    for epoch in range(2):
        for it in (50, 100):
            log.log(step=(epoch, it), data={"loss": 1.0})
    log.close()
    xs, _ = _plotted(path)["loss.png"]["loss"]
    assert xs == [0.5, 1.0, 1.5, 2.0]
    assert _plotted(path)["loss.png"]["xlabel"] == "epoch"


def test_plot_log_rejects_empty_log(tmp_path):
    (tmp_path / "log.json").write_text("not a log\n")
    with pytest.raises(ValueError, match="no step-indexed numeric LOG records"):
        plot_log.plot(str(tmp_path / "log.json"), str(tmp_path / "p"))


def test_shared_data_path_skips_or_fails(monkeypatch, tmp_path):
    monkeypatch.setenv("RECSYS_DATA_DIR", str(tmp_path))
    (tmp_path / "present").mkdir()
    assert testing.shared_data_path("present") == str(tmp_path / "present")
    monkeypatch.delenv("RECSYS_REQUIRE_DATA", raising=False)
    with pytest.raises(pytest.skip.Exception, match="not found"):
        testing.shared_data_path("absent")
    monkeypatch.setenv("RECSYS_REQUIRE_DATA", "1")
    with pytest.raises(pytest.fail.Exception, match="RECSYS_REQUIRE_DATA=1 makes this a failure"):
        testing.shared_data_path("absent")


@pytest.mark.parametrize("module", [synthetic, transcode])
def test_every_flag_is_documented(module):
    parser = module.build_parser()
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        assert action.help and len(action.help) > 10, f"{module.__name__}: {action.option_strings} has no help"


@pytest.mark.parametrize("module", ["recsys_common.synthetic", "recsys_common.transcode", "recsys_common.plot_log"])
def test_python_dash_m_help(module):
    out = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True, text=True, check=True).stdout
    assert "usage: python -m" in out


def test_cli_errors_exit_nonzero_with_message(tmp_path):
    r = subprocess.run([sys.executable, "-m", "recsys_common.transcode", "--input", str(tmp_path),
                        "--feature_spec_in", "nope.yaml", "--output", str(tmp_path / "o")],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "transcode.py: error: " in r.stderr and "nope.yaml: feature spec file not found" in r.stderr


def test_synthetic_benchmark_reports_rates_the_wall_clock_agrees_with():
    """The reported seconds are real seconds of this run: both phases fit in the process's wall time, and each rate
    is the rows over its median time (a rate over the wrong row count, or in ms, fails)."""
    bench = os.path.join(os.path.dirname(__file__), os.pardir, "benchmarks", "synthetic.py")
    started = time.perf_counter()
    out = subprocess.run([sys.executable, bench, "--rows", "5000", "--repeats", "3", "--table_size", "1000"],
                         capture_output=True, text=True, check=True).stdout
    wall = time.perf_counter() - started
    result = json.loads(out)
    assert result["rows"] == 5000 and len(result["generate_s_all"]) == 3
    assert result["generate_s_median"] == sorted(result["generate_s_all"])[1]
    assert sum(result["generate_s_all"]) + result["read_s_median"] < wall    # all timed work happened in this run
    for phase in ("generate", "read"):
        seconds = result[f"{phase}_s_median"]
        assert result[f"{phase}_rows_per_s"] == pytest.approx(5000 / seconds, rel=1e-3), phase
        assert result[f"{phase}_rows_per_s"] > 5000 / wall, phase
