"""What the model needs to know, without TensorFlow: :class:`ModelConfig` (inputs from the feature spec, shape from
the flags), the embedding widths file, and the two configurations this recipe builds from a feature spec
(:func:`wide_deep_config`: ``main.py``'s Outbrain model; :func:`movielens_config`: the MovieLens example's network).
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Dict, List, Sequence

from recsys_common.feature_spec import FeatureSpec

from ..data.loader import MULTIHOT_CHANNEL, ONEHOT_CHANNEL, input_description

# main.py's --embedding_sizes_file default; relative paths are looked up in the current directory, then here.
DEFAULT_EMBEDDING_SIZES = "data/outbrain/embedding_sizes.json"
PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """What the model needs to know about its inputs (from the feature spec) and its shape (from the flags)."""
    onehot: Dict[str, int]            # name -> cardinality
    multihot: Dict[str, int]          # name -> cardinality
    max_hotness: Dict[str, int]       # multihot name -> max_hotness
    numerical: List[str]
    embedding_dims: Dict[str, int]    # categorical name -> deep embedding width
    hidden_units: Sequence[int] = (1024, 1024, 1024, 1024, 1024)
    dropout: float = 0.1
    combiner: str = "sum"

    @property
    def categorical(self) -> Dict[str, int]:
        return {**self.onehot, **self.multihot}

    @property
    def width(self) -> int:
        """Floats per row that a step's activations scale with: deep embeddings, numericals and hidden layers."""
        return sum(self.embedding_dims.values()) + len(self.numerical) + sum(self.hidden_units)


def load_embedding_sizes(path: str, categorical: Sequence[str]) -> Dict[str, int]:
    """``{feature: width}`` from the JSON file ``path``; raises ValueError naming the file and a missing feature."""
    try:
        with open(path, encoding="utf-8") as f:
            sizes = json.load(f)
    except FileNotFoundError:
        raise FileNotFoundError(f"--embedding_sizes_file {path}: no such file") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"--embedding_sizes_file {path}: not JSON ({e})") from None
    missing = [name for name in categorical if name not in sizes]
    if missing:
        raise ValueError(f"--embedding_sizes_file {path}: no embedding size for feature(s) {', '.join(missing)}")
    bad = [name for name in categorical if not isinstance(sizes[name], int) or sizes[name] < 1]
    if bad:
        raise ValueError(f"--embedding_sizes_file {path}: embedding size of {bad[0]} must be a positive integer, "
                         f"got {sizes[bad[0]]!r}")
    return {name: int(sizes[name]) for name in categorical}


def resolve_embedding_sizes_path(path: str) -> str:
    """A relative path is looked up in the current directory, then under the ``wide_deep`` package."""
    if os.path.isabs(path) or os.path.exists(path):
        return path
    candidate = os.path.join(PACKAGE_DIR, path)
    return candidate if os.path.exists(candidate) else path


def wide_deep_config(spec: FeatureSpec, embedding_sizes_file: str, hidden_units: Sequence[int], dropout: float,
                     combiner: str) -> ModelConfig:
    """``main.py``'s model for the feature spec: its one-hot, multi-hot and numerical features, the widths of
    ``embedding_sizes_file`` (see :func:`resolve_embedding_sizes_path`), the flags' shape."""
    d = input_description(spec)
    categorical = list(d["onehot"]) + list(d["multihot"])
    dims = load_embedding_sizes(resolve_embedding_sizes_path(embedding_sizes_file), categorical)
    return ModelConfig(onehot=d["onehot"], multihot=d["multihot"], max_hotness=d["max_hotness"],
                       numerical=d["numerical"], embedding_dims=dims, hidden_units=tuple(hidden_units),
                       dropout=dropout, combiner=combiner)


def movielens_config(spec: FeatureSpec, embedding_dim: int, hidden_units: Sequence[int], combiner: str) -> ModelConfig:
    """The HugeCTR notebook's MovieLens network as a ``ModelConfig``: every categorical of the spec embedded
    ``embedding_dim`` wide, no numericals, no dropout."""
    onehot = {n: spec.cardinality(n) for n in spec.channel_spec[ONEHOT_CHANNEL]}
    multihot = {n: spec.cardinality(n) for n in spec.channel_spec.get(MULTIHOT_CHANNEL, [])}
    return ModelConfig(onehot=onehot, multihot=multihot, max_hotness={n: spec.max_hotness(n) for n in multihot},
                       numerical=[], embedding_dims={n: embedding_dim for n in {**onehot, **multihot}},
                       hidden_units=tuple(hidden_units), dropout=0.0, combiner=combiner)
