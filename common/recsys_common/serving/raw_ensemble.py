"""Add a raw-request ensemble to a model repository: ``<model>-raw`` = raw values -> ids -> ``<model>``.

    python -m recsys_common.serving.raw_ensemble --repository deploy/repo --model dlrm-onnx \\
        --raw_features_from /data/criteo_binary

adds two models beside ``<model>`` (which stays as it is)::

    <model>-raw-preprocess/config.pbtxt        backend "python": the raw inputs of the dataset's mapping in, the
                                               served model's inputs out (same names, dtypes, dims)
    <model>-raw-preprocess/1/model.py          raw_preprocess_model.py, beside recsys_python_model.py (the shared
                                               Python-backend base) and raw_features/ (the dataset's saved mapping:
                                               dictionaries, id mappings; copied, so the model reads nothing
                                               outside its directory)
    <model>-raw/config.pbtxt                   platform "ensemble": the preprocessing step, then <model>; its inputs
                                               are the raw ones, its outputs <model>'s

The raw inputs per dataset (``recsys_common.serving.raw_features``): Criteo ``raw_integer`` BYTES [13] and
``raw_categorical`` BYTES [26]; a ``prepare_clicks`` dataset ``raw_categorical`` / ``raw_numerical`` BYTES; NCF
``user`` / ``item`` INT64 [1]. The repository keeps every other file (``recsys_common.io.atomic_directory``: this
tool replaces only what it wrote there before); the recipes' ``deploy.py --raw_features_from DATASET`` calls
``add_raw_ensemble`` after writing their repository.
"""
from __future__ import annotations

import argparse
import os
import shutil
from typing import List, Optional, Sequence, Tuple

from .model_config import (CONFIG_NAME, EnsembleStep, ModelConfigError, config_tensors, model_config_text,
                           parse_model_config)
from .python_backend import BASE_MODULE_NAME, MODEL_SOURCE
from .raw_features import RAW_FILES_DIRECTORY, copy_mapping_files, describe, load_raw_mapper
from .repository import model_repository

TOOL = "recsys_common.serving.raw_ensemble"
PREPROCESS_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "raw_preprocess_model.py")
RAW_SUFFIX, PREPROCESS_SUFFIX = "-raw", "-raw-preprocess"


def raw_model_names(model: str) -> Tuple[str, str]:
    """(preprocessing model, ensemble) names for served model ``model``."""
    return model + PREPROCESS_SUFFIX, model + RAW_SUFFIX


def add_raw_ensemble(repo_dir: str, model: str, dataset: str, overwrite: bool = True) -> str:
    """Add ``<model>-raw-preprocess`` and the ensemble ``<model>-raw`` to the repository ``repo_dir`` (see the module
    docstring), mapping with ``dataset``'s saved mapping. Returns the ensemble's name. ``overwrite``: replace what
    this tool wrote there before (the repository itself is never empty: it holds ``model``)."""
    config_path = os.path.join(repo_dir, model, CONFIG_NAME)
    if not os.path.isfile(config_path):
        raise ModelConfigError(f"{config_path}: not found; --model must name a model of the repository {repo_dir}")
    target = parse_model_config(config_path)
    tensors = config_tensors(target)
    mapper = load_raw_mapper(dataset)
    raw_inputs = mapper.raw_inputs()
    preprocess, ensemble = raw_model_names(model)
    batch = int(target.max_batch_size)
    internal = {t.name: f"mapped_{t.name}" for t in tensors["inputs"]}
    # one record per ensemble (tool name): adding another model's ensemble later replaces nothing of this one
    with model_repository(repo_dir, overwrite=overwrite, tool=f"{TOOL}:{model}") as repo:
        version_dir = repo.add_model(preprocess, model_config_text(
            preprocess, "", raw_inputs, tensors["inputs"], batch, backend="python"),
            sidecar={"inputs": {s.name: {"dtype": "bytes" if s.dtype == "object" else s.dtype, "dims": list(s.dims),
                                         "max_id": None} for s in raw_inputs},
                     "outputs": [t.name for t in tensors["inputs"]], "raw_features": describe(mapper)})
        shutil.copyfile(PREPROCESS_SOURCE, os.path.join(version_dir, "model.py"))
        shutil.copyfile(MODEL_SOURCE, os.path.join(version_dir, BASE_MODULE_NAME))
        copy_mapping_files(mapper, os.path.join(version_dir, RAW_FILES_DIRECTORY))
        steps = [EnsembleStep(preprocess, {s.name: s.name for s in raw_inputs}, internal),
                 EnsembleStep(model, {name: tensor for name, tensor in internal.items()},
                              {t.name: t.name for t in tensors["outputs"]})]
        repo.add_model(ensemble, model_config_text(ensemble, "ensemble", raw_inputs, tensors["outputs"], batch,
                                                   ensemble_steps=steps))
    print(f"[raw_ensemble] {repo_dir}: {ensemble} = {preprocess} ({mapper.kind} mapping of {dataset}) -> {model}",
          flush=True)
    return ensemble


def add_raw_features_argument(parser) -> None:
    """The recipes' deployers' opt-in flag: ``--raw_features_from DATASET`` (see ``add_raw_ensembles``)."""
    parser.add_argument("--raw_features_from", metavar="DATASET", default=None,
                        help="also write <model>-raw for each model: a Triton ensemble that takes raw feature values "
                             "and maps them with DATASET's saved dictionaries / id mappings, as training did "
                             "(recsys_common.serving.raw_ensemble)")


def add_raw_ensembles(model_dirs: Sequence[str], dataset: Optional[str]) -> List[str]:
    """``add_raw_ensemble`` for each written model directory (``<repo>/<model>``) when ``dataset`` is given (the
    ``--raw_features_from`` value), except the members of an ensemble among them (TensorFlow2's sparse and dense
    halves take no whole request; their ensemble does); returns the raw ensembles' names."""
    if not dataset:
        return []
    dirs = [os.path.abspath(os.path.normpath(d)) for d in model_dirs]
    members = set()
    for d in dirs:
        config = parse_model_config(os.path.join(d, CONFIG_NAME))
        members.update(step.model_name for step in config.ensemble_scheduling.step)
    return [add_raw_ensemble(os.path.dirname(d), os.path.basename(d), dataset) for d in dirs
            if os.path.basename(d) not in members]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m recsys_common.serving.raw_ensemble",
                                     description="add <model>-raw (raw values -> ids -> model) to a repository")
    parser.add_argument("--repository", required=True, help="the Triton model repository holding --model")
    parser.add_argument("--model", required=True, help="the served model the ensemble feeds")
    parser.add_argument("--raw_features_from", required=True, metavar="DATASET",
                        help="the prepared dataset whose saved mapping the ensemble applies")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> str:
    args = build_parser().parse_args(argv)
    return add_raw_ensemble(args.repository, args.model, args.raw_features_from)


if __name__ == "__main__":
    from recsys_common.cli import run_main
    from .raw_features import RawFeatureError
    run_main(main, input_errors=(ModelConfigError, RawFeatureError, FileExistsError))
