"""FeatureSpec: the YAML description of a dataset shared by every recipe.

The schema is NVIDIA DeepLearningExamples' "Dataset Feature Specification", so a ``feature_spec.yaml`` written for
their recipes loads unchanged:

    feature_spec:            # name -> metadata
      cat_0.bin: {dtype: int32, cardinality: 7912889}
      num_0:     {dtype: float16}
      label:     {dtype: bool}
    source_spec:             # mapping (train/test/...) -> list of chunks; file order is row order
      train:
        - {type: split_binary, features: [num_0], files: [train/numerical.bin]}
    channel_spec:            # model channel -> feature names, in the order the model sees them
      categorical: [cat_0.bin]
      numerical: [num_0]
      label: [label]
    metadata: {}             # free-form

This module is the only FeatureSpec implementation in the project (NVIDIA's four copies drifted apart). It loads with
``yaml.safe_load``, resolves every file path relative to the YAML's directory and refuses paths that leave it, and
validates with errors that name the offending key.

It accepts what NVIDIA's loader accepts, including their hand-written bring-your-own specs:

- a feature without ``dtype`` (``label:`` with nothing under it, ``num_0: {}``). Its dtype defaults to ``int64`` for a
  categorical feature and ``float32`` otherwise (what NVIDIA's transcoders write), which is how CSV chunks are read
  and parquet chunks are written; a parquet chunk is read in the file's own column types. A ``split_binary`` chunk
  needs an explicit dtype for each of its features, because the file's layout depends on it (NVIDIA's DLRM refuses
  it too); that error names the feature.
- ``cardinality: auto``: the tools that see the data compute it (``recsys_common.transcode``, ``synthetic``,
  DLRM's ``gen_csv``; ``from_yaml(..., allow_auto=True)``); a reader that needs the number refuses it with an
  error naming the feature and saying to run the transcoder.
- YAML anchors and aliases (NVIDIA's own specs share the numerical feature list with ``&id001`` / ``*id001``):
  every list and mapping is copied on load, so changing one part of a spec never changes another.

    >>> spec = FeatureSpec.get_default_feature_spec(2, [10, 300])
    >>> spec.channel_spec["categorical"], spec.feature_spec["cat_1.bin"]["dtype"]
    (['cat_0.bin', 'cat_1.bin'], 'int16')
"""
from __future__ import annotations

import copy
import os
from typing import Any, Dict, Iterable, List, Optional

import numpy as np
import yaml

from recsys_common.cli import InputError
from .io import atomic_write_text

# Chunk types this library reads and writes itself, and those read by a recipe's own loader.
NATIVE_CHUNK_TYPES = ("csv", "parquet", "split_binary")
RECIPE_CHUNK_TYPES = ("torch_tensor", "tfrecord", "split_tfrecords")
KNOWN_CHUNK_TYPES = NATIVE_CHUNK_TYPES + RECIPE_CHUNK_TYPES

# Channel names whose features are categorical ids (DLRM, W&D, NCF and the seeds' examples).
_CATEGORICAL_CHANNEL_NAMES = ("user_ch", "item_ch")

_DTYPE_ALIASES = {
    "bool": "bool", "int8": "int8", "int16": "int16", "int32": "int32", "int64": "int64",
    "uint8": "uint8", "uint16": "uint16", "uint32": "uint32", "uint64": "uint64",
    "float16": "float16", "half": "float16", "bfloat16": None, "float32": "float32", "float": "float32",
    "float64": "float64", "double": "float64", "long": "int64", "int": "int64", "short": "int16",
}

AUTO = "auto"

# dtype of a feature whose metadata has none (see the module docstring).
DEFAULT_CATEGORICAL_DTYPE = "int64"
DEFAULT_OTHER_DTYPE = "float32"


class FeatureSpecError(InputError):
    """A FeatureSpec that cannot be used; the message names the file and the offending key."""


def normalize_dtype(dtype: Any, where: str = "dtype") -> str:
    """Map ``torch.int32`` / ``tf.int32`` / ``np.int32`` / ``numpy.int32`` / ``int32`` to the numpy name ``int32``."""
    if not isinstance(dtype, str):
        raise FeatureSpecError(f"{where}: dtype must be a string such as 'int32' or 'torch.float16', got {dtype!r}")
    name = dtype.strip()
    for prefix in ("torch.", "tf.", "np.", "numpy."):
        if name.startswith(prefix):
            name = name[len(prefix):]
            break
    normalized = _DTYPE_ALIASES.get(name)
    if normalized is None:
        known = ", ".join(sorted(k for k, v in _DTYPE_ALIASES.items() if v))
        raise FeatureSpecError(f"{where}: unknown dtype {dtype!r} (known: {known}; prefixes torch./tf./np. allowed)")
    return normalized


def smallest_int_dtype(cardinality: int) -> str:
    """NVIDIA's rule for ``cat_<i>.bin``: the smallest of int8/int16/int32 with ``cardinality < iinfo.max``."""
    for name in ("int8", "int16", "int32"):
        if cardinality < np.iinfo(name).max:
            return name
    return "int64"


def is_categorical_channel(channel: str) -> bool:
    return "categorical" in channel or channel in _CATEGORICAL_CHANNEL_NAMES


def _unshared(value: Any) -> Any:
    """A copy in which no list or mapping appears twice: YAML aliases (``*id001``) load as one shared object, and
    ``copy.deepcopy`` keeps them shared, so editing ``channel_spec`` would silently edit ``source_spec`` too."""
    if isinstance(value, dict):
        return {k: _unshared(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_unshared(v) for v in value]
    return copy.deepcopy(value)


def _auto_message(origin: str, name: str) -> str:
    return (f"{origin}: feature_spec.{name}.cardinality is 'auto' (to be computed from the data), but this reader "
            f"needs the number: run `python -m recsys_common.transcode` on the CSV data, which writes the computed "
            f"cardinality into its output spec, or write the number (largest id + 1) into the spec")


class FeatureSpec:
    """A dataset description: features, where they are stored, how the model consumes them.

    Args:
        feature_spec: feature name -> metadata (``dtype``, defaulted when absent, see the module docstring;
            ``cardinality`` for categoricals, an int or ``"auto"`` before transcoding; ``max_hotness`` for multi-hot
            features). ``None`` metadata (``label:`` with nothing under it) is an empty mapping.
        source_spec: mapping name -> list of chunks ``{type, features, files}``.
        channel_spec: channel name -> list of feature names.
        metadata: free-form dictionary.
        base_directory: directory that file paths are relative to (the YAML's directory).
    """

    def __init__(self, feature_spec: Optional[dict] = None, source_spec: Optional[dict] = None,
                 channel_spec: Optional[dict] = None, metadata: Optional[dict] = None,
                 base_directory: Optional[str] = None, origin: str = "<feature spec>"):
        self.feature_spec: Dict[str, Dict[str, Any]] = feature_spec if feature_spec is not None else {}
        self.source_spec: Dict[str, List[Dict[str, Any]]] = source_spec if source_spec is not None else {}
        self.channel_spec: Dict[str, List[str]] = channel_spec if channel_spec is not None else {}
        self.metadata: Dict[str, Any] = metadata if metadata is not None else {}
        self.base_directory = os.path.abspath(base_directory) if base_directory else None
        self.origin = origin

    # ----------------------------------------------------------------------------------------------- (de)serialise
    @classmethod
    def from_yaml(cls, path: str, check_files: bool = False, allow_auto: bool = False) -> "FeatureSpec":
        """Load and validate ``path``; file paths resolve relative to its directory."""
        try:
            with open(path, "r", encoding="utf-8") as f:
                raw = yaml.safe_load(f)
        except FileNotFoundError:
            raise FeatureSpecError(f"{path}: feature spec file not found") from None
        except yaml.YAMLError as e:
            raise FeatureSpecError(f"{path}: not valid YAML: {e}") from None
        spec = cls.from_dict(raw, base_directory=os.path.dirname(os.path.abspath(path)), origin=path)
        spec.validate(check_files=check_files, allow_auto=allow_auto)
        return spec

    @classmethod
    def from_dict(cls, source_dict: Any, base_directory: Optional[str] = None,
                  origin: str = "<feature spec>") -> "FeatureSpec":
        if not isinstance(source_dict, dict):
            raise FeatureSpecError(f"{origin}: top level must be a mapping with keys feature_spec, source_spec, "
                                   f"channel_spec (and optionally metadata), got {type(source_dict).__name__}")
        for key in ("feature_spec", "source_spec", "channel_spec"):
            if key not in source_dict:
                raise FeatureSpecError(f"{origin}: missing required section '{key}'")
        d = _unshared(source_dict)
        features = d["feature_spec"]
        if isinstance(features, dict):
            # NVIDIA's BYO specs write a feature with no metadata as a bare key (``label:``), which YAML loads as None.
            features = {name: {} if meta is None else meta for name, meta in features.items()}
        return cls(feature_spec=features or {}, source_spec=d["source_spec"] or {},
                   channel_spec=d["channel_spec"] or {}, metadata=d.get("metadata") or {},
                   base_directory=base_directory, origin=origin)

    def to_dict(self) -> dict:
        return _unshared({"feature_spec": self.feature_spec, "source_spec": self.source_spec,
                              "channel_spec": self.channel_spec, "metadata": self.metadata})

    def to_yaml(self, path: str) -> None:
        """Write atomically. Paths in the spec are kept relative, so ``path`` should be in ``base_directory``."""
        text = yaml.safe_dump(self.to_dict(), sort_keys=True, default_flow_style=False)
        atomic_write_text(path, text)

    def copy(self) -> "FeatureSpec":
        return FeatureSpec(**{k: _unshared(v) for k, v in self._fields().items()},
                           base_directory=self.base_directory, origin=self.origin)

    def _fields(self) -> dict:
        return {"feature_spec": self.feature_spec, "source_spec": self.source_spec,
                "channel_spec": self.channel_spec, "metadata": self.metadata}

    # ----------------------------------------------------------------------------------------------- queries
    def resolve_file(self, relative_path: str) -> str:
        """Absolute path of a file named in ``source_spec``; it must stay inside ``base_directory``."""
        if self.base_directory is None:
            raise FeatureSpecError(f"{self.origin}: no base directory to resolve {relative_path!r} against")
        if not isinstance(relative_path, str) or not relative_path:
            raise FeatureSpecError(f"{self.origin}: file entry must be a non-empty string, got {relative_path!r}")
        if os.path.isabs(relative_path):
            raise FeatureSpecError(f"{self.origin}: file {relative_path!r} is absolute; paths must be relative to "
                                   f"the dataset directory {self.base_directory}")
        full = os.path.realpath(os.path.join(self.base_directory, relative_path))
        base = os.path.realpath(self.base_directory)
        if os.path.commonpath([full, base]) != base:
            raise FeatureSpecError(f"{self.origin}: file {relative_path!r} resolves to {full}, outside the dataset "
                                   f"directory {base}")
        return full

    def cardinality(self, name: str) -> int:
        card = self._feature(name).get("cardinality")
        if card == AUTO:
            raise FeatureSpecError(_auto_message(self.origin, name))
        if not isinstance(card, (int, np.integer)) or isinstance(card, bool):
            raise FeatureSpecError(f"{self.origin}: feature_spec.{name}.cardinality is {card!r}, expected an integer")
        return int(card)

    def has_dtype(self, name: str) -> bool:
        return self._feature(name).get("dtype") is not None

    def numpy_dtype(self, name: str) -> np.dtype:
        """The feature's dtype; without one, ``int64`` for a categorical feature and ``float32`` otherwise."""
        if not self.has_dtype(name):
            return np.dtype(DEFAULT_CATEGORICAL_DTYPE if self.is_categorical(name) else DEFAULT_OTHER_DTYPE)
        return np.dtype(normalize_dtype(self._feature(name).get("dtype"), f"{self.origin}: feature_spec.{name}.dtype"))

    def max_hotness(self, name: str) -> int:
        return int(self._feature(name).get("max_hotness", 1))

    def is_categorical(self, name: str) -> bool:
        return "cardinality" in self._feature(name) or any(
            name in feats for ch, feats in self.channel_spec.items() if is_categorical_channel(ch))

    def features_of_mapping(self, mapping: str) -> List[str]:
        return [f for chunk in self.source_spec[mapping] for f in chunk["features"]]

    def chunk_of_feature(self, mapping: str, name: str) -> Dict[str, Any]:
        for chunk in self.source_spec[mapping]:
            if name in chunk["features"]:
                return chunk
        raise FeatureSpecError(f"{self.origin}: feature {name!r} is not stored in mapping {mapping!r}")

    def _feature(self, name: str) -> Dict[str, Any]:
        if name not in self.feature_spec:
            raise FeatureSpecError(f"{self.origin}: unknown feature {name!r}")
        return self.feature_spec[name] or {}

    # ----------------------------------------------------------------------------------------------- validation
    def validate(self, check_files: bool = False, allow_auto: bool = False,
                 mappings: Optional[Iterable[str]] = None) -> "FeatureSpec":
        """Check the spec; raise FeatureSpecError naming the key at fault. Returns self for chaining."""
        o = self.origin
        if not isinstance(self.feature_spec, dict) or not self.feature_spec:
            raise FeatureSpecError(f"{o}: feature_spec must be a non-empty mapping of feature name -> metadata")
        if not isinstance(self.metadata, dict):
            raise FeatureSpecError(f"{o}: metadata must be a mapping, got {type(self.metadata).__name__}")
        for name, meta in self.feature_spec.items():
            if meta is None:
                meta = self.feature_spec[name] = {}
            if not isinstance(meta, dict):
                raise FeatureSpecError(f"{o}: feature_spec.{name} must be a mapping, got {meta!r}")
            if meta.get("dtype") is not None:   # absent: defaulted by numpy_dtype (NVIDIA's BYO specs omit it)
                normalize_dtype(meta["dtype"], f"{o}: feature_spec.{name}.dtype")
            if "cardinality" in meta:
                self._check_cardinality(name, meta["cardinality"], allow_auto)
            if "max_hotness" in meta:
                hot = meta["max_hotness"]
                if not isinstance(hot, int) or isinstance(hot, bool) or hot < 1:
                    raise FeatureSpecError(f"{o}: feature_spec.{name}.max_hotness must be a positive integer, got {hot!r}")

        if not isinstance(self.channel_spec, dict):
            raise FeatureSpecError(f"{o}: channel_spec must be a mapping of channel -> feature list")
        for channel, names in self.channel_spec.items():
            if names is None:
                names = self.channel_spec[channel] = []
            if not isinstance(names, list):
                raise FeatureSpecError(f"{o}: channel_spec.{channel} must be a list of feature names, got {names!r}")
            for name in names:
                if name not in self.feature_spec:
                    raise FeatureSpecError(f"{o}: channel_spec.{channel} names feature {name!r}, "
                                           f"which is not in feature_spec")
                if is_categorical_channel(channel) and "cardinality" not in self.feature_spec[name]:
                    raise FeatureSpecError(f"{o}: feature_spec.{name}: categorical feature (channel {channel}) "
                                           f"has no cardinality")

        if not isinstance(self.source_spec, dict):
            raise FeatureSpecError(f"{o}: source_spec must be a mapping of mapping name -> list of chunks")
        selected = list(self.source_spec) if mappings is None else list(mappings)
        for mapping in selected:
            if mapping not in self.source_spec:
                raise FeatureSpecError(f"{o}: source_spec has no mapping {mapping!r} "
                                       f"(has: {', '.join(self.source_spec) or 'none'})")
            self._validate_mapping(mapping, check_files)
        return self

    def _check_cardinality(self, name: str, card: Any, allow_auto: bool) -> None:
        if card == AUTO:
            if not allow_auto:
                raise FeatureSpecError(_auto_message(self.origin, name))
            return
        if not isinstance(card, (int, np.integer)) or isinstance(card, bool) or card < 1:
            raise FeatureSpecError(f"{self.origin}: feature_spec.{name}.cardinality must be a positive integer"
                                   f"{' or auto' if allow_auto else ''}, got {card!r}")

    def _validate_mapping(self, mapping: str, check_files: bool) -> None:
        o = self.origin
        chunks = self.source_spec[mapping]
        if not isinstance(chunks, list) or not chunks:
            raise FeatureSpecError(f"{o}: source_spec.{mapping} must be a non-empty list of chunks")
        seen = {}
        for i, chunk in enumerate(chunks):
            where = f"{o}: source_spec.{mapping}[{i}]"
            if not isinstance(chunk, dict):
                raise FeatureSpecError(f"{where} must be a mapping with type, features, files")
            for key in ("type", "features", "files"):
                if key not in chunk:
                    raise FeatureSpecError(f"{where}.{key} is missing")
            if chunk["type"] not in KNOWN_CHUNK_TYPES:
                raise FeatureSpecError(f"{where}.type: unknown chunk type {chunk['type']!r} "
                                       f"(known: {', '.join(KNOWN_CHUNK_TYPES)})")
            if not isinstance(chunk["features"], list) or not chunk["features"]:
                raise FeatureSpecError(f"{where}.features must be a non-empty list")
            if not isinstance(chunk["files"], list) or not chunk["files"]:
                raise FeatureSpecError(f"{where}.files must be a non-empty list")
            for name in chunk["features"]:
                if name not in self.feature_spec:
                    raise FeatureSpecError(f"{where}.features lists {name!r}, which is not in feature_spec")
                if name in seen:
                    raise FeatureSpecError(f"{where}.features lists {name!r}, already stored in chunk {seen[name]}")
                seen[name] = i
            if chunk["type"] == "split_binary" and len(chunk["files"]) != 1:
                raise FeatureSpecError(f"{where}.files: a split_binary chunk has exactly one file, "
                                       f"got {len(chunk['files'])}")
            if chunk["type"] == "split_binary":
                for name in chunk["features"]:
                    if not self.has_dtype(name):
                        raise FeatureSpecError(
                            f"{o}: feature_spec.{name}.dtype is missing; feature {name!r} is stored in split_binary "
                            f"chunk source_spec.{mapping}[{i}], whose byte layout depends on the dtype: add it "
                            f"(e.g. dtype: int32), or transcode CSV data, which writes it")
            for rel in chunk["files"]:
                full = self.resolve_file(rel)
                if check_files and not os.path.isfile(full):
                    raise FeatureSpecError(f"{where}.files: file {rel!r} not found (looked for {full})")

    # ----------------------------------------------------------------------------------------------- defaults
    @staticmethod
    def get_default_feature_spec(number_of_numerical_features: int,
                                 categorical_feature_cardinalities: List[int],
                                 mappings: Iterable[str] = ("train", "test"),
                                 base_directory: Optional[str] = None) -> "FeatureSpec":
        """NVIDIA's Criteo split-binary layout (reference B.2).

        Features ``cat_<i>.bin`` (the names really end in ``.bin``, as NVIDIA's), ``num_<i>``, ``label``; one chunk per
        categorical file, all numericals in one ``numerical.bin`` chunk, ``label.bin``; files under ``<mapping>/``.
        """
        numerical = [f"num_{i}" for i in range(number_of_numerical_features)]
        categorical = [f"cat_{i}.bin" for i in range(len(categorical_feature_cardinalities))]
        feature_spec: Dict[str, Dict[str, Any]] = {"label": {"dtype": "bool"}}
        for name in numerical:
            feature_spec[name] = {"dtype": "float16"}
        for name, card in zip(categorical, categorical_feature_cardinalities):
            feature_spec[name] = {"dtype": smallest_int_dtype(int(card)), "cardinality": int(card)}
        source_spec = {}
        for mapping in mappings:
            chunks = []
            if numerical:
                chunks.append({"type": "split_binary", "features": list(numerical),
                               "files": [f"{mapping}/numerical.bin"]})
            chunks.append({"type": "split_binary", "features": ["label"], "files": [f"{mapping}/label.bin"]})
            for name in categorical:
                chunks.append({"type": "split_binary", "features": [name], "files": [f"{mapping}/{name}"]})
            source_spec[mapping] = chunks
        channel_spec = {"categorical": categorical, "numerical": numerical, "label": ["label"]}
        return FeatureSpec(feature_spec, source_spec, channel_spec, {}, base_directory=base_directory)

    def __repr__(self) -> str:
        return (f"FeatureSpec({len(self.feature_spec)} features, mappings={list(self.source_spec)}, "
                f"channels={ {k: len(v) for k, v in self.channel_spec.items()} }, base={self.base_directory})")


NEGATIVE_DOWNSAMPLING_KEY = "negative_downsampling_rate"


def negative_downsampling_rate(spec: FeatureSpec) -> float:
    """The rate ``w`` at which the train mapping's negatives were kept (``metadata.negative_downsampling_rate``,
    written by ``recsys_common.prepare_clicks --negative_downsampling_rate``); 1.0 when the key is absent (nothing
    dropped). Evaluation adds ``log(w)`` to the logits (``recsys_common.metrics.correct_downsampled_logits``) so the
    predicted CTR is that of the full data. A value that is not a number in (0, 1] is a FeatureSpecError (a
    ValueError) naming the spec file.

        >>> negative_downsampling_rate(FeatureSpec.get_default_feature_spec(1, [10]))
        1.0
    """
    value = (spec.metadata or {}).get(NEGATIVE_DOWNSAMPLING_KEY)
    if value is None:
        return 1.0
    where = spec.origin or "feature spec"
    try:
        rate = float(value)
    except (TypeError, ValueError):
        rate = float("nan")
    if isinstance(value, bool) or not 0.0 < rate <= 1.0:
        raise FeatureSpecError(f"{where}: metadata.{NEGATIVE_DOWNSAMPLING_KEY} must be a number in (0, 1] (the "
                               f"probability a train negative was kept), got {value!r}")
    return rate
