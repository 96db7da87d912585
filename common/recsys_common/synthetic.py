"""Seeded synthetic datasets from a FeatureSpec (the role of NVIDIA's ``gen_csv.py``), learnable on purpose.

Values:
    categorical   power law over ``[0, cardinality)``: ``P(id = k) ~ (k + 1) ** -alpha`` (ids ordered by frequency,
                  as Criteo preprocessing orders them); multi-hot features draw 1..max_hotness such ids, padded -1.
    numerical     standard normal, plus a per-row latent shared with the label.
    label         Bernoulli(sigmoid(logit)), with a hidden model
                  ``logit = b + sum_f w_f[id_f] + sum_j v_j x_j + u * w_0[id_0] * w_1[id_1]``
                  whose weights depend only on ``seed``, so train and test mappings share one model and a trained
                  recipe scores an AUC clearly above 0.5 on held-out synthetic rows.

    >>> from recsys_common.feature_spec import FeatureSpec
    >>> spec = FeatureSpec.get_default_feature_spec(2, [100, 7])
    >>> cols = generate_columns(spec, 1000, seed=1)
    >>> sorted(cols), cols["cat_0.bin"].max() < 100, cols["label"].dtype
    (['cat_0.bin', 'cat_1.bin', 'label', 'num_0', 'num_1'], True, dtype('bool'))

Command line: ``python -m recsys_common.synthetic --help``. ``--mlperf_dcnv2`` writes MLPerf DLRM-DCNv2-shaped data:
Criteo 1TB's 26 cardinalities capped at 40M (:data:`MLPERF_CARDINALITIES`, capped further by ``--max_table_size`` to
fit a disk) with MLPerf's per-table hotness (:data:`MLPERF_HOTNESS`, every row holding all its ids, as MLPerf's
materialized multi-hot dataset does), in NVIDIA's split-binary layout, block by block (memory: one block).
"""
from __future__ import annotations

import argparse
import os
import time
import zlib
from typing import Dict, Iterable, List, Optional

import numpy as np

from .datasets import PAD, DatasetWriter
from .feature_spec import FeatureSpec, FeatureSpecError
from .io import atomic_directory
from .datasets import read_columns

_WEIGHT_TABLE = 4096  # hidden per-id weights are looked up modulo this, so huge tables cost nothing
# MLPerf Training DLRM-DCNv2 (mlcommons/training recommendation_v2/torchrec_dlrm README): --num_embeddings_per_feature
# (Criteo 1TB's cardinalities, capped at 40M) and --multi_hot_sizes, in Criteo's categorical order.
MLPERF_CARDINALITIES = (40000000, 39060, 17295, 7424, 20265, 3, 7122, 1543, 63, 40000000, 3067956, 405282, 10, 2209,
                        11938, 155, 4, 976, 14, 40000000, 40000000, 40000000, 590152, 12973, 108, 36)
MLPERF_HOTNESS = (3, 2, 1, 2, 6, 1, 1, 1, 1, 7, 3, 8, 1, 6, 9, 5, 1, 1, 1, 12, 100, 27, 10, 3, 1, 1)


def _label_features(spec: FeatureSpec) -> List[str]:
    return [f for ch, names in spec.channel_spec.items() if "label" in ch.lower() for f in names]


def power_law_ids(rng: np.random.Generator, cardinality: int, size, alpha: float = 1.05) -> np.ndarray:
    """Ids in ``[0, cardinality)`` with ``P(k) ~ (k+1)^-alpha`` (continuous inverse CDF, O(size) for any cardinality)."""
    u = rng.random(size)
    n = float(cardinality)
    if abs(alpha - 1.0) < 1e-9:
        x = np.exp(u * np.log(n + 1.0))
    else:
        a = 1.0 - alpha
        x = (u * ((n + 1.0) ** a - 1.0) + 1.0) ** (1.0 / a)
    return np.clip(np.floor(x).astype(np.int64) - 1, 0, cardinality - 1)


class HiddenModel:
    """The logistic model that labels synthetic rows; its weights depend only on the seed and the feature names."""

    def __init__(self, spec: FeatureSpec, seed: int, strength: float = 1.0):
        self.spec = spec
        labels = set(_label_features(spec))
        self.categorical = [f for f in spec.feature_spec if f not in labels and "cardinality" in spec.feature_spec[f]]
        self.numerical = [f for f in spec.feature_spec if f not in labels and f not in self.categorical]
        self.weights = {}
        for f in self.categorical + self.numerical:
            rng = np.random.default_rng([seed, zlib.crc32(f.encode())])
            self.weights[f] = rng.normal(0.0, 1.0, _WEIGHT_TABLE if f in self.categorical else 1)
        n_terms = max(1, len(self.categorical) + len(self.numerical))
        # Each term's scale keeps the total logit variance near strength**2 * 2, whatever the feature count.
        self.scale = strength * 1.4 / np.sqrt(n_terms)
        self.bias = -1.0

    def logit(self, columns: Dict[str, np.ndarray]) -> np.ndarray:
        n = len(next(iter(columns.values())))
        z = np.full(n, self.bias)
        first_two = []
        for f in self.categorical:
            ids = np.asarray(columns[f]).astype(np.int64)  # int8 ids % 4096 overflows under NumPy 2
            if ids.ndim == 2:  # multi-hot: mean of the present ids' weights
                present = ids != PAD
                w = np.where(present, self.weights[f][np.where(present, ids, 0) % _WEIGHT_TABLE], 0.0)
                term = w.sum(1) / np.maximum(present.sum(1), 1)
            else:
                term = self.weights[f][ids % _WEIGHT_TABLE]
            z += self.scale * 2.0 * term
            first_two.append(term)
        for f in self.numerical:
            z += self.scale * self.weights[f][0] * np.asarray(columns[f], np.float64).reshape(n, -1).mean(1)
        if len(first_two) >= 2:  # one pairwise interaction, the kind dot-interaction models capture
            z += 0.5 * first_two[0] * first_two[1]
        return z


def generate_columns(spec: FeatureSpec, num_rows: int, seed: int = 12345, mapping: Optional[str] = None,
                     stream: int = 0, alpha: float = 1.05, fixed_hotness: bool = False) -> Dict[str, np.ndarray]:
    """One block of rows for every feature (or the features of ``mapping``), labels from the hidden model.

    ``seed`` fixes the hidden model; ``stream`` selects an independent block of rows under that model (use different
    streams for train/test and for consecutive blocks). ``fixed_hotness``: every row of a multi-hot feature holds
    ``max_hotness`` ids (MLPerf's static hotness) instead of 1..max_hotness.
    """
    rng = np.random.default_rng([seed, stream, 7])
    labels = _label_features(spec)
    wanted = spec.features_of_mapping(mapping) if mapping else list(spec.feature_spec)
    columns: Dict[str, np.ndarray] = {}
    for f in spec.feature_spec:
        meta = spec.feature_spec[f]
        if f in labels:
            continue
        dtype = spec.numpy_dtype(f)
        if "cardinality" in meta:
            card = meta["cardinality"]
            if card == "auto":
                raise FeatureSpecError(f"{spec.origin}: feature_spec.{f}.cardinality is 'auto'; synthetic data needs "
                                       f"a number")
            hot = spec.max_hotness(f)
            if hot > 1:
                values = power_law_ids(rng, int(card), (num_rows, hot), alpha)
                if not fixed_hotness:
                    counts = rng.integers(1, hot + 1, num_rows)
                    values[np.arange(hot)[None, :] >= counts[:, None]] = PAD
                columns[f] = values
            else:
                columns[f] = power_law_ids(rng, int(card), num_rows, alpha).astype(dtype)
        elif np.issubdtype(dtype, np.integer):
            high = min(100, int(np.iinfo(dtype).max))
            columns[f] = rng.integers(0, high, num_rows).astype(dtype)
        elif dtype == np.bool_:
            columns[f] = rng.random(num_rows) < 0.5
        else:
            columns[f] = rng.normal(0.0, 1.0, num_rows).astype(dtype)
    if labels:
        z = HiddenModel(spec, seed).logit(columns)
        p = 1.0 / (1.0 + np.exp(-z))
        clicked = rng.random(num_rows) < p
        for f in labels:
            columns[f] = clicked.astype(spec.numpy_dtype(f))
    return {f: columns[f] for f in wanted if f in columns}


def generate_dataset(spec: FeatureSpec, output_dir: str, num_rows: Dict[str, int], seed: int = 12345,
                     block_rows: int = 1 << 20, spec_filename: str = "feature_spec.yaml", overwrite: bool = False,
                     saved_spec: Optional[FeatureSpec] = None,
                     tool: str = "recsys_common.synthetic", fixed_hotness: bool = False) -> FeatureSpec:
    """Write every mapping in ``num_rows`` under ``output_dir`` in the spec's own chunk types; returns the new spec.

    Written through ``recsys_common.io.atomic_directory``: a non-empty ``output_dir`` is refused unless ``overwrite``,
    which replaces only this tool's earlier outputs there (other files are kept); the spec file is the marker, moved
    in last, so a directory with a ``feature_spec.yaml`` is always complete, also after a crash part-way through an
    overwrite. ``saved_spec``: the spec to save instead of ``spec`` (e.g. one keeping ``cardinality: auto``).
    """
    for mapping in num_rows:
        if mapping not in spec.source_spec:
            raise FeatureSpecError(f"{spec.origin}: source_spec has no mapping {mapping!r}")
    out = spec.copy()
    with atomic_directory(output_dir, overwrite=overwrite, tool=tool, marker=os.path.normpath(spec_filename)) as tmp:
        out.base_directory = tmp
        for m_index, (mapping, rows) in enumerate(num_rows.items()):
            with DatasetWriter(out, mapping) as writer:
                for b_index, start in enumerate(range(0, rows, block_rows)):
                    n = min(block_rows, rows - start)
                    writer.write(generate_columns(out, n, seed, mapping, stream=1000 * (m_index + 1) + b_index,
                                                  fixed_hotness=fixed_hotness))
        (saved_spec or out).to_yaml(os.path.join(tmp, spec_filename))
    out.base_directory = os.path.abspath(output_dir)
    out.origin = os.path.join(out.base_directory, spec_filename)
    return out


def _parse_sizes(text: str) -> List[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m recsys_common.synthetic",
        description="Generate a seeded synthetic dataset from a FeatureSpec (or from a Criteo-shaped default spec) "
                    "in the spec's own formats, with labels from a hidden logistic model, and print its summary.")
    p.add_argument("--feature_spec", default=None,
                   help="input FeatureSpec YAML; its source_spec decides formats and file names. Default: NVIDIA's "
                        "Criteo split-binary layout built from --num_numerical_features and --table_sizes")
    p.add_argument("--output", required=True, help="output dataset directory (feature_spec.yaml is written there)")
    p.add_argument("--size", type=int, default=100000, help="rows of the train mapping (default 100000)")
    p.add_argument("--test_size", type=int, default=None,
                   help="rows of every other mapping (default: size // 10, at least 1)")
    p.add_argument("--num_numerical_features", type=int, default=13,
                   help="numerical features of the default spec (default 13)")
    p.add_argument("--table_sizes", type=_parse_sizes, default=[100000] * 26,
                   help="comma-separated cardinalities of the default spec's categoricals (default 26 x 100000)")
    p.add_argument("--hotness", type=_parse_sizes, default=None,
                   help="comma-separated ids per row of each categorical of the default spec (default all 1)")
    p.add_argument("--fixed_hotness", action="store_true",
                   help="every row of a multi-hot feature holds all its ids (default: 1..hotness ids, -1 padded)")
    p.add_argument("--mlperf_dcnv2", action="store_true",
                   help="MLPerf DLRM-DCNv2's shape: its 26 cardinalities (capped by --max_table_size when given), "
                        "its per-table hotness, fixed; replaces --table_sizes, --hotness, --fixed_hotness")
    p.add_argument("--max_table_size", type=int, default=None,
                   help="cap every cardinality at this (e.g. to fit MLPerf's tables on a disk)")
    p.add_argument("--seed", type=int, default=12345, help="seed of the hidden model and of the rows (default 12345)")
    p.add_argument("--block_rows", type=int, default=1 << 20, help="rows generated and written per block")
    p.add_argument("--overwrite", action="store_true",
                   help="write into a non-empty --output, replacing this tool's own earlier outputs there (other "
                        "files are kept; a name taken by another file is refused)")
    return p


def summarize(spec: FeatureSpec) -> str:
    lines = [f"dataset {spec.base_directory}"]
    for mapping in spec.source_spec:
        label = _label_features(spec)
        cols = read_columns(spec, mapping, features=label or None, check_values=False)
        n = len(next(iter(cols.values()))) if cols else 0
        size = sum(os.path.getsize(spec.resolve_file(f)) for c in spec.source_spec[mapping] for f in c["files"])
        pos = f", positive rate {np.mean(cols[label[0]]):.4f}" if label and n else ""
        lines.append(f"  {mapping}: {n} rows, {size / 2**20:.1f} MiB{pos}")
    for ch, names in spec.channel_spec.items():
        cards = [spec.feature_spec[f].get("cardinality") for f in names]
        extra = f" cardinalities {cards}" if any(c is not None for c in cards) else ""
        lines.append(f"  channel {ch}: {len(names)} features{extra}")
    return "\n".join(lines)


def default_spec(table_sizes: List[int], hotness: Optional[List[int]], num_numerical: int,
                 max_table_size: Optional[int] = None) -> FeatureSpec:
    """NVIDIA's Criteo split-binary spec with ``hotness`` ids per row of each table (``max_hotness`` where > 1)."""
    if max_table_size is not None:
        if max_table_size < 1:
            raise ValueError(f"--max_table_size must be positive, got {max_table_size}")
        table_sizes = [min(int(n), max_table_size) for n in table_sizes]
    spec = FeatureSpec.get_default_feature_spec(num_numerical, table_sizes)
    if hotness is not None:
        if len(hotness) != len(table_sizes) or min(hotness) < 1:
            raise ValueError(f"--hotness needs {len(table_sizes)} positive values (one per table), got {hotness}")
        for name, hot in zip(spec.channel_spec["categorical"], hotness):
            if hot > 1:
                spec.feature_spec[name]["max_hotness"] = int(hot)
    return spec


def main(argv: Optional[Iterable[str]] = None) -> FeatureSpec:
    args = build_parser().parse_args(None if argv is None else list(argv))
    if args.mlperf_dcnv2:
        args.table_sizes, args.hotness, args.fixed_hotness = list(MLPERF_CARDINALITIES), list(MLPERF_HOTNESS), True
    if args.feature_spec:
        spec = FeatureSpec.from_yaml(args.feature_spec)
    else:
        spec = default_spec(args.table_sizes, args.hotness, args.num_numerical_features, args.max_table_size)
    other = args.test_size if args.test_size is not None else max(1, args.size // 10)
    sizes = {m: (args.size if i == 0 or m == "train" else other) for i, m in enumerate(spec.source_spec)}
    if "train" in sizes:
        sizes = {m: (args.size if m == "train" else other) for m in spec.source_spec}
    start = time.perf_counter()
    out = generate_dataset(spec, args.output, sizes, seed=args.seed, block_rows=args.block_rows,
                           overwrite=args.overwrite, fixed_hotness=args.fixed_hotness)
    elapsed = time.perf_counter() - start
    total = sum(sizes.values())
    print(summarize(out))
    print(f"generated {total} rows in {elapsed:.2f} s ({total / max(elapsed, 1e-9):,.0f} rows/s)")
    return out


if __name__ == "__main__":
    from recsys_common.cli import run_main
    run_main(main, input_errors=(FeatureSpecError, ValueError, FileExistsError))
