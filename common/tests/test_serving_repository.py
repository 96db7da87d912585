"""Triton repositories written atomically: refused when non-empty, --overwrite replaces only the tool's own files,
a failing export leaves the old repository intact, sidecars validated."""
import json
import os

import pytest

from recsys_common.io import OutputDirectoryError
from recsys_common.serving.model_config import ModelConfigError, check_model_directory
from recsys_common.serving.repository import SidecarError, model_repository, read_sidecar
from serving_tiny_model import MAX_ID, MODEL_NAME, TINY_SIDECAR, tiny_config_text, write_tiny_repository


def test_repository_layout_and_sidecar(tmp_path):
    repo = str(tmp_path / "repo")
    model_dir = write_tiny_repository(repo, tool="tests.tiny")
    assert sorted(os.listdir(model_dir)) == ["1", "config.pbtxt", "recsys_serving.json"]
    assert os.listdir(os.path.join(model_dir, "1")) == ["model.onnx"]
    assert check_model_directory(model_dir).name == MODEL_NAME
    sidecar = read_sidecar(model_dir)
    assert sidecar["inputs"]["cat"]["max_id"] == MAX_ID and sidecar["created_by"] == "tests.tiny"


def test_non_empty_repository_refused_without_overwrite(tmp_path):
    repo = str(tmp_path / "repo")
    write_tiny_repository(repo)
    with pytest.raises(OutputDirectoryError, match="not empty.*--overwrite"):
        write_tiny_repository(repo)


def test_overwrite_keeps_the_users_files(tmp_path):
    repo = str(tmp_path / "repo")
    model_dir = write_tiny_repository(repo)
    notes = os.path.join(repo, "NOTES.md")
    mine = os.path.join(model_dir, "my_notes.txt")
    for path in (notes, mine):
        with open(path, "w") as f:
            f.write("user")
    before = os.path.getmtime(os.path.join(model_dir, "config.pbtxt"))
    os.utime(os.path.join(model_dir, "config.pbtxt"), (before - 100, before - 100))
    write_tiny_repository(repo, overwrite=True)
    assert open(notes).read() == "user" and open(mine).read() == "user"
    assert os.path.getmtime(os.path.join(model_dir, "config.pbtxt")) > before - 50  # replaced
    check_model_directory(model_dir)


def test_user_file_at_a_name_the_tool_writes_is_refused(tmp_path):
    repo = str(tmp_path / "repo")
    os.makedirs(os.path.join(repo, MODEL_NAME))
    with open(os.path.join(repo, MODEL_NAME, "config.pbtxt"), "w") as f:
        f.write("the user's own config")
    with pytest.raises(OutputDirectoryError, match="not written by this tool"):
        write_tiny_repository(repo, overwrite=True)
    assert open(os.path.join(repo, MODEL_NAME, "config.pbtxt")).read() == "the user's own config"


def test_failed_export_leaves_the_old_repository(tmp_path):
    repo = str(tmp_path / "repo")
    model_dir = write_tiny_repository(repo)
    before = sorted(os.listdir(model_dir))
    with pytest.raises(ModelConfigError, match="model.onnx: missing or empty model file"):
        with model_repository(repo, overwrite=True, tool="tests.tiny") as writer:
            writer.add_model(MODEL_NAME, tiny_config_text(), sidecar=TINY_SIDECAR)  # and no model.onnx written
    with pytest.raises(RuntimeError, match="export crashed"):
        with model_repository(repo, overwrite=True, tool="tests.tiny") as writer:
            writer.add_model(MODEL_NAME, tiny_config_text(), sidecar=TINY_SIDECAR)
            raise RuntimeError("export crashed")
    assert sorted(os.listdir(model_dir)) == before
    check_model_directory(model_dir)
    assert not [n for n in os.listdir(repo) if n.startswith(".recsys_tmp")]


def test_add_model_checks(tmp_path):
    with model_repository(str(tmp_path / "repo")) as writer:
        with pytest.raises(ModelConfigError, match="is named 'tiny-onnx'"):
            writer.add_model("other", tiny_config_text())
        with pytest.raises(ValueError, match="model name '../x'"):
            writer.add_model("../x", tiny_config_text())
        bad = dict(TINY_SIDECAR, inputs={"cat": {"dtype": "int64", "dims": [1], "max_id": 0}})
        with pytest.raises(SidecarError, match="inputs.cat.max_id must be a positive integer"):
            writer.add_model(MODEL_NAME, tiny_config_text(), sidecar=bad)
        version_dir = writer.add_model(MODEL_NAME, tiny_config_text(), sidecar=TINY_SIDECAR)
        with open(os.path.join(version_dir, "model.onnx"), "wb") as f:
            f.write(b"x")


def test_read_sidecar_errors(tmp_path):
    with pytest.raises(SidecarError, match="no sidecar file"):
        read_sidecar(str(tmp_path))
    with open(tmp_path / "recsys_serving.json", "w") as f:
        json.dump({"inputs": {}, "outputs": ["p"]}, f)
    with pytest.raises(SidecarError, match="'inputs' must be a non-empty object"):
        read_sidecar(str(tmp_path))


def test_per_column_id_bounds(tmp_path):
    """The sidecar's per-column bounds are checked against the input's width (the served model.py then refuses ids
    outside them per column: common/tests/test_triton_bad_requests.py)."""
    entry = {"dtype": "int64", "dims": [3], "max_id": [10, 20, 5]}
    sidecar = dict(TINY_SIDECAR, inputs={"categorical": entry})
    with model_repository(str(tmp_path / "repo")) as writer:
        with pytest.raises(SidecarError, match=r"max_id has 2 bounds but dims \[3\]"):
            writer.add_model(MODEL_NAME, tiny_config_text(), sidecar=dict(
                sidecar, inputs={"categorical": dict(entry, max_id=[10, 20])}))
        version_dir = writer.add_model(MODEL_NAME, tiny_config_text(), sidecar=sidecar)
        with open(os.path.join(version_dir, "model.onnx"), "wb") as f:
            f.write(b"x")
    assert read_sidecar(str(tmp_path / "repo" / MODEL_NAME))["inputs"]["categorical"]["max_id"] == [10, 20, 5]
