"""Bad raw input to the ETL: a clear error naming the file and column, exit status 2, and no output written."""
import json
import os
import shutil
import subprocess

import pandas as pd
import pytest

from conftest import RECIPE_DIR, subprocess_env
from wide_deep.data.outbrain import preproc, raw


@pytest.fixture
def raw_copy(raw_outbrain, tmp_path):
    path = tmp_path / "raw"
    shutil.copytree(raw_outbrain, path)
    return path


def _run(raw_dir, out, capsys, *extra):
    rc = preproc.main(["--input_dir", str(raw_dir), "--output_dir", str(out), "--cpu", *extra])
    return rc, capsys.readouterr().err


@pytest.mark.parametrize("name", raw.RAW_FILES)
def test_missing_file(raw_copy, tmp_path, capsys, name):
    os.remove(raw_copy / f"{name}.csv")
    rc, err = _run(raw_copy, tmp_path / "out", capsys)
    assert rc == 2 and f"{name}.csv: missing raw Outbrain file {name}.csv" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("name,column", [("clicks_train", "clicked"), ("events", "geo_location"),
                                         ("promoted_content", "campaign_id"), ("documents_meta", "publish_time"),
                                         ("documents_entities", "entity_id")])
def test_missing_column(raw_copy, tmp_path, capsys, name, column):
    path = raw_copy / f"{name}.csv"
    pd.read_csv(path, dtype=str, keep_default_na=False).drop(columns=[column]).to_csv(path, index=False)
    rc, err = _run(raw_copy, tmp_path / "out", capsys)
    assert rc == 2 and f"{name}.csv: {name} is missing column '{column}'" in err
    assert not (tmp_path / "out").exists()


def test_bad_value_names_row_and_column(raw_copy, tmp_path, capsys):
    path = raw_copy / "events.csv"
    df = pd.read_csv(path, dtype=str, keep_default_na=False)
    df.loc[9, "timestamp"] = "yesterday"
    df.to_csv(path, index=False)
    rc, err = _run(raw_copy, tmp_path / "out", capsys)
    assert rc == 2 and "events.csv: row 10, column 'timestamp': cannot read 'yesterday' as an integer" in err
    assert not (tmp_path / "out").exists()
    # Nothing finished, nothing to resume: no work directory either.
    assert not os.path.exists(preproc.default_work_dir(str(tmp_path / "out")))


def test_empty_training_set(raw_copy, tmp_path, capsys):
    # Every display on the last day: all validation, nothing to fit on.
    path = raw_copy / "events.csv"
    df = pd.read_csv(path)
    df["timestamp"] = 12 * 86_400_000 + df["timestamp"] % 86_400_000
    df.to_csv(path, index=False)
    rc, err = _run(raw_copy, tmp_path / "out", capsys)
    assert rc == 2 and "the training set is empty after the split" in err
    assert not (tmp_path / "out").exists()


def test_failure_mid_run_leaves_nothing(raw_copy, tmp_path, monkeypatch):
    from wide_deep.data.outbrain import engine
    out = tmp_path / "out"
    calls = []

    def broken(*args, **kwargs):   # fails after the joined data and scratch files were written
        calls.append(1)
        raise RuntimeError("simulated crash in the workflow")

    monkeypatch.setattr(engine, "fit", broken)
    with pytest.raises(RuntimeError, match="simulated crash"):
        preproc.run_etl(str(raw_copy), str(out), cpu=True, num_partitions=1)
    assert calls and not out.exists() and not [n for n in os.listdir(tmp_path) if n.startswith(".")]
    # The finished join stage is kept for a resume (the same command skips it), nothing else.
    work_dir = preproc.default_work_dir(str(out))
    assert sorted(os.listdir(tmp_path)) == sorted(["raw", os.path.basename(work_dir)])
    with open(os.path.join(work_dir, preproc.STATE_NAME)) as f:
        assert list(json.load(f)["done"]) == ["join"]
    # An existing output directory is left exactly as it was.
    out.mkdir()
    (out / "keep.txt").write_text("x")
    with pytest.raises(RuntimeError, match="simulated crash"):
        preproc.run_etl(str(raw_copy), str(out), cpu=True, num_partitions=1, overwrite=True)
    assert sorted(os.listdir(out)) == ["keep.txt"]


def test_non_empty_output_needs_overwrite(raw_copy, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "old.txt").write_text("x")
    rc, err = _run(raw_copy, out, capsys)
    assert rc == 2 and "not empty" in err and "--overwrite" in err
    assert sorted(os.listdir(out)) == ["old.txt"]


def test_script_reports_a_missing_file(raw_copy, tmp_path):
    os.remove(raw_copy / "documents_topics.csv")
    run = subprocess.run(["bash", os.path.join(RECIPE_DIR, "scripts", "preproc.sh"), str(raw_copy),
                          str(tmp_path / "out"), "--cpu"], env=subprocess_env(), capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 2 and "documents_topics.csv: missing raw Outbrain file" in run.stderr
    assert not (tmp_path / "out").exists()


def test_bad_value_in_a_later_block_names_the_file_row(raw_copy):
    """The streamed (pyarrow) reader falls back to the text path at the failing block: the row is the file's."""
    path = raw_copy / "clicks_train.csv"
    df = pd.read_csv(path, dtype=str, keep_default_na=False)
    df.loc[1500, "ad_id"] = "12x"
    df.loc[1700, "display_id"] = "3.0"     # an integer written as a float is accepted, as before
    df.to_csv(path, index=False)
    frames = raw.iter_raw_frames(str(raw_copy), "clicks_train", block_bytes=4096)
    with pytest.raises(raw.RawInputError, match=r"clicks_train.csv: row 1501, column 'ad_id': cannot read '12x'"):
        for _ in frames:
            pass
    df.loc[1500, "ad_id"] = "12"
    df.to_csv(path, index=False)
    got = pd.concat(raw.iter_raw_frames(str(raw_copy), "clicks_train", block_bytes=4096), ignore_index=True)
    assert len(got) == len(df) and got.loc[1700, "display_id"] == 3 and got.loc[1500, "ad_id"] == 12


def test_truncated_file_names_the_last_row(raw_copy, tmp_path, capsys):
    path = raw_copy / "clicks_train.csv"
    text = path.read_bytes()
    cut = text.rfind(b",", 0, len(text) - 40)      # mid-line: the last row loses its last column
    path.write_bytes(text[:cut])
    rows = text[:cut].count(b"\n")                   # data rows before the cut one, plus the header line
    rc, err = _run(raw_copy, tmp_path / "out", capsys)
    assert rc == 2 and f"clicks_train.csv: row {rows}, column 'clicked': missing value" in err, err
    assert not (tmp_path / "out").exists()


def test_nvtabular_engine_without_nvtabular_is_one_clear_error(raw_copy, tmp_path, capsys, monkeypatch):
    import sys
    monkeypatch.setitem(sys.modules, "nvtabular", None)   # as where NVTabular is not installed
    out = tmp_path / "out"
    rc, err = _run(raw_copy, out, capsys, "--engine", "nvtabular")
    assert rc == 2 and "--engine nvtabular needs NVTabular" in err and "--engine default" in err
    assert not out.exists() and not os.path.exists(preproc.default_work_dir(str(out)))
