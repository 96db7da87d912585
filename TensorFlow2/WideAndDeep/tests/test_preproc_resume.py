"""Resume of the Outbrain ETL: a run killed with SIGKILL after its first stage is started again with the same
command, skips the finished stage (proved by making that stage's code fail if called) and writes the output of an
uninterrupted run; a work directory of other inputs or settings is refused, ``--restart`` discards it."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import ETL_OPTIONS, RECIPE_DIR, subprocess_env
from recsys_testing import import_script
from wide_deep.data.outbrain import preproc

OPTIONS_FLAGS = ["--num_partitions", str(ETL_OPTIONS["num_partitions"]), "--num_train_files",
                 str(ETL_OPTIONS["num_train_files"]), "--num_valid_files", str(ETL_OPTIONS["num_valid_files"]),
                 "--seed", str(ETL_OPTIONS["seed"])]


def _done_stages(work_dir):
    try:
        with open(os.path.join(work_dir, preproc.STATE_NAME)) as f:
            return list(json.load(f)["done"])
    except (OSError, ValueError, KeyError):   # not written yet, or being replaced
        return []


def _start_and_kill_after_join(raw_dir, out, work_dir, timeout=240):
    """Start the ETL command line; SIGKILL it as soon as its state records the join stage."""
    proc = subprocess.Popen([sys.executable, "-m", "wide_deep.data.outbrain.preproc", "--input_dir", raw_dir,
                             "--output_dir", out, "--cpu", *OPTIONS_FLAGS], cwd=RECIPE_DIR, env=subprocess_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + timeout
    try:
        while "join" not in _done_stages(work_dir):
            if proc.poll() is not None:
                raise AssertionError(f"the ETL ended (rc {proc.returncode}) before its join stage was recorded: "
                                     f"{proc.stderr.read().decode()[-2000:]}")
            if time.monotonic() > deadline:
                raise AssertionError(f"join stage not recorded in {timeout} s")
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=60)
        proc.stderr.close()
    return proc.returncode


def test_killed_run_resumes_without_redoing_the_join(raw_outbrain, etl_single, tmp_path, monkeypatch):
    from test_preproc_dask import assert_same_rows, read_split
    out, work_dir = str(tmp_path / "out"), preproc.default_work_dir(str(tmp_path / "out"))
    rc = _start_and_kill_after_join(raw_outbrain, out, work_dir)
    assert rc == -signal.SIGKILL, rc
    assert not os.path.exists(out) and "join" in _done_stages(work_dir)
    assert {"train", "test"}.isdisjoint(_done_stages(work_dir))   # killed before the end: there is work to resume

    def join_called_again(*args, **kwargs):
        raise AssertionError("the finished join stage was run again")

    monkeypatch.setattr(preproc, "stream_join_and_split", join_called_again)
    lines = []
    result = preproc.run_etl(raw_outbrain, out, cpu=True, out=lines.append, **ETL_OPTIONS)
    assert "join" in result["resumed"]
    assert any(line.startswith("[preproc] resuming from") for line in lines)
    assert any("join and split: finished by an earlier run (skipped)" in line for line in lines)
    # Seven numbered steps, skipped or not; the work directory is gone after success.
    assert [line.split()[2] for line in lines if line.startswith("[preproc] step ")] == \
        [f"{i}/7" for i in range(1, 8)]
    assert not os.path.exists(work_dir)
    # The benchmark reads each step's time and peak memory back from these lines.
    step_figures = import_script(os.path.join(RECIPE_DIR, "benchmarks", "etl.py"), "etl_benchmark").step_figures
    log = tmp_path / "log.txt"
    log.write_text("\n".join(lines) + "\n")
    steps = step_figures(str(log))
    assert [s["step"] for s in steps] == list(range(1, 8))
    peaks = [s["peak_rss_gib_so_far"] for s in steps]
    assert peaks == sorted(peaks) and peaks[0] > 0.01
    for mapping in ("train", "test"):
        resumed_rows, resumed_spec = read_split(out, mapping)
        single_rows, single_spec = read_split(etl_single, mapping)
        assert_same_rows(resumed_rows, single_rows)
        assert resumed_spec.to_dict() == single_spec.to_dict()


def test_other_settings_refused_and_restart_starts_over(raw_outbrain, tmp_path, capsys):
    out = tmp_path / "out"
    work_dir = preproc.default_work_dir(str(out))
    os.makedirs(work_dir)
    state = {"tool": preproc.TOOL, "version": preproc.STATE_VERSION, "fingerprint": {"seed": 99},
             "done": {"join": {}}}
    with open(os.path.join(work_dir, preproc.STATE_NAME), "w") as f:
        json.dump(state, f)
    argv = ["--input_dir", raw_outbrain, "--output_dir", str(out), "--cpu", *OPTIONS_FLAGS]
    assert preproc.main(argv) == 2
    err = capsys.readouterr().err
    assert "other input files or settings" in err and "--restart" in err
    assert os.path.isfile(os.path.join(work_dir, preproc.STATE_NAME)) and not out.exists()
    # A work directory that is not this tool's is never deleted, even with --restart.
    other = tmp_path / "mine"
    other.mkdir()
    (other / "notes.txt").write_text("x")
    assert preproc.main(argv + ["--work_dir", str(other), "--restart"]) == 2
    assert "does not hold" in capsys.readouterr().err and (other / "notes.txt").exists()
    assert preproc.main(argv + ["--restart"]) == 0
    assert (out / "feature_spec.yaml").exists() and not os.path.exists(work_dir)
