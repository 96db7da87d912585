"""A training checkpoint as servable models: monolithic, or split into a sparse (embeddings) and a dense half.

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
    fn, specs = monolithic_function(loaded)
    export_onnx(fn, specs, "/tmp/model.onnx")
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

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
    from dlrm_dcnv2.utils.checkpointing import CheckpointError, read_state, resolve_checkpoint
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
    from dlrm_dcnv2.dataloading.dataloader import metadata_from_spec
    from dlrm_dcnv2.utils.checkpointing import CheckpointError
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
    from dlrm_dcnv2.nn.model import build_model
    from dlrm_dcnv2.utils.checkpointing import restore_checkpoint

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


def _ids(tensors, hotness: Sequence[int]) -> tuple:
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
    return _ids(safe, loaded.hotness), all_rows_ok(oks)


def monolithic_function(loaded: LoadedModel) -> Tuple[Callable, list]:
    """``(tf.function, input specs)``: numerical, cat_<t>... -> {"probability": [b, 1]} (the whole model)."""
    import tensorflow as tf
    model, hotness, has_numerical = loaded.model, loaded.hotness, loaded.num_numerical > 0
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
    sparse, hotness = loaded.model.sparse, loaded.hotness
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
    ids = _ids([tf.constant(inputs[categorical_input(t)], tf.int64) for t in range(len(loaded.hotness))],
               loaded.hotness)
    logits = loaded.model((numerical, ids), training=False)
    return tf.sigmoid(loaded.served_logits(tf.cast(logits, tf.float32))).numpy()


def random_inputs(loaded: LoadedModel, batch_size: int, seed: int = 0) -> Dict[str, np.ndarray]:
    """A valid batch of the monolithic model's serving inputs (``recsys_common.serving.rows.random_rows`` of its
    sidecar inputs): numericals N(0, 1), ids uniform in each table, multi-hot rows padded with -1 after a random
    number (at least one) of ids."""
    from recsys_common.serving.rows import random_rows
    return random_rows(io_description(loaded, "monolithic")[0], batch_size, seed)
