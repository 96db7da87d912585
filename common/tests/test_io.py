"""recsys_common.io: durable atomic writes, and output directories that never lose a file the tool did not write."""
import json
import os

import pytest

from recsys_common import io as rio
from recsys_common.io import (MANIFEST_NAME, OutputDirectoryError, atomic_directory, atomic_path, atomic_write_text,
                              check_json_output, read_manifest, write_json_output)


@pytest.fixture
def events(monkeypatch):
    """Record fsyncs (by the path of the fd) and renames, in order."""
    log = []
    real_fsync, real_replace, real_rename = os.fsync, os.replace, os.rename

    def fsync(fd):
        log.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def replace(src, dst):
        log.append(("rename", str(src), str(dst)))
        real_replace(src, dst)

    def rename(src, dst):
        log.append(("rename", str(src), str(dst)))
        real_rename(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    monkeypatch.setattr(os, "rename", rename)
    return log


def test_atomic_write_fsyncs_the_file_before_and_the_directory_after_the_rename(tmp_path, events):
    target = str(tmp_path / "out.json")
    atomic_write_text(target, "{}")
    renames = [i for i, e in enumerate(events) if e[0] == "rename" and e[2] == target]
    assert len(renames) == 1
    tmp = events[renames[0]][1]
    assert ("fsync", tmp) in events[:renames[0]]                 # the data is on disk before the name points to it
    assert ("fsync", str(tmp_path)) in events[renames[0] + 1:]    # and the rename itself is durable


def test_atomic_path_fsyncs_what_the_caller_wrote(tmp_path, events):
    target = str(tmp_path / "plot.png")
    with atomic_path(target) as tmp:
        with open(tmp, "wb") as f:
            f.write(b"png")
    rename = next(i for i, e in enumerate(events) if e[0] == "rename")
    assert events[:rename] == [("fsync", tmp)] and events[rename + 1:] == [("fsync", str(tmp_path))]


def test_atomic_directory_fsyncs_every_file_and_directory_before_the_rename(tmp_path, events):
    out = str(tmp_path / "ds")
    with atomic_directory(out, marker="feature_spec.yaml") as d:
        os.makedirs(os.path.join(d, "train"))
        for name in ("train/a.bin", "train/b.bin", "feature_spec.yaml"):
            with open(os.path.join(d, name), "w") as f:
                f.write(name)
    rename = next(i for i, e in enumerate(events) if e[0] == "rename" and e[2] == out)
    staging = events[rename][1]
    before = [e[1] for e in events[:rename] if e[0] == "fsync"]
    for name in ("train/a.bin", "train/b.bin", "feature_spec.yaml", "train"):
        assert os.path.join(staging, name) in before, name
    assert staging in before
    manifest_rename = next(i for i, e in enumerate(events) if e[0] == "rename" and e[2].endswith(MANIFEST_NAME))
    assert manifest_rename < rename and ("fsync", events[manifest_rename][1]) in events[:manifest_rename]
    assert ("fsync", str(tmp_path)) in events[rename + 1:]
    assert sorted(read_manifest(out)["recsys_common"]["files"]) == ["feature_spec.yaml", "train/a.bin", "train/b.bin"]


def _write(directory, files):
    for name, text in files.items():
        os.makedirs(os.path.dirname(os.path.join(directory, name)), exist_ok=True)
        with open(os.path.join(directory, name), "w") as f:
            f.write(text)


def _run(out, files, overwrite=False, tool="t", marker="feature_spec.yaml"):
    with atomic_directory(str(out), overwrite=overwrite, tool=tool, marker=marker) as d:
        _write(d, files)


def _contents(directory):
    found = {}
    for root, _, names in os.walk(directory):
        for n in names:
            full = os.path.join(root, n)
            if n != MANIFEST_NAME:
                found[os.path.relpath(full, directory)] = open(full).read()
    return found


def test_user_files_in_the_output_directory_survive(tmp_path):
    """The issue's scenario: the output directory holds the input and notes.txt."""
    _write(tmp_path, {"ratings.csv": "1,2,3\n", "notes.txt": "mine"})
    with pytest.raises(OutputDirectoryError, match="not empty.*notes.txt.*--overwrite"):
        _run(tmp_path, {"train/a.bin": "1", "feature_spec.yaml": "v1"})
    assert _contents(tmp_path) == {"ratings.csv": "1,2,3\n", "notes.txt": "mine"}
    _run(tmp_path, {"train/a.bin": "1", "train/b.bin": "1", "feature_spec.yaml": "v1"}, overwrite=True)
    _run(tmp_path, {"train/a.bin": "2", "feature_spec.yaml": "v2"}, overwrite=True)
    # the tool's stale output (train/b.bin) is gone; everything else the user had is there
    assert _contents(tmp_path) == {"ratings.csv": "1,2,3\n", "notes.txt": "mine", "train/a.bin": "2",
                                   "feature_spec.yaml": "v2"}
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".recsys_tmp")]


def test_a_name_taken_by_a_file_the_tool_did_not_write_is_refused_and_nothing_changes(tmp_path):
    _write(tmp_path, {"feature_spec.yaml": "the user's input spec", "train/x.csv": "data"})
    with pytest.raises(OutputDirectoryError, match="feature_spec.yaml: exists and was not written by this tool"):
        _run(tmp_path, {"train/a.bin": "1", "feature_spec.yaml": "new"}, overwrite=True)
    assert _contents(tmp_path) == {"feature_spec.yaml": "the user's input spec", "train/x.csv": "data"}
    assert not os.path.exists(tmp_path / MANIFEST_NAME)
    # a file in the way of a directory the output needs
    _write(tmp_path / "o", {"train": "a file named train"})
    with pytest.raises(OutputDirectoryError, match="train: exists"):
        _run(tmp_path / "o", {"train/a.bin": "1", "feature_spec.yaml": "new"}, overwrite=True)


def test_each_tool_replaces_only_its_own_outputs(tmp_path):
    """One tool's output directory may hold another's input (Spark output, then split-binary conversion)."""
    _run(tmp_path, {"train/part-0.parquet": "spark", "cardinalities.json": "[1]"}, tool="spark",
         marker="cardinalities.json")
    _run(tmp_path, {"bin/label.bin": "b", "feature_spec.yaml": "s"}, overwrite=True, tool="binary")
    _run(tmp_path, {"bin/label.bin": "b2", "feature_spec.yaml": "s2"}, overwrite=True, tool="binary")
    assert _contents(tmp_path) == {"train/part-0.parquet": "spark", "cardinalities.json": "[1]",
                                   "bin/label.bin": "b2", "feature_spec.yaml": "s2"}
    with pytest.raises(OutputDirectoryError, match="cardinalities.json: exists and was written by spark"):
        _run(tmp_path, {"cardinalities.json": "x", "feature_spec.yaml": "s3"}, overwrite=True, tool="binary")
    assert set(read_manifest(str(tmp_path))) == {"spark", "binary"}


def test_a_failing_block_leaves_the_directory_untouched(tmp_path):
    _write(tmp_path, {"notes.txt": "mine"})
    _run(tmp_path, {"a.bin": "1", "feature_spec.yaml": "v1"}, overwrite=True)
    with pytest.raises(RuntimeError):
        with atomic_directory(str(tmp_path), overwrite=True, tool="t", marker="feature_spec.yaml") as d:
            _write(d, {"a.bin": "half"})
            raise RuntimeError("bad row")
    assert _contents(tmp_path) == {"notes.txt": "mine", "a.bin": "1", "feature_spec.yaml": "v1"}
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".recsys_tmp")]


@pytest.mark.parametrize("fail_at", [1, 2, 3, 4])
def test_a_crash_part_way_through_an_overwrite_never_leaves_the_old_marker_over_new_files(tmp_path, monkeypatch,
                                                                                           fail_at):
    _write(tmp_path, {"notes.txt": "mine"})
    _run(tmp_path, {"train/a.bin": "old", "train/b.bin": "old", "test/c.bin": "old", "feature_spec.yaml": "old"},
         overwrite=True)
    real_replace, calls = os.replace, []

    def crashing_replace(src, dst):
        if MANIFEST_NAME not in str(dst):
            calls.append(dst)
            if len(calls) == fail_at:
                raise OSError("power cut")
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", crashing_replace)
    with pytest.raises(OSError, match="power cut"):
        _run(tmp_path, {"train/a.bin": "new", "train/b.bin": "new", "test/c.bin": "new", "feature_spec.yaml": "new"},
             overwrite=True)
    monkeypatch.setattr(os, "replace", real_replace)
    left = _contents(tmp_path)
    assert "feature_spec.yaml" not in left                     # the directory no longer claims to be a dataset
    assert {v for k, v in left.items() if k != "notes.txt"} <= {"new"}   # no old file mixed with new ones
    assert left["notes.txt"] == "mine"
    # the manifest written before the first change lets a re-run with --overwrite finish the job
    _run(tmp_path, {"train/a.bin": "new", "feature_spec.yaml": "new"}, overwrite=True)
    assert _contents(tmp_path) == {"notes.txt": "mine", "train/a.bin": "new", "feature_spec.yaml": "new"}
    assert not os.path.exists(tmp_path / "test")               # the tool's own emptied directory went too


def test_a_tampered_manifest_cannot_make_a_tool_delete_files_elsewhere(tmp_path):
    (tmp_path / "outside.txt").write_text("keep")
    out = tmp_path / "out"
    _write(out, {"x": "1"})
    (out / MANIFEST_NAME).write_text(json.dumps({"format": 1, "tools": {"t": {"files": ["../outside.txt"]}}}))
    with pytest.raises(OutputDirectoryError, match="not a relative path inside"):
        _run(out, {"feature_spec.yaml": "v"}, overwrite=True)
    assert (tmp_path / "outside.txt").read_text() == "keep"


def test_an_existing_directory_is_staged_inside_itself(tmp_path):
    """Staging inside the output directory keeps every rename on one file system, also when it is a mount point
    (NVIDIA documents ``--output /data``, a container volume)."""
    (tmp_path / "out").mkdir()
    with atomic_directory(str(tmp_path / "out"), tool="t") as d:
        assert os.path.dirname(d) == str(tmp_path / "out")
        _write(d, {"a": "1"})
    assert _contents(tmp_path / "out") == {"a": "1"}


def test_output_json_refuses_to_clobber_a_file_that_is_not_json(tmp_path):
    result = str(tmp_path / "result.json")
    write_json_output(result, {"a": 1})
    write_json_output(result, {"a": 2})   # a re-run replaces its own result
    assert json.load(open(result)) == {"a": 2}
    script = tmp_path / "train.sh"
    script.write_text("#!/bin/sh\n")
    with pytest.raises(FileExistsError, match="train.sh: --output_json exists and is not a JSON file"):
        check_json_output(str(script))
    with pytest.raises(FileExistsError, match="not a regular file"):
        check_json_output(str(tmp_path))
    assert script.read_text() == "#!/bin/sh\n"


def test_dataset_writer_fsyncs_each_file_before_renaming_it(tmp_path, events):
    import numpy as np
    from recsys_common.datasets import DatasetWriter
    from recsys_common.feature_spec import FeatureSpec
    spec = FeatureSpec.get_default_feature_spec(1, [5], base_directory=str(tmp_path))
    with DatasetWriter(spec, "train") as w:
        w.write({"num_0": np.ones(3), "cat_0.bin": np.array([0, 4, 2]), "label": np.array([1, 0, 1])})
    renames = [(i, e[1]) for i, e in enumerate(events) if e[0] == "rename"]
    assert len(renames) == 3
    for i, tmp in renames:
        assert ("fsync", tmp) in events[:i]
    assert ("fsync", str(tmp_path / "train")) in events[renames[-1][0]:]


def test_write_predictions_formats_round_trip_float32(tmp_path):
    # The one writer behind the three recipes' predict.py: every format reads back to the same float32 values.
    import numpy as np
    import pyarrow.parquet as pq
    from recsys_common.io import write_predictions
    p = np.array([1 / 3, 0.1, 1e-8, 0.999999], dtype=np.float32)
    write_predictions(str(tmp_path / "p.npy"), p)
    write_predictions(str(tmp_path / "p.csv"), p)
    write_predictions(str(tmp_path / "p.parquet"), p, ids=[4, 5, 6, 7], id_name="display_id")
    write_predictions(str(tmp_path / "i.csv"), p, ids=[4, 5, 6, 7], id_name="display_id")
    loaded = np.load(tmp_path / "p.npy")
    assert loaded.dtype == np.float32 and np.array_equal(loaded, p)
    lines = (tmp_path / "p.csv").read_text().splitlines()
    assert lines[0] == "probability" and np.array_equal(np.array(lines[1:], dtype=np.float32), p)
    table = pq.read_table(tmp_path / "p.parquet")
    assert table.column_names == ["display_id", "probability"] and table.column("display_id").to_pylist() == [4, 5, 6, 7]
    assert np.array_equal(table.column("probability").to_numpy(), p)
    rows = [line.split(",") for line in (tmp_path / "i.csv").read_text().splitlines()]
    assert rows[0] == ["display_id", "probability"] and [int(r[0]) for r in rows[1:]] == [4, 5, 6, 7]
    assert np.array_equal(np.array([r[1] for r in rows[1:]], dtype=np.float32), p)
    with pytest.raises(ValueError, match="unknown prediction file extension '.txt'"):
        write_predictions(str(tmp_path / "p.txt"), p)
    assert not (tmp_path / "p.txt").exists()
