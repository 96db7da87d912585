"""Writing a Triton model repository atomically, and our sidecar file beside each model.

    with model_repository("deploy/repo", overwrite=False, tool="dlrm.deploy") as repo:
        version_dir = repo.add_model("dlrm-onnx", config_text, sidecar={...})
        export_onnx(model, os.path.join(version_dir, "model.onnx"))
    # here deploy/repo/dlrm-onnx/{config.pbtxt, recsys_serving.json, 1/model.onnx} exist, complete and checked

Rules (from ``recsys_common.io.atomic_directory``): a non-empty repository directory is refused unless
``overwrite``; with ``overwrite`` only the files that ``tool`` wrote there earlier are replaced (a user's file, or
another tool's model, stays); if the block raises (or a model is incomplete), nothing changes on disk.

The sidecar ``recsys_serving.json`` (Triton ignores it) records what a client needs beyond ``config.pbtxt``::

    {"recipe": "dlrm", "format": "onnx",
     "inputs": {"numerical": {"dtype": "float32", "dims": [13], "max_id": null},
                "cat_0": {"dtype": "int64", "dims": [1], "max_id": 1000},      # ids must be in [0, max_id)
                "categorical": {"dtype": "int64", "dims": [3], "max_id": [10, 20, 5]},  # one bound per column
                "raw": {"dtype": "bytes", "dims": [26], "max_id": null, "max_length": 8}},  # bytes per string
     "outputs": ["probability"], "feature_spec": {...} or null, "created_by": "dlrm.deploy"}

It imports ``model_config`` (whose tritonclient import is lazy) and nothing heavy.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
from typing import Any, Dict, Iterator, List, Optional

from recsys_common.cli import InputError
from recsys_common.io import atomic_directory
from .model_config import ModelConfigError, check_model_directory, parse_model_config_text

SIDECAR_NAME = "recsys_serving.json"
_MODEL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")


class SidecarError(InputError):
    """A missing or malformed ``recsys_serving.json``; the message names the file and the field."""


def validate_sidecar(sidecar: Dict[str, Any], source: str = "sidecar") -> Dict[str, Any]:
    """Check the sidecar's shape: ``inputs`` {name: {"dtype", "dims", "max_id" (int > 0 or None)}}, ``outputs`` a list
    of names. Returns it (as given). Raises ``SidecarError`` naming the field."""
    if not isinstance(sidecar, dict):
        raise SidecarError(f"{source}: expected a JSON object, got {type(sidecar).__name__}")
    inputs = sidecar.get("inputs")
    if not isinstance(inputs, dict) or not inputs:
        raise SidecarError(f"{source}: 'inputs' must be a non-empty object {{name: {{dtype, dims, max_id}}}}")
    for name, entry in inputs.items():
        if not isinstance(entry, dict) or "dtype" not in entry or "dims" not in entry:
            raise SidecarError(f"{source}: inputs.{name} must be an object with 'dtype', 'dims' and 'max_id'")
        max_id = entry.get("max_id")
        bounds = max_id if isinstance(max_id, list) else [max_id]
        if max_id is not None and (not bounds or any(isinstance(b, bool) or not isinstance(b, int) or b <= 0
                                                     for b in bounds)):
            raise SidecarError(f"{source}: inputs.{name}.max_id must be a positive integer, a list of them (one per "
                               f"column of the last dimension) or null, got {max_id!r}")
        max_length = entry.get("max_length")
        if max_length is not None and (isinstance(max_length, bool) or not isinstance(max_length, int)
                                       or max_length <= 0):
            raise SidecarError(f"{source}: inputs.{name}.max_length (bytes per string) must be a positive integer "
                               f"or absent, got {max_length!r}")
        if isinstance(max_id, list) and (not entry["dims"] or entry["dims"][-1] != len(max_id)):
            raise SidecarError(f"{source}: inputs.{name}.max_id has {len(max_id)} bounds but dims {entry['dims']} "
                               f"end in {entry['dims'][-1] if entry['dims'] else 'nothing'} columns")
    outputs = sidecar.get("outputs")
    if not isinstance(outputs, list) or not outputs or not all(isinstance(o, str) for o in outputs):
        raise SidecarError(f"{source}: 'outputs' must be a non-empty list of output names")
    return sidecar


def read_sidecar(model_dir: str) -> Dict[str, Any]:
    """The parsed ``<model_dir>/recsys_serving.json``; ``SidecarError`` if missing or malformed."""
    path = os.path.join(model_dir, SIDECAR_NAME)
    try:
        with open(path, "r", encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        raise SidecarError(f"{path}: no sidecar file (written by the recipe's exporter next to config.pbtxt)") from None
    except ValueError as e:
        raise SidecarError(f"{path}: not valid JSON ({e})") from None
    return validate_sidecar(data, source=path)


class RepositoryWriter:
    """Adds models to a repository being staged by ``model_repository`` (do not build one yourself)."""

    def __init__(self, staging_dir: str, tool: str):
        self.staging_dir = staging_dir
        self.tool = tool
        self.models: List[str] = []

    def add_model(self, name: str, config_text: str, *, version: int = 1,
                  sidecar: Optional[Dict[str, Any]] = None) -> str:
        """Write ``<name>/config.pbtxt`` (and ``<name>/recsys_serving.json`` when ``sidecar`` is given; its
        ``created_by`` defaults to the tool) and create the version directory.

        Returns the STAGING version directory (``.../<name>/<version>``): write ``model.onnx`` / ``model.pt`` /
        ``model.savedmodel`` there. The config's name must equal ``name``; every model is checked with
        ``check_model_directory`` when the block ends.
        """
        if not _MODEL_NAME.match(name or ""):
            raise ValueError(f"model name {name!r}: use letters, digits, '_', '-', '.' (it is a directory name)")
        if name in self.models:
            raise ValueError(f"model {name!r} added twice to the repository")
        if not isinstance(version, int) or version < 1:
            raise ValueError(f"model {name!r}: version must be an integer >= 1, got {version!r}")
        config = parse_model_config_text(config_text, source=f"config of model {name!r}")
        if config.name != name:
            raise ModelConfigError(f"config of model {name!r} is named {config.name!r}; Triton requires the two equal")
        data = None
        if sidecar is not None:  # checked before anything is written
            data = dict(sidecar)
            data.setdefault("created_by", self.tool)
            validate_sidecar(data, source=f"sidecar of model {name!r}")
        model_dir = os.path.join(self.staging_dir, name)
        version_dir = os.path.join(model_dir, str(version))
        os.makedirs(version_dir)
        with open(os.path.join(model_dir, "config.pbtxt"), "w", encoding="utf-8") as f:
            f.write(config_text)
        if data is not None:
            with open(os.path.join(model_dir, SIDECAR_NAME), "w", encoding="utf-8") as f:
                json.dump(data, f, indent=1, sort_keys=True)
                f.write("\n")
        self.models.append(name)
        return version_dir


@contextlib.contextmanager
def model_repository(repo_dir: str, *, overwrite: bool = False, tool: str = "recsys_common.serving",
                     backend: str = "native") -> Iterator[RepositoryWriter]:
    """Stage a Triton model repository and move it into ``repo_dir`` when the block succeeds.

    Args:
        repo_dir: the repository directory (created if absent).
        overwrite: replace this ``tool``'s earlier outputs in a non-empty ``repo_dir`` (other files are kept);
            without it a non-empty ``repo_dir`` raises ``recsys_common.io.OutputDirectoryError`` before any work.
        tool: who writes (e.g. "dlrm.deploy"); a later run of the same tool with ``overwrite`` replaces exactly the
            files this one wrote (all its models), never another tool's.
        backend: "native" (each model on its platform's backend, as written) or "python": every model rewritten
            as its Python-backend variant when the block ends (``python_backend``: the CPU repository).
    Yields: a ``RepositoryWriter``. When the block ends every added model is checked (``check_model_directory``:
    e.g. the exporter forgot ``model.onnx``) before anything is moved; any error leaves ``repo_dir`` as it was.
    """
    from .python_backend import BACKENDS, convert_to_python_backend
    if backend not in BACKENDS:
        raise ValueError(f"backend {backend!r} is not one of {BACKENDS}")
    with atomic_directory(repo_dir, overwrite, tool=tool) as staging:
        writer = RepositoryWriter(staging, tool)
        yield writer
        if not writer.models:
            raise ValueError(f"{repo_dir}: no model was added to the repository")
        for name in writer.models:
            check_model_directory(os.path.join(staging, name))
            if backend == "python":
                convert_to_python_backend(os.path.join(staging, name))
                check_model_directory(os.path.join(staging, name))
