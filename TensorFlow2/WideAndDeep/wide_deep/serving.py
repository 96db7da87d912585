"""Checkpoint -> Triton model repository: SavedModel and ONNX of the recipe's models (the library; the command is
``deployment/deploy.py``, NVIDIA's ``triton/export_model.py`` runs it).

    python deployment/deploy.py --checkpoint-dir /tmp/wide_deep_quickstart/model \\
        --dataset_path /tmp/wide_deep_quickstart/data --embedding_sizes_file /tmp/wide_deep_quickstart/embedding_sizes.json \\
        --deep_hidden_units 32 32 --model-repository /tmp/wd_repo

writes (``recsys_common.serving.repository``: staged, then moved in; an existing repository is refused unless
``--overwrite``, which replaces only this tool's files)::

    <repo>/widedeep-onnx/{config.pbtxt, recsys_serving.json, 1/model.onnx}             platform onnxruntime_onnx
    <repo>/widedeep-savedmodel/{config.pbtxt, recsys_serving.json, 1/model.savedmodel/} platform tensorflow_savedmodel

Serving inputs: one per feature of the feature spec, named by feature, with the spec's dtype (Outbrain: int32 ids,
float32 numericals); dims without the batch dimension: ``[1]`` for a one-hot id or a numerical, ``[max_hotness]`` for a
multi-hot list padded with -1. The sidecar records each id input's range (``min_id`` -1 for padded lists, 0 otherwise;
``max_id`` = the spec's cardinality, exclusive). Output: ``probability`` FP32 ``[1]`` = sigmoid(wide + deep).

``--model movielens`` exports the HugeCTR-notebook MovieLens model (``wide_deep.movielens.train`` snapshots,
``--checkpoint-dir <model_dir>/snapshot_<step>``) the same way (``movielens-onnx``, ``movielens-savedmodel``): the
graph exported for inference.

A checkpoint that does not match the flags (a layer width, a table size, a missing or extra layer) is refused before
anything is written, naming the variable, both shapes and the flag to check.
"""
from __future__ import annotations

import argparse
import os
from typing import Dict, List, Optional, Sequence, Tuple

import tensorflow as tf

from recsys_common.cli import InputError
from recsys_common.feature_spec import FeatureSpec
from recsys_common.serving.id_range_tf import all_rows_ok, checked_ids, flag_rows
from recsys_common.serving.model_config import TensorSpec, model_config_text
from recsys_common.serving.repository import model_repository

from .checkpointing import checkpoint_prefix   # the recipe's one reader of its checkpoints
from .data.loader import read_feature_spec
from .model.config import DEFAULT_EMBEDDING_SIZES, movielens_config
from .model.network import build_model, build_movielens_model, configure_precision
from .movielens.etl import SPEC_NAME

TOOL = "wide_deep.export_model"
OUTPUT_NAME = "probability"
FORMATS = {"onnx": ("onnxruntime_onnx", "onnx"), "tf-savedmodel": ("tensorflow_savedmodel", "savedmodel")}
WIDE_DEEP, MOVIELENS = "wide_deep", "movielens"


class CheckpointMismatchError(InputError):
    """The checkpoint's variables do not fit the model the flags build (the message names variable and flag)."""


class ServingInput:
    """One serving input: ``name``, numpy ``dtype``, ``dims`` (no batch dim), id range ``[min_id, max_id)`` or None."""

    def __init__(self, name: str, dtype: str, dims: Sequence[int], kind: str, min_id: Optional[int] = None,
                 max_id: Optional[int] = None):
        self.name, self.dtype, self.dims, self.kind = name, dtype, list(dims), kind
        self.min_id, self.max_id = min_id, max_id

    def sidecar_entry(self) -> Dict[str, object]:
        entry = {"dtype": self.dtype, "dims": self.dims, "max_id": self.max_id}
        if self.max_id is not None:
            entry["min_id"] = self.min_id
        return entry


# ------------------------------------------------------------------------------------------------ checkpoints
def expected_variables(config, with_wide: bool) -> Dict[str, Tuple[List[int], str]]:
    """``{checkpoint key: (shape, flag that decides it)}`` of the model ``config`` builds (keys as
    ``tf.train.Checkpoint(model=...)`` writes them)."""
    def key(path):
        return f"model/{path}/.ATTRIBUTES/VARIABLE_VALUE"
    out: Dict[str, Tuple[List[int], str]] = {}
    for name, card in config.categorical.items():
        out[key(f"deep/embedding_{name}")] = ([card, config.embedding_dims[name]],
                                              f"feature {name}: cardinality (feature spec) x embedding width")
        if with_wide:
            out[key(f"wide/wide_{name}")] = ([card, 1], f"feature {name}: cardinality in the feature spec")
    if with_wide:
        out[key("wide/wide_numerical")] = ([max(len(config.numerical), 1), 1], "numerical features of the spec")
        out[key("wide/wide_bias")] = ([1], "wide bias")
    width = sum(config.embedding_dims[n] for n in config.categorical) + len(config.numerical)
    for i, units in enumerate(config.hidden_units):
        out[key(f"deep/hidden/{i}/kernel")] = ([width, units], f"hidden layer {i} (hidden units flag)")
        out[key(f"deep/hidden/{i}/bias")] = ([units], f"hidden layer {i} (hidden units flag)")
        width = units
    out[key("deep/head/kernel")] = ([width, 1], "last hidden width (hidden units flag)")
    out[key("deep/head/bias")] = ([1], "output layer")
    return out


def check_checkpoint(prefix: str, expected: Dict[str, Tuple[List[int], str]], flags_hint: str) -> None:
    """Compare the checkpoint's model variables with ``expected``; raise CheckpointMismatchError on the first
    difference (missing, extra or differently shaped variable)."""
    found = {k: list(s) for k, s in tf.train.list_variables(prefix)
             if k.startswith("model/") and k.endswith("/.ATTRIBUTES/VARIABLE_VALUE") and ".OPTIMIZER_SLOT" not in k}
    for k, (shape, why) in expected.items():
        if k not in found:
            raise CheckpointMismatchError(f"checkpoint {prefix}: has no variable {k} ({why}); the flags ({flags_hint}) "
                                          f"build a different model than the one trained")
        if found[k] != shape:
            raise CheckpointMismatchError(f"checkpoint {prefix}: variable {k} has shape {found[k]}, the flags build "
                                          f"{shape} ({why}); check {flags_hint}")
    extra = sorted(set(found) - set(expected))
    if extra:
        raise CheckpointMismatchError(f"checkpoint {prefix}: variable {extra[0]} (and {len(extra) - 1} more) is not in "
                                      f"the model the flags build; check {flags_hint}")


def _restore(model, prefix: str) -> None:
    tf.train.Checkpoint(model=model).read(prefix).expect_partial().assert_existing_objects_matched()


def load_wide_deep(checkpoint_dir: str, dataset_path: str, fspec_file: str, embedding_sizes_file: str,
                   hidden_units: Sequence[int], combiner: str):
    """``(model, config, spec)``: the recipe's WideDeepModel built from the flags and restored from the checkpoint
    (float32; a model trained with ``--amp`` keeps float32 variables, so it exports the same way)."""
    configure_precision(False, True)
    spec = read_feature_spec(dataset_path, fspec_file)
    prefix = checkpoint_prefix(checkpoint_dir)
    model = build_model(spec, embedding_sizes_file, hidden_units, 0.0, combiner, seed=0)
    check_checkpoint(prefix, expected_variables(model.config, with_wide=True),
                     "--dataset_path/--fspec_file, --embedding_sizes_file, --deep_hidden_units")
    _restore(model, prefix)
    return model, model.config, spec


def load_movielens(checkpoint_dir: str, dataset_path: str, embedding_dim: int, hidden_units: Sequence[int],
                   combiner: str):
    """``(model, config, spec)``: the MovieLens deep model of ``wide_deep.movielens.train`` restored from a snapshot."""
    spec = FeatureSpec.from_yaml(os.path.join(dataset_path, SPEC_NAME))
    prefix = checkpoint_prefix(checkpoint_dir)
    config = movielens_config(spec, embedding_dim, hidden_units, combiner)
    model = build_movielens_model(config, seed=0)
    check_checkpoint(prefix, expected_variables(config, with_wide=False),
                     "--dataset_path, --embedding_dim, --hidden_units")
    _restore(model, prefix)
    return model, config, spec


def load_model(kind: str, checkpoint_dir: str, *, dataset_path: str, fspec_file: str = "feature_spec.yaml",
               embedding_sizes_file: str = "", hidden_units: Sequence[int] = (), combiner: str = "sum",
               embedding_dim: int = 16):
    """``load_wide_deep`` or ``load_movielens`` by ``kind``."""
    if kind == MOVIELENS:
        return load_movielens(checkpoint_dir, dataset_path, embedding_dim, hidden_units, combiner)
    return load_wide_deep(checkpoint_dir, dataset_path, fspec_file, embedding_sizes_file, hidden_units, combiner)


# ------------------------------------------------------------------------------------------------ serving graph
def serving_inputs(config, spec) -> List[ServingInput]:
    """The serving inputs of a model config (see the module docstring), in the model's feature order."""
    def dtype(name, default):
        return str(spec.numpy_dtype(name)) if spec.has_dtype(name) else default
    inputs = [ServingInput(n, dtype(n, "int32"), [1], "onehot", 0, int(c)) for n, c in config.onehot.items()]
    inputs += [ServingInput(n, dtype(n, "int32"), [config.max_hotness[n]], "multihot", -1, int(c))
               for n, c in config.multihot.items()]
    inputs += [ServingInput(n, dtype(n, "float32"), [1], "numerical") for n in config.numerical]
    return inputs


def to_model_inputs(features, inputs: Sequence[ServingInput]):
    """Serving tensors (``[B, 1]`` / ``[B, H]``) -> the model's inputs (``[B]`` int32 / ``[B, H]`` int32 /
    ``[B]`` float32), as the recipe's dataloader yields them."""
    out = {}
    for spec in inputs:
        x = features[spec.name]
        if spec.kind == "numerical":
            out[spec.name] = tf.reshape(tf.cast(x, tf.float32), [-1])
        elif spec.kind == "onehot":
            out[spec.name] = tf.reshape(tf.cast(x, tf.int32), [-1])
        else:
            out[spec.name] = tf.cast(x, tf.int32)
    return out


def serving_function(model, inputs: Sequence[ServingInput]):
    """``tf.function`` taking ``{name: [B, dims...]}`` and returning ``{"probability": [B, 1] float32}``."""
    signature = {s.name: tf.TensorSpec([None] + s.dims, tf.as_dtype(s.dtype), name=s.name) for s in inputs}

    @tf.function(input_signature=[signature])
    def serve(features):
        # the id range check inside the exported graph: an id outside [min_id, max_id) is looked up as 0 and its row
        # scores NaN on any server (TF's GPU gather reads zeros past a table, ONNX's Gather wraps negative ids)
        checked, oks = dict(features), []
        for s in inputs:
            if s.max_id is not None:
                checked[s.name], ok = checked_ids(features[s.name], s.max_id, s.min_id or 0)
                oks.append(ok)
        logits = model(to_model_inputs(checked, inputs), training=False)
        probability = tf.reshape(tf.sigmoid(logits), [-1, 1])
        return {OUTPUT_NAME: flag_rows(probability, all_rows_ok(oks)) if oks else probability}
    return serve


def write_savedmodel(model, inputs: Sequence[ServingInput], path: str) -> None:
    """SavedModel at ``path`` with signature ``serving_default`` (the inputs by name -> ``probability``)."""
    module = tf.Module()
    module.model = model
    module.serve = serving_function(model, inputs)
    tf.saved_model.save(module, path, signatures={"serving_default": module.serve})


def write_onnx(model, inputs: Sequence[ServingInput], path: str, opset: int = 13) -> None:
    """ONNX model at ``path`` (tf2onnx from the serving function): inputs by feature name, output ``probability``."""
    import tf2onnx   # late on purpose: only the onnx format needs it
    fn = serving_function(model, inputs)
    tf2onnx.convert.from_function(fn, input_signature=fn.input_signature, opset=opset, output_path=path)


def export_repository(model, config, spec, repo_dir: str, *, recipe: str = WIDE_DEEP, model_name: str = "widedeep",
                      formats: Sequence[str] = ("onnx", "tf-savedmodel"), version: int = 1,
                      max_batch_size: int = 131072, dynamic_batching: bool = True, max_queue_delay_us: int = 0,
                      preferred_batch_sizes: Optional[Sequence[int]] = None, instance_count: int = 1,
                      instance_kind: str = "KIND_CPU", opset: int = 13, overwrite: bool = False,
                      backend: str = "native") -> Dict[str, str]:
    """Write a Triton model repository with one model per format (``<model_name>-onnx``, ``<model_name>-savedmodel``);
    returns ``{format: model directory}``. ``backend`` "python": the CPU repository (every model through Triton's
    Python backend, ``recsys_common.serving.python_backend``)."""
    inputs = serving_inputs(config, spec)
    tensors = [TensorSpec(s.name, s.dtype, s.dims) for s in inputs]
    outputs = [TensorSpec(OUTPUT_NAME, "float32", [1])]
    written = {}
    with model_repository(repo_dir, overwrite=overwrite, tool=TOOL, backend=backend) as repo:
        for fmt in formats:
            platform, suffix = FORMATS[fmt]
            name = f"{model_name}-{suffix}"
            text = model_config_text(name, platform, tensors, outputs, max_batch_size,
                                     dynamic_batching_delay_us=max_queue_delay_us if dynamic_batching else None,
                                     preferred_batch_sizes=preferred_batch_sizes, instance_count=instance_count,
                                     instance_kind=instance_kind)
            sidecar = {"recipe": f"TensorFlow2/WideAndDeep ({recipe})", "format": suffix,
                       "inputs": {s.name: s.sidecar_entry() for s in inputs}, "outputs": [OUTPUT_NAME],
                       "feature_spec": spec.to_dict()}
            version_dir = repo.add_model(name, text, version=version, sidecar=sidecar)
            if fmt == "onnx":
                write_onnx(model, inputs, os.path.join(version_dir, "model.onnx"), opset)
            else:
                write_savedmodel(model, inputs, os.path.join(version_dir, "model.savedmodel"))
            written[fmt] = os.path.join(repo_dir, name)
    return written


# ------------------------------------------------------------------------------------------------ command line
def add_model_arguments(p: argparse.ArgumentParser) -> None:
    """The flags that rebuild the trained model (the same names and defaults as ``main.py`` /
    ``wide_deep.movielens.train``); shared by ``deployment/deploy.py``, ``evaluate_accuracy.py`` and ``predict.py``."""
    g = p.add_argument_group("the trained model (the training run's flags)")
    g.add_argument("--model", choices=[WIDE_DEEP, MOVIELENS], default=WIDE_DEEP,
                   help="wide_deep: main.py's Outbrain model; movielens: wide_deep.movielens.train's model")
    g.add_argument("--checkpoint-dir", required=True,
                   help="main.py's --model_dir (or its checkpoint/), or a MovieLens snapshot_<step>/")
    g.add_argument("--dataset_path", required=True, help="the training data directory (its feature spec)")
    g.add_argument("--fspec_file", default="feature_spec.yaml", help="feature spec, relative to --dataset_path")
    g.add_argument("--embedding_sizes_file", default=DEFAULT_EMBEDDING_SIZES, help="as main.py (wide_deep)")
    g.add_argument("--deep_hidden_units", type=int, nargs="+", default=[1024] * 5, help="as main.py (wide_deep)")
    g.add_argument("--combiner", choices=["mean", "sum"], default="sum", help="multi-hot pooling, as in training")
    g.add_argument("--embedding_dim", type=int, default=16, help="as wide_deep.movielens.train (movielens)")
    g.add_argument("--hidden_units", type=int, nargs="+", default=[128, 128],
                   help="as wide_deep.movielens.train (movielens)")


def model_parser(prog: str, doc: str) -> argparse.ArgumentParser:
    """A command's parser (``prog``, the first paragraph of ``doc`` as its description) with the flags of
    :func:`add_model_arguments`."""
    p = argparse.ArgumentParser(prog=prog, description=doc.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_model_arguments(p)
    return p


def model_from_args(args):
    """``load_model`` with the explicit values of :func:`add_model_arguments`'s flags."""
    return load_model(args.model, args.checkpoint_dir, dataset_path=args.dataset_path, fspec_file=args.fspec_file,
                      embedding_sizes_file=args.embedding_sizes_file,
                      hidden_units=args.hidden_units if args.model == MOVIELENS else args.deep_hidden_units,
                      combiner=args.combiner, embedding_dim=args.embedding_dim)
