"""A training checkpoint as servable models (monolithic, or split into a sparse and a dense half), and the Triton
model repository of them (:func:`write_repository`, what ``deployment/deploy.py`` runs).

The serving interface (the same for the SavedModel, the ONNX model and the ensemble; batch dimension first)::

    numerical   float32 [b, num_numerical]       the numerical features (absent when the data has none)
    cat_<t>     int64   [b, hotness_t]           ids of categorical feature t (channel order of the feature spec),
                                                 in [0, rows_t); multi-hot rows padded with -1 (summed, as training)
    ->
    probability float32 [b, 1]                   sigmoid of the model's logit (+ log w, see below)

One input per categorical feature (not NVIDIA's single ``categorical_features [26]``) so that a multi-hot feature
can have its own width and the server can check each feature's ids against its own table size
(``recsys_serving.json``'s ``max_id``); the feature spec's names are recorded in the sidecar (``features``).

The two-model split (the seed's ensemble for models larger than one GPU)::

    sparse:  cat_<t> ...                       -> embeddings float32 [b, sum_t dim_t]   (table order, concatenated)
    dense:   numerical, embeddings             -> probability float32 [b, 1]

``sparse`` then ``dense`` computes exactly the monolithic model (same lookups, same dense half).

A model trained on negatives kept with probability ``w < 1`` (``prepare_clicks --negative_downsampling_rate``;
``LoadedModel.negative_downsampling_rate``) serves the full data's probability ``sigmoid(logit + log w)``
(``recsys_common.metrics.correct_downsampled_logits``), the ``log w`` a constant added inside the monolithic and the
dense graphs; with ``w = 1`` no op is added (the graph of a model without down-sampling).

Example (one process, CPU)::

    loaded = load_checkpoint_model("/tmp/dlrm_dcnv2_quickstart/dlrm_checkpoint")   # newest step_<N>
    export_onnx(loaded, "monolithic", "/tmp/model.onnx")
    write_repository("/tmp/dlrm_dcnv2_quickstart/dlrm_checkpoint", "/tmp/dlrm_repo", cpu=True)

TensorFlow (with the model code and tf2onnx) is imported inside the functions that build or run graphs, on purpose:
the commands over this module (``deployment/``, ``python -m dlrm_dcnv2.predict``) check their flags and inputs
without a TensorFlow start-up.
"""
from __future__ import annotations

import json
import logging
import math
import os
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from dlrm_dcnv2.checkpointing import CheckpointError, read_state, resolve_checkpoint, restore_checkpoint
from dlrm_dcnv2.data.dataloader import load_spec, metadata_from_spec
from recsys_common.cli import InputError
from recsys_common.datasets import DatasetError, open_reader
from recsys_common.feature_spec import negative_downsampling_rate as recorded_rate
from recsys_common.io import check_output_directory
from recsys_common.serving.model_config import EnsembleStep, TensorSpec, check_model_directory, model_config_text
from recsys_common.serving.repository import model_repository
from recsys_common.serving.rows import random_rows

LOG = logging.getLogger("dlrm_dcnv2.serving")

NUMERICAL = "numerical"
PROBABILITY = "probability"
EMBEDDINGS = "embeddings"
PAD = -1
DEFAULT_OPSET = 17
# ONNX models are one protobuf, which cannot exceed 2 GiB; keep a margin for the graph itself.
ONNX_MAX_WEIGHT_BYTES = int(1.9 * 2 ** 30)


def categorical_input(table: int) -> str:
    """Name of the serving input holding the ids of categorical feature ``table``."""
    return f"cat_{table}"


@dataclass
class LoadedModel:
    """A checkpoint rebuilt as the recipe's Keras ``RecModel`` (``model``), with what describes it.

    ``config``: the checkpoint's model configuration (``state.json``: model, table_sizes, embedding_dims, hotness,
    num_numerical_features, interaction, MLPs, cross layers); ``path``: the ``step_<N>`` directory; ``step``;
    ``negative_downsampling_rate``: w in (0, 1] of the training data, whose ``log w`` the served logits get.
    """
    model: Any
    config: Dict[str, Any]
    path: str
    step: int
    negative_downsampling_rate: float = 1.0

    def served_logits(self, logits):
        """float32 ``logits`` as served: ``+ log w`` when w < 1, else unchanged (no op in the graph)."""
        if self.negative_downsampling_rate == 1.0:
            return logits
        return logits + math.log(self.negative_downsampling_rate)

    @property
    def table_sizes(self) -> List[int]:
        return [int(n) for n in self.config["table_sizes"]]

    @property
    def hotness(self) -> List[int]:
        return [int(h) for h in self.config["hotness"]]

    @property
    def embedding_dims(self) -> List[int]:
        return [int(d) for d in self.config["embedding_dims"]]

    @property
    def num_numerical(self) -> int:
        return int(self.config["num_numerical_features"])

    @property
    def model_name(self) -> str:
        return str(self.config.get("model", "dlrm"))

    def table_bytes(self) -> int:
        return 4 * sum(r * d for r, d in zip(self.table_sizes, self.embedding_dims))


# ------------------------------------------------------------------------------------------------ loading
def checkpoint_config(checkpoint: str) -> Tuple[str, Dict[str, Any], Dict[str, Any]]:
    """``(step_<N> path, state.json, model config)`` of ``checkpoint`` (one step_<N>, or a directory of them)."""
    path = resolve_checkpoint(checkpoint)
    state = read_state(path)
    config = state.get("config") or {}
    needed = ("table_sizes", "embedding_dims", "hotness", "num_numerical_features", "interaction",
              "bottom_mlp_dims", "top_mlp_dims")
    missing = [k for k in needed if k not in config]
    if missing:
        raise CheckpointError(f"{os.path.join(path, 'state.json')}: the model configuration lacks {missing}; it "
                              f"was not written by dlrm.py / dcnv2.py of this recipe")
    return path, state, config


def check_feature_spec(config: Dict[str, Any], spec, where: str) -> List[str]:
    """Refuse a feature spec whose data the checkpoint's model cannot score; returns its categorical feature names.

    Compared per feature (channel order): the number of categorical features, each one's cardinality against the
    table's rows (more ids than rows cannot be looked up; fewer is accepted), its max hotness, and the number of
    numerical features. Raises ``CheckpointError`` naming the spec file, the feature and both values.
    """
    meta = metadata_from_spec(spec)
    origin = getattr(spec, "origin", "feature spec")
    tables, hotness = list(config["table_sizes"]), list(config["hotness"])
    problems = []
    if meta.num_tables != len(tables):
        problems.append(f"{meta.num_tables} categorical features ({', '.join(meta.categorical_features)}), the "
                        f"checkpoint has {len(tables)} tables")
    else:
        for t, name in enumerate(meta.categorical_features):
            if meta.table_sizes[t] > tables[t]:
                problems.append(f"feature {name!r} (table {t}) has cardinality {meta.table_sizes[t]}, the "
                                f"checkpoint's table has {tables[t]} rows")
            if meta.hotness[t] > hotness[t]:
                problems.append(f"feature {name!r} (table {t}) has max_hotness {meta.hotness[t]}, the checkpoint "
                                f"was trained with {hotness[t]}")
    if meta.num_numerical != int(config["num_numerical_features"]):
        problems.append(f"{meta.num_numerical} numerical features, the checkpoint has "
                        f"{config['num_numerical_features']}")
    if problems:
        raise CheckpointError(f"{origin} does not match the checkpoint {where}: " + "; ".join(problems))
    return list(meta.categorical_features)


def load_checkpoint_model(checkpoint: str, feature_spec=None) -> LoadedModel:
    """Rebuild the model of ``checkpoint`` (its ``state.json`` describes it; no model flags needed) on one process
    and load its weights. ``feature_spec`` (a ``FeatureSpec``): also check that its data fits the model.

    Raises ``CheckpointError`` for a missing/incomplete checkpoint, a spec that does not match, or weights that do
    not fit the configuration (naming the file and table/layer).
    """
    import tensorflow as tf
    from dlrm_dcnv2.model.model import build_model

    path, state, config = checkpoint_config(checkpoint)
    if feature_spec is not None:
        check_feature_spec(config, feature_spec, path)
    # Served models compute in float32 whatever the training precision (--amp keeps float32 weights anyway).
    previous = tf.keras.mixed_precision.global_policy().name
    tf.keras.mixed_precision.set_global_policy("float32")
    try:
        interaction = "dot_tensorflow" if str(config["interaction"]).startswith("dot") else config["interaction"]
        model = build_model(table_sizes=config["table_sizes"], embedding_dims=config["embedding_dims"],
                            bottom_mlp_dims=config["bottom_mlp_dims"], top_mlp_dims=config["top_mlp_dims"],
                            interaction=interaction, num_numerical_features=int(config["num_numerical_features"]),
                            hotness=config["hotness"], num_cross_layers=config.get("num_cross_layers") or 3,
                            cross_layer_projection_dim=config.get("cross_layer_projection_dim"), seed=0,
                            # zeros: the tables are overwritten from the checkpoint, no need to draw them first
                            embedding_zeros_initializer=True, use_mde_embeddings=False)
        restore_checkpoint(path, model, None, None, config=config, load_optimizer=False)
    finally:
        tf.keras.mixed_precision.set_global_policy(previous)
    return LoadedModel(model=model, config=dict(config), path=path, step=int(state["global_step"]))


# ------------------------------------------------------------------------------------------------ serving functions
def _specs(loaded: LoadedModel, numerical: bool = True, categorical: bool = True,
           embeddings: bool = False) -> list:
    import tensorflow as tf
    specs = []
    if numerical and loaded.num_numerical:
        specs.append(tf.TensorSpec([None, loaded.num_numerical], tf.float32, name=NUMERICAL))
    if embeddings:
        specs.append(tf.TensorSpec([None, sum(loaded.embedding_dims)], tf.float32, name=EMBEDDINGS))
    if categorical:
        specs += [tf.TensorSpec([None, h], tf.int64, name=categorical_input(t)) for t, h in enumerate(loaded.hotness)]
    return specs


def model_ids(tensors, hotness: Sequence[int]) -> tuple:
    """Serving ids ``[b, h]`` -> the model's: ``[b]`` for one-hot tables, ``[b, h]`` (padded -1) for multi-hot."""
    import tensorflow as tf
    return tuple(tf.reshape(x, [-1]) if h == 1 else x for x, h in zip(tensors, hotness))


def _checked_ids(loaded: LoadedModel, tensors) -> tuple:
    """``(the model's ids, row_ok [b])``: the id range check inside the exported graph
    (``recsys_common.serving.id_range_tf``): an id outside ``[min_id, rows)`` of its table (``min_id`` -1 for the
    padding of multi-hot tables) is looked up as row 0 and its request row flagged, so the part scores it NaN on any
    server instead of a GPU gather's zeros or ONNX's wrapped negative id."""
    from recsys_common.serving.id_range_tf import all_rows_ok, checked_ids
    safe, oks = [], []
    for x, rows, h in zip(tensors, loaded.table_sizes, loaded.hotness):
        ids, ok = checked_ids(x, rows, PAD if h > 1 else 0)
        safe.append(ids)
        oks.append(ok)
    return model_ids(safe, loaded.hotness), all_rows_ok(oks)


def monolithic_function(loaded: LoadedModel) -> Tuple[Callable, list]:
    """``(tf.function, input specs)``: numerical, cat_<t>... -> {"probability": [b, 1]} (the whole model)."""
    import tensorflow as tf
    model, has_numerical = loaded.model, loaded.num_numerical > 0
    specs = _specs(loaded)

    def serve(*inputs):
        from recsys_common.serving.id_range_tf import flag_rows
        numerical = inputs[0] if has_numerical else tf.zeros([tf.shape(inputs[0])[0], 0], tf.float32)
        categorical, row_ok = _checked_ids(loaded, inputs[1:] if has_numerical else inputs)
        logits = model((numerical, categorical), training=False)
        return {PROBABILITY: flag_rows(tf.sigmoid(loaded.served_logits(tf.cast(logits, tf.float32))), row_ok)}

    return tf.function(serve, input_signature=specs), specs


def sparse_function(loaded: LoadedModel) -> Tuple[Callable, list]:
    """``(tf.function, input specs)``: cat_<t>... -> {"embeddings": [b, sum(dims)]} (every table's lookup)."""
    import tensorflow as tf
    sparse = loaded.model.sparse
    specs = _specs(loaded, numerical=False)

    def serve(*inputs):
        from recsys_common.serving.id_range_tf import flag_rows
        ids, row_ok = _checked_ids(loaded, inputs)
        embeddings = sparse(ids, training=False)
        # NaN embeddings for a flagged row: the dense part then scores it NaN
        return {EMBEDDINGS: flag_rows(tf.concat([tf.cast(e, tf.float32) for e in embeddings], axis=1), row_ok)}

    return tf.function(serve, input_signature=specs), specs


def dense_function(loaded: LoadedModel) -> Tuple[Callable, list]:
    """``(tf.function, input specs)``: numerical, embeddings -> {"probability": [b, 1]} (MLPs + interaction)."""
    import tensorflow as tf
    dense, dims, has_numerical = loaded.model.dense, loaded.embedding_dims, loaded.num_numerical > 0
    specs = _specs(loaded, categorical=False, embeddings=True)

    def serve(*inputs):
        embeddings = inputs[-1]
        numerical = inputs[0] if has_numerical else tf.zeros([tf.shape(embeddings)[0], 0], tf.float32)
        parts = tf.split(embeddings, dims, axis=1)
        logits = dense(numerical, parts, training=False)
        return {PROBABILITY: tf.sigmoid(loaded.served_logits(tf.cast(logits, tf.float32)))}

    return tf.function(serve, input_signature=specs), specs


PARTS = {"monolithic": monolithic_function, "sparse": sparse_function, "dense": dense_function}


# ------------------------------------------------------------------------------------------------ writing
def export_savedmodel(loaded: LoadedModel, part: str, path: str) -> None:
    """Write ``part`` ("monolithic", "sparse", "dense") of ``loaded`` as a SavedModel directory ``path``
    (signature ``serving_default``; only the variables that part uses)."""
    import tensorflow as tf
    fn, _ = PARTS[part](loaded)
    module = tf.Module()
    # The variables the part needs, tracked by the module so the SavedModel holds them (and only them).
    module.model = {"monolithic": loaded.model, "sparse": loaded.model.sparse, "dense": loaded.model.dense}[part]
    module.serve = fn
    tf.saved_model.save(module, path, signatures={"serving_default": fn})


def export_onnx(loaded: LoadedModel, part: str, path: str, opset: int = DEFAULT_OPSET) -> None:
    """Write ``part`` of ``loaded`` as an ONNX model file ``path`` (tf2onnx, ``opset``).

    Raises ``ValueError`` when the part holds more than :data:`ONNX_MAX_WEIGHT_BYTES` of tables (one ONNX protobuf
    cannot exceed 2 GiB): serve the tables from a SavedModel instead (``--sparse-format tf-savedmodel``).
    """
    if part != "dense" and loaded.table_bytes() > ONNX_MAX_WEIGHT_BYTES:
        raise ValueError(f"the embedding tables take {loaded.table_bytes() / 2 ** 30:.2f} GiB; an ONNX model is one "
                         f"protobuf of at most 2 GiB: deploy the tables as a TensorFlow SavedModel "
                         f"(--sparse-format tf-savedmodel with --layout ensemble, or --formats tf-savedmodel)")
    import tf2onnx
    fn, specs = PARTS[part](loaded)
    tf2onnx.convert.from_function(fn, input_signature=specs, opset=int(opset), output_path=path)


def io_description(loaded: LoadedModel, part: str) -> Tuple[Dict[str, Dict[str, Any]], Dict[str, Dict[str, Any]]]:
    """``(inputs, outputs)`` of ``part``: ``{name: {"dtype", "dims", "max_id", "min_id"}}`` (dims without the batch
    dimension; ``max_id``: ids must be < max_id; ``min_id``: -1 where multi-hot padding is allowed, else 0)."""
    inputs: Dict[str, Dict[str, Any]] = {}
    if part in ("monolithic", "dense") and loaded.num_numerical:
        inputs[NUMERICAL] = {"dtype": "float32", "dims": [loaded.num_numerical], "max_id": None}
    if part == "dense":
        inputs[EMBEDDINGS] = {"dtype": "float32", "dims": [sum(loaded.embedding_dims)], "max_id": None}
    if part in ("monolithic", "sparse"):
        for t, (rows, h) in enumerate(zip(loaded.table_sizes, loaded.hotness)):
            inputs[categorical_input(t)] = {"dtype": "int64", "dims": [h], "max_id": rows,
                                            "min_id": PAD if h > 1 else 0}
    if part == "sparse":
        outputs = {EMBEDDINGS: {"dtype": "float32", "dims": [sum(loaded.embedding_dims)]}}
    else:
        outputs = {PROBABILITY: {"dtype": "float32", "dims": [1]}}
    return inputs, outputs


def sidecar(loaded: LoadedModel, part: str, fmt: str, feature_names: Optional[Sequence[str]] = None,
            feature_spec: Optional[dict] = None, created_by: str = "deployment/deploy.py") -> Dict[str, Any]:
    """The ``recsys_serving.json`` of one model (see SERVING: Triton ignores it; our runtime and tools read it)."""
    inputs, outputs = io_description(loaded, part)
    names = list(feature_names) if feature_names else [None] * len(loaded.table_sizes)
    return {"recipe": "TensorFlow2/DLRM_DCNv2", "model": loaded.model_name, "part": part, "format": fmt,
            "inputs": inputs, "outputs": list(outputs), "output_specs": outputs,
            "features": {categorical_input(t): names[t] for t in range(len(loaded.table_sizes))},
            "embedding_dims": loaded.embedding_dims, "model_config": json.loads(json.dumps(loaded.config)),
            "checkpoint": loaded.path, "global_step": loaded.step, "feature_spec": feature_spec,
            # the w whose log the served logit gets (1.0: none; the sparse part has no logit)
            "negative_downsampling_rate": loaded.negative_downsampling_rate if part != "sparse" else None,
            "created_by": created_by}


# ------------------------------------------------------------------------------------------------ reference outputs
def keras_probabilities(loaded: LoadedModel, inputs: Dict[str, np.ndarray]) -> np.ndarray:
    """The Keras model's probabilities ``[b, 1]`` for serving ``inputs`` (name -> array), eagerly: the reference the
    exported models are compared with (with ``log w`` added to the logits as the served models do)."""
    import tensorflow as tf
    numerical = (tf.constant(inputs[NUMERICAL], tf.float32) if loaded.num_numerical
                 else tf.zeros([len(next(iter(inputs.values()))), 0], tf.float32))
    ids = model_ids([tf.constant(inputs[categorical_input(t)], tf.int64) for t in range(len(loaded.hotness))],
               loaded.hotness)
    logits = loaded.model((numerical, ids), training=False)
    return tf.sigmoid(loaded.served_logits(tf.cast(logits, tf.float32))).numpy()


def random_inputs(loaded: LoadedModel, batch_size: int, seed: int = 0) -> Dict[str, np.ndarray]:
    """A valid batch of the monolithic model's serving inputs (``recsys_common.serving.rows.random_rows`` of its
    sidecar inputs): numericals N(0, 1), ids uniform in each table, multi-hot rows padded with -1 after a random
    number (at least one) of ids."""
    return random_rows(io_description(loaded, "monolithic")[0], batch_size, seed)


# ------------------------------------------------------------------------------------------------ dataset rows
def read_feature_batches(spec, mapping: str, categorical: Sequence[str], numerical: Sequence[str],
                         batch_size: int) -> Iterator[Tuple[int, Dict[str, np.ndarray]]]:
    """Yield ``(first_row, {serving input name: array})`` batches of ``mapping`` of a dataset (any split-binary /
    CSV / parquet spec; labels not needed): ``numerical`` float32 [b, n], ``cat_<t>`` int64 [b, hotness] (padded
    with -1). Ids are range-checked per batch (``DatasetError`` naming the file, feature and row); numericals must be
    finite."""
    channels = [ch for ch in spec.channel_spec if "label" not in ch.lower() and spec.channel_spec[ch]]
    reader = open_reader(spec, mapping, batch_size, channels=channels, check_values=True)
    position = {name: t for t, name in enumerate(categorical)}
    for index in range(reader.num_batches_total):
        batch = reader.read_batch(index)
        first = index * batch_size
        columns: Dict[str, np.ndarray] = {}
        for ch in channels:
            names, value = spec.channel_spec[ch], batch[ch]
            for j, name in enumerate(names):
                columns[name] = value[j] if isinstance(value, list) else value[:, j]
        out: Dict[str, np.ndarray] = {}
        if numerical:
            values = np.stack([np.asarray(columns[n], np.float32) for n in numerical], axis=1)
            if not np.isfinite(values).all():
                row, col = (int(x[0]) for x in np.nonzero(~np.isfinite(values)))
                source = spec.resolve_file(spec.chunk_of_feature(mapping, numerical[col])["files"][0])
                raise DatasetError(f"{source}: numerical feature {numerical[col]!r} row {first + row} is "
                                   f"{values[row, col]} (NaN/inf)")
            out[NUMERICAL] = values
        for name in categorical:
            ids = np.asarray(columns[name], np.int64)
            out[categorical_input(position[name])] = ids.reshape(len(ids), -1)
        yield first, out


def serving_inputs(batch, hotness: Sequence[int], num_numerical: int) -> Dict[str, np.ndarray]:
    """One batch of the recipe's loader (``create_input``) as the server's inputs (multi-hot ids padded with -1 to
    the model's hotness)."""
    numerical, categorical, _ = batch
    out: Dict[str, np.ndarray] = {}
    if num_numerical:
        out[NUMERICAL] = np.asarray(numerical, np.float32)
    for t, (ids, h) in enumerate(zip(categorical, hotness)):
        ids = np.asarray(ids, np.int64).reshape(len(ids), -1)
        if ids.shape[1] < h:
            ids = np.concatenate([ids, np.full((len(ids), h - ids.shape[1]), PAD, np.int64)], axis=1)
        out[categorical_input(t)] = ids
    return out


def rows_from_dataset(dataset_path: str, feature_spec: str, rows: int, mapping: str = "test") -> Dict[str, np.ndarray]:
    """The first ``rows`` rows (fewer if the split is shorter) of ``mapping`` as serving inputs."""
    spec = load_spec(dataset_path, feature_spec, "--feature_spec")
    meta = metadata_from_spec(spec)
    _, batch = next(read_feature_batches(spec, mapping, meta.categorical_features, meta.numerical_features, rows))
    return batch


# ------------------------------------------------------------------------------------------------ the repository
TOOL = "dlrm_dcnv2.deploy"
LAYOUTS = ("monolithic", "ensemble", "both")
FORMATS = ("onnx", "tf-savedmodel")
PLATFORM = {"onnx": "onnxruntime_onnx", "tf-savedmodel": "tensorflow_savedmodel"}
MODEL_FILE = {"onnx": "model.onnx", "tf-savedmodel": "model.savedmodel"}
SUFFIX = {"onnx": "onnx", "tf-savedmodel": "savedmodel"}


class DeployError(InputError):
    """A flag, checkpoint or repository problem; the message names it."""


def check_downsampling_rate(rate: Optional[float]) -> None:
    """``--negative_downsampling_rate``: None (the feature spec's) or in (0, 1] (raises ``DeployError``)."""
    if rate is not None and not 0.0 < float(rate) <= 1.0:   # also refuses NaN
        raise DeployError(f"--negative_downsampling_rate must lie in (0, 1] (the probability a training negative "
                          f"was kept), got {rate}")


def load_for_serving(checkpoint_dir: str, dataset_path: Optional[str] = None,
                     feature_spec: str = "feature_spec.yaml", negative_downsampling_rate: Optional[float] = None
                     ) -> Tuple[LoadedModel, Optional[List[str]], Optional[dict]]:
    """``(the loaded model, the spec's categorical feature names, the spec as a dict)`` (the last two None without
    ``dataset_path``): the spec checked against the checkpoint, the down-sampling rate set (``None``: the spec's
    recorded rate, 1.0 without a spec)."""
    spec = spec_dict = feature_names = None
    if dataset_path:
        spec = load_spec(dataset_path, feature_spec, "--feature_spec")
        spec_dict = spec.to_dict()
    loaded = load_checkpoint_model(checkpoint_dir, spec)
    if spec is not None:
        feature_names = check_feature_spec(loaded.config, spec, loaded.path)
    rate = negative_downsampling_rate
    if rate is None and spec is not None:
        rate = recorded_rate(spec)
    loaded.negative_downsampling_rate = 1.0 if rate is None else float(rate)
    LOG.info("negative down-sampling rate %g: %s", loaded.negative_downsampling_rate,
             f"served probabilities are sigmoid(logit + log {loaded.negative_downsampling_rate:g})"
             if loaded.negative_downsampling_rate < 1.0 else "no correction")
    return loaded, feature_names, spec_dict


@dataclass(frozen=True)
class TritonModels:
    """What every model of one repository gets: its ``config.pbtxt`` settings and the sidecar's description."""
    loaded: LoadedModel
    max_batch_size: int = 32768
    dynamic_batching_delay_us: Optional[int] = None
    instance_count: int = 1
    instance_kind: str = "KIND_GPU"
    version: int = 1
    opset: int = DEFAULT_OPSET
    feature_names: Optional[Sequence[str]] = None
    spec_dict: Optional[dict] = None

    def add(self, repo, model: str, part: str, fmt: str) -> str:
        """Write ``part`` in format ``fmt`` as ``model`` into ``repo``; returns its Triton platform."""
        inputs, outputs = io_description(self.loaded, part)
        text = model_config_text(model, PLATFORM[fmt], _tensor_specs(inputs), _tensor_specs(outputs),
                                 self.max_batch_size, dynamic_batching_delay_us=self.dynamic_batching_delay_us,
                                 instance_count=self.instance_count, instance_kind=self.instance_kind)
        version_dir = repo.add_model(model, text, version=self.version,
                                     sidecar=sidecar(self.loaded, part, fmt, self.feature_names, self.spec_dict))
        target = os.path.join(version_dir, MODEL_FILE[fmt])
        LOG.info("exporting %s (%s, %s) ...", model, part, fmt)
        if fmt == "onnx":
            export_onnx(self.loaded, part, target, self.opset)
        else:
            export_savedmodel(self.loaded, part, target)
        return PLATFORM[fmt]

    def add_ensemble(self, repo, name: str, sparse_name: str, dense_name: str, sparse_format: str,
                     dense_format: str) -> Dict[str, str]:
        """The seed's two-model ensemble: ``sparse_name`` (lookups), ``dense_name`` (MLPs) and ``name`` chaining
        them; returns ``{model: platform}``."""
        written = {sparse_name: self.add(repo, sparse_name, "sparse", sparse_format),
                   dense_name: self.add(repo, dense_name, "dense", dense_format)}
        inputs, outputs = io_description(self.loaded, "monolithic")
        sparse_inputs, _ = io_description(self.loaded, "sparse")
        dense_inputs, _ = io_description(self.loaded, "dense")
        steps = [EnsembleStep(sparse_name, {n: n for n in sparse_inputs}, {EMBEDDINGS: EMBEDDINGS}),
                 EnsembleStep(dense_name, {n: n for n in dense_inputs}, {PROBABILITY: PROBABILITY})]
        text = model_config_text(name, "ensemble", _tensor_specs(inputs), _tensor_specs(outputs),
                                 self.max_batch_size, ensemble_steps=steps)
        repo.add_model(name, text, version=self.version,
                       sidecar=dict(sidecar(self.loaded, "monolithic", "ensemble", self.feature_names,
                                            self.spec_dict), steps=[sparse_name, dense_name]))
        written[name] = "ensemble"
        return written


def _tensor_specs(description: Dict[str, Dict[str, Any]]) -> List[TensorSpec]:
    return [TensorSpec(n, d["dtype"], d["dims"]) for n, d in description.items()]


def write_repository(checkpoint_dir: str, repository: str, *, model_name: Optional[str] = None,
                     sparse_model_name: Optional[str] = None, dense_model_name: Optional[str] = None,
                     version: int = 1, layout: str = "monolithic", formats: Sequence[str] = FORMATS,
                     sparse_format: str = "tf-savedmodel", dense_format: str = "onnx", max_batch_size: int = 32768,
                     dynamic_batching_delay_us: Optional[int] = None, instance_count: int = 1, cpu: bool = False,
                     opset: int = DEFAULT_OPSET, dataset_path: Optional[str] = None,
                     feature_spec: str = "feature_spec.yaml", overwrite: bool = False,
                     negative_downsampling_rate: Optional[float] = None, backend: str = "native") -> Dict[str, Any]:
    """Write the Triton repository of ``checkpoint_dir`` (see ``deployment/deploy.py``); returns ``{"repository",
    "models": {name: platform}, "checkpoint", "model", "negative_downsampling_rate"}``. Raises ``DeployError`` /
    ``CheckpointError`` / ``OutputDirectoryError``. ``negative_downsampling_rate``: w of the training data, whose
    ``log w`` the served logits get (``None``: the feature spec's recorded rate, 1.0 without ``dataset_path``).
    ``backend``: "native" (each format's Triton platform) or "python" (the CPU repository: every model through
    Triton's Python backend, the ensemble still Triton's; ``recsys_common.serving.python_backend``); the returned
    platforms are the formats' either way."""
    check_output_directory(repository, overwrite)  # before minutes of loading and exporting
    check_downsampling_rate(negative_downsampling_rate)
    loaded, feature_names, spec_dict = load_for_serving(checkpoint_dir, dataset_path, feature_spec,
                                                        negative_downsampling_rate)
    name = model_name or loaded.model_name
    models = TritonModels(loaded, max_batch_size, dynamic_batching_delay_us, instance_count,
                          "KIND_CPU" if cpu else "KIND_GPU", version, opset, feature_names, spec_dict)
    written: Dict[str, str] = {}
    with model_repository(repository, overwrite=overwrite, tool=TOOL, backend=backend) as repo:
        if layout in ("monolithic", "both"):
            for fmt in formats:
                written[f"{name}-{SUFFIX[fmt]}"] = models.add(repo, f"{name}-{SUFFIX[fmt]}", "monolithic", fmt)
        if layout in ("ensemble", "both"):
            written.update(models.add_ensemble(repo, name, sparse_model_name or f"{name}-sparse",
                                               dense_model_name or f"{name}-dense", sparse_format, dense_format))
    for model in written:  # what landed on disk, checked once more as Triton would load it
        check_model_directory(os.path.join(repository, model))
    return {"repository": os.path.abspath(repository), "models": written, "checkpoint": loaded.path,
            "model": loaded.model_name, "negative_downsampling_rate": loaded.negative_downsampling_rate}
