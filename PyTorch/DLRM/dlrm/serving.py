"""DLRM for inference: a trained checkpoint as an eager model, the served module and its sidecar.

The ONNX / TorchScript export into a Triton repository is ``recsys_common.serving.torch_export`` (shared with NCF);
``deployment/deploy.py`` calls it with :func:`serving_module` and :func:`sidecar`.

The served model (:class:`ServingDLRM`) takes

    numerical    FP32  [B, N]   the N numerical features, as the training data holds them (already log-transformed
                                by the Criteo preprocessing; float16 in split-binary files, sent as float32)
    categorical  INT64 [B, T]   one id per categorical feature, in the FeatureSpec's categorical channel order;
                                ``0 <= id < cardinality`` of its table (any id with ``--hash_indices``)

and returns ``probability`` FP32 ``[B, 1]`` = ``sigmoid(logit)`` of the trained DLRM. These are NVIDIA's deployer's
two inputs (``input__0`` numerical, ``input__1`` categorical) under names that say what they are.

A model trained on negatives kept with probability ``w < 1`` (``prepare_clicks --negative_downsampling_rate``)
predicts the click rate of the down-sampled data; :class:`CalibratedServingDLRM` serves the full data's
``sigmoid(logit + log w)`` (``recsys_common.metrics.correct_downsampled_logits``), the ``log w`` a constant ``Add``
in the exported graph. With ``w = 1`` :func:`serving_module` returns the plain :class:`ServingDLRM` (no extra op).

Embeddings are served as one plain lookup per table (``F.embedding``, an ONNX ``Gather``), not the training path's
``EmbeddingBag`` or TorchRec collection: with one id per bag the result is the same row, and an id is checked
against its own table (an index into one concatenated table would silently read the next table's rows). The check
is in the exported graph: a row with an id outside ``[0, cardinality)`` scores NaN in every format and on any server
(``recsys_common.serving.id_range_torch``); ONNX's ``Gather`` alone would wrap a negative id to the table's end.

Loading (:func:`load_model`) builds the plain ``multi_table`` model on the CPU and reads the checkpoint through
:func:`dlrm.checkpointing.load_checkpoint`, so checkpoints of any embedding type and process count load. The
model configuration comes from the checkpoint's ``meta.json``; flags given by the user are checked against it and a
difference is an error naming the layer or table (:class:`ModelMismatchError`).

    >>> import torch
    >>> from dlrm.model.parallel import ModelConfig
    >>> model = build_eager_model(ModelConfig(2, [10, 20], ["a", "b"], 4, [4], [8, 1]))
    >>> ServingDLRM(model)(torch.zeros(3, 2), torch.zeros(3, 2, dtype=torch.long)).shape
    torch.Size([3, 1])
"""
from __future__ import annotations

import dataclasses
import math
import os
import warnings
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from dlrm import checkpointing
from dlrm.model.dlrm import DLRM
from dlrm.model.parallel import ModelConfig, build_trainable_model
from recsys_common.cli import InputError
from recsys_common.serving import torch_export
from recsys_common.serving.id_range_torch import checked_ids, flag_rows
from recsys_common.serving.rows import random_rows

NUMERICAL = "numerical"
CATEGORICAL = "categorical"
INPUT_NAMES = (NUMERICAL, CATEGORICAL)
OUTPUT_NAME = "probability"


class ModelMismatchError(InputError):
    """A checkpoint that does not match the flags or FeatureSpec given with it; names the layer, table or flag."""


# ----------------------------------------------------------------------------------------------- the served module
class ServingDLRM(nn.Module):
    """``(numerical [B, N] float32, categorical [B, T] int64) -> probability [B, 1] float32`` around a DLRM.

    Shares the trained model's MLP and interaction modules and its table weights (no copy).
    """

    def __init__(self, model: DLRM):
        super().__init__()
        self.bottom_mlp = model.bottom_mlp
        self.interaction = model.interaction
        self.top_mlp = model.top_mlp
        self.hash_indices = bool(model.hash_indices)
        weights = _table_weights(model)
        self.tables = nn.ModuleList([nn.Embedding.from_pretrained(w, freeze=True) for w in weights])
        self.register_buffer("sizes", torch.tensor(model.table_sizes, dtype=torch.int64), persistent=False)

    def logit_and_row_ok(self, numerical: torch.Tensor,
                         categorical: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """``(logit [B, 1], row_ok [B, 1] bool)``: the DLRM's logit and whether every id of the row is in range."""
        if self.hash_indices:
            categorical = torch.remainder(categorical, self.sizes)
        # the id range check in the graph (``recsys_common.serving.id_range_torch``): a row with an id outside its
        # table scores NaN on any server (ONNX's Gather would wrap a negative id, a GPU gather read zeros)
        categorical, row_ok = checked_ids(categorical, self.sizes)
        bottom = self.bottom_mlp(numerical)
        columns = [F.embedding(categorical[:, i], table.weight) for i, table in enumerate(self.tables)]
        embedded = torch.stack(columns, dim=1)                                  # [B, T, d]
        logit = self.top_mlp(self.interaction(bottom, embedded))               # [B, 1]
        return logit, row_ok

    def forward(self, numerical: torch.Tensor, categorical: torch.Tensor) -> torch.Tensor:
        logit, row_ok = self.logit_and_row_ok(numerical, categorical)
        return flag_rows(torch.sigmoid(logit), row_ok)


class CalibratedServingDLRM(ServingDLRM):
    """:class:`ServingDLRM` of a model trained on negatives kept with probability ``negative_downsampling_rate``
    (w in (0, 1)): ``probability = sigmoid(logit + log w)``, the full data's click probability
    ``q = p / (p + (1 - p) / w)`` (``recsys_common.metrics.correct_downsampled_logits``)."""

    def __init__(self, model: DLRM, negative_downsampling_rate: float):
        super().__init__(model)
        self.negative_downsampling_rate = float(negative_downsampling_rate)
        # a float attribute: a constant in the exported graph
        self.log_negative_rate = math.log(self.negative_downsampling_rate)

    def forward(self, numerical: torch.Tensor, categorical: torch.Tensor) -> torch.Tensor:
        logit, row_ok = self.logit_and_row_ok(numerical, categorical)
        return flag_rows(torch.sigmoid(logit + self.log_negative_rate), row_ok)


def check_negative_downsampling_rate(rate: float, flag: str = "--negative_downsampling_rate") -> float:
    """``rate`` as a float in (0, 1]; otherwise a ValueError naming ``flag``."""
    try:
        value = float(rate)
    except (TypeError, ValueError):
        value = float("nan")
    if not 0.0 < value <= 1.0:   # also refuses NaN
        raise ValueError(f"{flag} must lie in (0, 1] (the probability a training negative was kept), got {rate!r}")
    return value


def _table_weights(model: DLRM) -> List[torch.Tensor]:
    embeddings = model.embeddings
    if hasattr(embeddings, "table_weights"):
        return [w.detach() for w in embeddings.table_weights()]
    raise TypeError(f"serving needs plain tables (multi_table); got {type(embeddings).__name__} (load the model "
                    f"with dlrm.serving.load_model, which builds them)")


def serving_module(model: DLRM, negative_downsampling_rate: float = 1.0) -> ServingDLRM:
    """The eval-mode, CPU, gradient-free served module of ``model``; with ``negative_downsampling_rate`` < 1 the
    :class:`CalibratedServingDLRM` (probabilities of the full data), with 1.0 the plain :class:`ServingDLRM`."""
    rate = check_negative_downsampling_rate(negative_downsampling_rate)
    core = model.cpu().eval()
    module = (ServingDLRM(core) if rate == 1.0 else CalibratedServingDLRM(core, rate)).cpu().eval()
    for p in module.parameters():
        p.requires_grad_(False)
    return module


# -------------------------------------------------------------------------------------------------------- loading
def build_eager_model(config: ModelConfig) -> DLRM:
    """A randomly initialised plain-table DLRM of ``config`` on the CPU, in eval mode (seeded by the caller)."""
    trainable = build_trainable_model(config, "multi_table", torch.device("cpu"), 1, lr=0.0)
    return trainable.core.eval()


def config_from_meta(meta: Dict[str, Any], where: str) -> ModelConfig:
    saved = dict(meta.get("config") or {})
    fields = {f.name for f in dataclasses.fields(ModelConfig)}
    # ``hotness`` came with multi-hot support: checkpoints written before it are single-hot (its default).
    # The DCN sizes came with --interaction_op dcn: checkpoints written before it have no cross layers.
    missing = sorted(fields - set(saved) - {"hotness", "dcn_num_layers", "dcn_low_rank_dim"})
    if missing:
        raise ModelMismatchError(f"{where}/meta.json: model configuration lacks {missing}")
    return ModelConfig(**{k: saved[k] for k in fields if k in saved})


def check_flags(config: ModelConfig, where: str, *, num_numerical_features: Optional[int] = None,
                table_sizes: Optional[Sequence[int]] = None, table_source: str = "the FeatureSpec",
                embedding_dim: Optional[int] = None, bottom_mlp_sizes: Optional[Sequence[int]] = None,
                top_mlp_sizes: Optional[Sequence[int]] = None, interaction_op: Optional[str] = None,
                hash_indices: Optional[bool] = None) -> None:
    """Raise :class:`ModelMismatchError` naming the first layer / table / flag where the given values (``None``:
    not given) differ from the checkpoint's configuration ``config``."""
    def fail(what: str) -> None:
        raise ModelMismatchError(f"checkpoint {where} does not match the flags: {what}")

    if num_numerical_features is not None and num_numerical_features != config.num_numerical_features:
        fail(f"bottom MLP input: the checkpoint has {config.num_numerical_features} numerical features, "
             f"--num_numerical_features gives {num_numerical_features}")
    if embedding_dim is not None and embedding_dim != config.embedding_dim:
        fail(f"embedding tables: the checkpoint has --embedding_dim {config.embedding_dim}, the flags give "
             f"{embedding_dim}")
    for flag, given, saved in (("bottom_mlp_sizes", bottom_mlp_sizes, config.bottom_mlp_sizes),
                               ("top_mlp_sizes", top_mlp_sizes, config.top_mlp_sizes)):
        if given is None:
            continue
        given, saved = [int(v) for v in given], [int(v) for v in saved]
        layer = flag.split("_")[0]
        for i, (g, s) in enumerate(zip(given, saved)):
            if g != s:
                fail(f"{layer} MLP layer {i} has {s} units in the checkpoint, --{flag} gives {g} "
                     f"(checkpoint: {','.join(map(str, saved))})")
        if len(given) != len(saved):
            fail(f"{layer} MLP has {len(saved)} layers in the checkpoint ({','.join(map(str, saved))}), "
                 f"--{flag} gives {len(given)} ({','.join(map(str, given))})")
    if interaction_op is not None and interaction_op != config.interaction_op:
        fail(f"interaction: the checkpoint uses --interaction_op {config.interaction_op}, the flags give "
             f"{interaction_op}")
    if hash_indices is not None and bool(hash_indices) != bool(config.hash_indices):
        fail(f"the checkpoint was trained with --hash_indices {config.hash_indices}, the flags give {hash_indices}")
    if table_sizes is not None:
        if len(table_sizes) != len(config.table_sizes):
            fail(f"the checkpoint has {len(config.table_sizes)} embedding tables, {table_source} has "
                 f"{len(table_sizes)} categorical features")
        # --max_table_size with --hash_indices trains every larger table capped at one size (ids taken modulo it),
        # which is then the largest table: a checkpoint table of that size may be smaller than its cardinality.
        cap = max(int(s) for s in config.table_sizes) if config.hash_indices and config.table_sizes else None
        for i, (given_rows, saved_rows) in enumerate(zip(table_sizes, config.table_sizes)):
            capped_here = cap is not None and int(saved_rows) == cap < int(given_rows)
            if int(given_rows) != int(saved_rows) and not capped_here:
                fail(f"embedding table {i} ({config.feature_names[i]}) has {saved_rows} rows in the checkpoint, "
                     f"{table_source} gives {given_rows}")


def load_model(checkpoint: str, **expected: Any) -> Tuple[DLRM, ModelConfig, str]:
    """Load checkpoint ``checkpoint`` (one ``step_<N>`` directory, or a ``--save_checkpoint_path`` directory: its
    newest) into a plain-table eager DLRM on the CPU; returns ``(model in eval mode, config, checkpoint path)``.

    ``expected``: keyword values of :func:`check_flags` (flags the user gave); a difference raises
    :class:`ModelMismatchError` naming the layer or table. A damaged or foreign checkpoint raises
    ``dlrm.checkpointing.CheckpointError`` naming the file.
    """
    path = checkpointing.resolve_checkpoint(checkpoint)
    meta = checkpointing.read_meta(path)
    config = config_from_meta(meta, path)
    check_flags(config, path, **expected)
    trainable = build_trainable_model(config, "multi_table", torch.device("cpu"), 1, lr=0.0)
    with warnings.catch_warnings():
        # "torch.distributed is ... uninitialized, assuming the intent is to load in a single process": it is.
        warnings.filterwarnings("ignore", message=".*assuming the intent is to load in a single process")
        checkpointing.load_checkpoint(path, trainable, load_optimizer=False, config=config.to_dict())
    model = trainable.core.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model, config, path


# -------------------------------------------------------------------------------------------------------- inputs
def example_inputs(config: ModelConfig, rows: int, seed: int = 0) -> Dict[str, np.ndarray]:
    """``rows`` random valid rows as the served inputs (``recsys_common.serving.rows.random_rows`` of the sidecar's
    inputs): numerical float32 ``[rows, N]`` standard normal (the preprocessing's log-transformed range), categorical
    int64 ``[rows, T]`` uniform in each table (also with ``--hash_indices``, so rows score like training rows)."""
    inputs = sidecar(config, None)["inputs"]
    inputs[CATEGORICAL] = dict(inputs[CATEGORICAL], max_id=[int(n) for n in config.table_sizes])
    return random_rows(inputs, rows, seed)


def predict_probabilities(module: nn.Module, numerical: np.ndarray, categorical: np.ndarray,
                          batch_size: int = 65536) -> np.ndarray:
    """``module`` (a :class:`ServingDLRM` or its TorchScript) on numpy inputs in batches; float32 ``[rows]``."""
    return torch_export.predict(module, {NUMERICAL: np.asarray(numerical, np.float32),
                                         CATEGORICAL: np.asarray(categorical, np.int64)}, batch_size)


# -------------------------------------------------------------------------------------------------------- export
def sidecar(config: ModelConfig, checkpoint: Optional[str], feature_spec: Optional[dict] = None,
            negative_downsampling_rate: float = 1.0) -> Dict:
    """``recsys_serving.json`` (``torch_export.write_repository`` adds ``format``): inputs (``categorical``'s
    ``max_id`` is one bound per column, the table sizes; ``null`` with ``--hash_indices``, where any id is valid),
    outputs, the model configuration, and the negative down-sampling rate ``w`` whose ``log w`` the served logit
    gets (1.0: none)."""
    return {"recipe": "PyTorch/DLRM",
            "inputs": {NUMERICAL: {"dtype": "float32", "dims": [config.num_numerical_features], "max_id": None},
                       CATEGORICAL: {"dtype": "int64", "dims": [len(config.table_sizes)],
                                     "max_id": None if config.hash_indices else [int(n) for n in config.table_sizes],
                                     "features": list(config.feature_names)}},
            "outputs": [OUTPUT_NAME],
            "feature_spec": feature_spec,
            "negative_downsampling_rate": float(negative_downsampling_rate),
            "model_config": config.to_dict(), "checkpoint": os.path.abspath(checkpoint) if checkpoint else None}
