"""Smoke tests of the input benchmarks: benchmarks/input_pipeline.py (files vs synthetic) and the preprocessing
benchmark's peak-memory accounting (this process and its children). Figures are in RESULTS.md, not asserted."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import RECIPE_DIR, load_benchmark, subprocess_env

benchmark_preprocess = load_benchmark("preprocess")


def test_benchmark_input_prints_files_and_synthetic_samples_per_s_and_their_ratio(tmp_path, capsys, monkeypatch):
    for key, value in subprocess_env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.chdir(RECIPE_DIR)
    benchmark_input = load_benchmark("input_pipeline")
    out = tmp_path / "result.json"
    result = benchmark_input.main(["--table_sizes", "100,10", "--batch_size", "128", "--embedding_dim", "4",
                                   "--bottom_mlp_sizes", "8,4", "--top_mlp_sizes", "8,1", "--steps", "3",
                                   "--warmup_steps", "1", "--repeats", "1", "--interleaved_steps", "4",
                                   "--embedding_type", "multi_table", "--work_dir", str(tmp_path / "work"),
                                   "--output_json", str(out)])
    printed = json.loads(capsys.readouterr().out)
    assert printed == result == json.loads(out.read_text())
    processes = result["processes"]
    run = processes["runs"][0]
    assert set(run) == {"repeat", "synthetic", "files", "files_no_prefetch", "read_ms_per_batch"}
    steps = result["interleaved"]
    assert set(steps["ratio_to_synthetic_median"]) == {"files", "files_no_prefetch"}
    ids = np.fromfile(tmp_path / "work" / "dataset" / "train" / "cat_0.bin", dtype=np.int8)
    assert len(ids) == 128 * (1 + 4) and len(set(ids.tolist())) >= 60   # uniform over 100 ids, not power-law


def test_peak_rss_counts_child_processes(tmp_path):
    """A child holding 300 MiB must show up in the peak (the Spark JVM is such a child)."""
    code = ("import time; b = bytearray(300 << 20); b[::4096] = b'x' * len(b[::4096]); "
            "open(r'%s', 'w').close(); time.sleep(1.5)" % (tmp_path / "ready"))
    with benchmark_preprocess.PeakTreeRSS(interval_s=0.05) as memory:
        before = memory.peak_bytes
        subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
    assert memory.samples >= 5
    assert memory.peak_bytes - before >= 290 << 20
    assert max(memory.peak_by_name.values()) >= 290 << 20


def test_benchmark_preprocess_reports_rows_per_s_and_peak_memory(tmp_path, capsys):
    """The JSON of a --days 2 run of the single-machine engine (each engine runs as a child process; Spark's run is
    tested end to end in test_preproc_criteo.py): the generated layout, the engine's real output, and the accounting."""
    result = benchmark_preprocess.main(["--rows", "301", "--days", "2", "--engines", "ours", "--work_dir",
                                        str(tmp_path), "--memory_interval", "0.05"])
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == result
    assert result["files"] == 2 and result["layout"] == "terabyte"
    lines = [open(tmp_path / "in" / d).read().count("\n") for d in ("day_0", "day_1")]
    assert lines == [151, 150]
    ours = result["engines"]["ours"]
    # The engine really ran: its output holds the test day (day_1: 150 rows, split into validation and test).
    spec = open(tmp_path / "out_ours" / "feature_spec.yaml").read()
    assert "label" in spec
    # A Python child importing Polars and numpy holds tens of MiB: a sampler that saw nothing would report ~0.
    assert ours["peak_rss_mib"] >= 30
    assert set(result["extrapolated_at_measured_rate"]) == {"ours"} and "spark" not in result["engines"]


def test_benchmark_preprocess_refuses_a_single_day(tmp_path):
    with pytest.raises(benchmark_preprocess.InputError, match="at least 2 days"):
        benchmark_preprocess.main(["--rows", "10", "--days", "1", "--work_dir", str(tmp_path)])


def test_benchmark_preprocess_peak_of_an_engine_is_its_own_not_the_benchmarks():
    """Linux carries a process's peak RSS into the children it starts: the launcher keeps the benchmark's own peak
    (here 400 MB held by this process) out of the engine's exact figure."""
    import sys
    held = bytearray(400 << 20)
    held[::4096] = b"x" * len(held[::4096])   # touch every page: resident
    small = benchmark_preprocess._timed([sys.executable, "-c", "print('engine output')"], 0.05)
    assert small["max_rss_bytes"] < 200 << 20 and small["output"] == "engine output\n"
    del held
