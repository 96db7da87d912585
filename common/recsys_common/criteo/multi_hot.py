"""MLPerf DLRM-DCNv2's multi-hot Criteo, made from a one-hot split-binary dataset in bounded memory.

MLPerf Training (mlcommons/training ``recommendation_v2/torchrec_dlrm``, ``materialize_synthetic_multihot_dataset.py``
and ``Multihot`` with ``--multi_hot_distribution_type``) turns each one-hot id into a fixed bag of ids. For table
``t`` with ``n_t`` rows and hotness ``h_t`` it builds a lookup table ``L_t`` ``[n_t, h_t]``:

    L_t[:, 0]   = 0 .. n_t - 1                                   (the id itself)
    L_t[:, 1:]  = randint(0, n_t, (n_t, h_t - 1))                ("uniform", MLPerf's choice)
                  or int32(pareto(0.25, (n_t, h_t - 1))) % n_t   ("pareto")

drawn from NumPy's legacy generator seeded once with 0, table after table; a row's bag for table ``t`` is
``L_t[id mod n_t]``. This module writes exactly those bags (a test compares with the in-memory rule).

Bounded memory: ``L_t`` is drawn in chunks of rows (the legacy stream is the same drawn at once or in pieces) into
``<lookup_dir>/table_<t>.int32`` (``4 (h_t - 1)`` bytes per row: about 23 GB for MLPerf's sizes, on disk, never in
RAM), with the generator's state saved after each table, so a killed run resumes at the first table not finished.
The dataset then streams through block by block (memory: one block, plus the page cache of the memory-mapped lookup
tables that the kernel may drop at will); each mapping is written through ``DatasetWriter`` into an atomic output
whose ``feature_spec.yaml`` (written last) gives every table its ``max_hotness`` and capped cardinality.

    python -m recsys_common.criteo.multi_hot --input ONE_HOT_DATASET --output MULTI_HOT_DATASET \\
        [--multi_hot_sizes 3,2,1,...] [--num_embeddings_per_feature 40000000,39060,...] [--distribution uniform]
"""
from __future__ import annotations

import argparse
import json
import os
from typing import Dict, Iterable, List, Optional, Sequence

import numpy as np

from ..datasets import DatasetWriter, count_rows, iter_column_blocks
from ..feature_spec import FeatureSpec, FeatureSpecError, smallest_int_dtype
from ..io import atomic_directory, atomic_write_bytes
from ..logger import Progress
from ..synthetic import MLPERF_HOTNESS

TOOL = "recsys_common.criteo.multi_hot"
MLPERF_TABLE_CAP = 40_000_000   # MLPerf's --num_embeddings_per_feature caps Criteo 1TB's tables here
SEED = 0                        # MLPerf's: np.random.seed(0), "for all ranks to produce the same lookup values"
DRAW_ROWS = 1 << 20             # lookup rows drawn and written per piece


class MultiHotError(ValueError):
    """Arguments that do not fit the input dataset; the message names the flag or the table."""


# ------------------------------------------------------------------------------------------------- lookup tables
def _draw(distribution: str, rows: int, columns: int, cardinality: int) -> np.ndarray:
    if distribution == "uniform":
        return np.random.randint(0, cardinality, size=(rows, columns))
    return np.random.pareto(a=0.25, size=(rows, columns)).astype(np.int32) % cardinality


def _table_path(lookup_dir: str, t: int) -> str:
    return os.path.join(lookup_dir, f"table_{t}.int32")


def _state_path(lookup_dir: str, t: int) -> str:
    return os.path.join(lookup_dir, f"rng_after_{t}.npz")


def _save_state(path: str) -> None:
    name, keys, pos, has_gauss, gauss = np.random.get_state()
    tmp = path + ".tmp.npz"
    np.savez(tmp, keys=keys, numbers=np.array([pos, has_gauss], np.int64), gauss=np.array([gauss]))
    os.replace(tmp, path)


def _load_state(path: str) -> None:
    with np.load(path) as saved:
        pos, has_gauss = (int(v) for v in saved["numbers"])
        np.random.set_state(("MT19937", saved["keys"], pos, has_gauss, float(saved["gauss"][0])))


def _check_lookup_dir(lookup_dir: str, settings: Dict) -> None:
    """The lookup directory belongs to these sizes and this distribution (a manifest says so), or is new."""
    os.makedirs(lookup_dir, exist_ok=True)
    manifest = os.path.join(lookup_dir, "manifest.json")
    if os.path.exists(manifest):
        with open(manifest) as f:
            saved = json.load(f)
        if saved != settings:
            raise MultiHotError(f"{manifest}: lookup tables of other settings ({saved}); use another --lookup_dir")
        return
    if os.listdir(lookup_dir):
        raise MultiHotError(f"--lookup_dir {lookup_dir} is not empty and holds no manifest.json of this tool")
    atomic_write_bytes(manifest, json.dumps(settings, sort_keys=True).encode())


def build_lookup_tables(lookup_dir: str, sizes: Sequence[int], hotness: Sequence[int], distribution: str,
                        progress_out=None) -> List[Optional[np.ndarray]]:
    """MLPerf's ``L_t[:, 1:]`` of every table with ``h_t > 1`` as read-only memory maps ``[n_t, h_t - 1]`` (None for
    one-hot tables), drawing only the tables a previous run did not finish."""
    settings = {"sizes": [int(n) for n in sizes], "hotness": [int(h) for h in hotness],
                "distribution": distribution, "seed": SEED}
    _check_lookup_dir(lookup_dir, settings)
    done = [t for t in range(len(sizes)) if os.path.exists(_state_path(lookup_dir, t))]
    first = max(done) + 1 if done else 0
    if first:
        _load_state(_state_path(lookup_dir, first - 1))
    else:
        np.random.seed(SEED)
    total = sum(int(n) * (int(h) - 1) for n, h in zip(sizes[first:], hotness[first:]))
    progress = Progress(f"[{TOOL}] lookup tables", max(total, 1), unit="ids", out=progress_out)
    for t in range(first, len(sizes)):
        n, extra = int(sizes[t]), int(hotness[t]) - 1
        if extra > 0:
            tmp = _table_path(lookup_dir, t) + ".tmp"
            with open(tmp, "wb") as out:
                for start in range(0, n, DRAW_ROWS):
                    rows = min(DRAW_ROWS, n - start)
                    out.write(_draw(distribution, rows, extra, n).astype(np.int32).tobytes())
                    progress.update(rows * extra)
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, _table_path(lookup_dir, t))
        _save_state(_state_path(lookup_dir, t))   # written last: table t is complete
    progress.set(max(total, 1))
    return [np.memmap(_table_path(lookup_dir, t), np.int32, "r", shape=(int(n), int(h) - 1)) if h > 1 else None
            for t, (n, h) in enumerate(zip(sizes, hotness))]


# ------------------------------------------------------------------------------------------------- the dataset
def multi_hot_spec(spec: FeatureSpec, categorical: Sequence[str], sizes: Sequence[int],
                   hotness: Sequence[int]) -> FeatureSpec:
    """The input's spec with each table's cardinality ``n_t``, its id dtype and ``max_hotness`` ``h_t``."""
    out = spec.copy()
    for name, n, h in zip(categorical, sizes, hotness):
        meta = out.feature_spec[name]
        meta["cardinality"], meta["dtype"] = int(n), smallest_int_dtype(int(n))
        if h > 1:
            meta["max_hotness"] = int(h)
        else:
            meta.pop("max_hotness", None)
    return out


def bags(ids: np.ndarray, n: int, lookup: Optional[np.ndarray]) -> np.ndarray:
    """One table's bags of a block: ``[B]`` one-hot ids -> ``[B, h]`` (``[B]`` for a one-hot table)."""
    ids = np.asarray(ids, np.int64) % n
    if lookup is None:
        return ids
    return np.concatenate([ids[:, None], np.asarray(lookup[ids], np.int64)], axis=1)


def convert_mapping(spec: FeatureSpec, out: FeatureSpec, mapping: str, categorical: Sequence[str],
                    sizes: Sequence[int], lookups: Sequence[Optional[np.ndarray]], block_rows: int,
                    progress_out=None) -> int:
    """Stream one mapping from ``spec`` into ``out`` (already pointing at the staging directory); returns rows."""
    progress = Progress(f"[{TOOL}] {mapping}", max(count_rows(spec, mapping), 1), out=progress_out)
    rows = 0
    with DatasetWriter(out, mapping) as writer:
        for columns in iter_column_blocks(spec, mapping, block_rows):
            for t, name in enumerate(categorical):
                columns[name] = bags(columns[name], sizes[t], lookups[t])
            writer.write(columns)
            rows += len(next(iter(columns.values())))
            progress.set(rows)
    return rows


def _ints(text: str, flag: str) -> List[int]:
    try:
        return [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise MultiHotError(f"--{flag} must be comma-separated integers, got {text!r}") from None


def settle_sizes(spec: FeatureSpec, categorical: Sequence[str], sizes_text: Optional[str],
                 hotness_text: Optional[str]):
    """``(sizes, hotness)``: MLPerf's defaults (each table's cardinality capped at 40M; MLPerf's hotness) or the
    flags', checked against the dataset's tables."""
    cards = [int(spec.cardinality(name)) for name in categorical]
    sizes = _ints(sizes_text, "num_embeddings_per_feature") if sizes_text else \
        [min(c, MLPERF_TABLE_CAP) for c in cards]
    hotness = _ints(hotness_text, "multi_hot_sizes") if hotness_text else list(MLPERF_HOTNESS)
    for flag, values in (("num_embeddings_per_feature", sizes), ("multi_hot_sizes", hotness)):
        if len(values) != len(categorical):
            raise MultiHotError(f"--{flag} has {len(values)} values; {spec.origin} has {len(categorical)} "
                                f"categorical features")
        if min(values) < 1:
            raise MultiHotError(f"--{flag} values must be positive, got {values}")
    for name, card, n in zip(categorical, cards, sizes):
        if n > card:
            raise MultiHotError(f"--num_embeddings_per_feature gives table {name!r} {n} rows, more than its "
                                f"cardinality {card} in {spec.origin}")
    return sizes, hotness


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"python -m {TOOL}", description=__doc__.split("\n\n")[0])
    p.add_argument("--input", required=True, help="one-hot dataset directory (its feature_spec.yaml)")
    p.add_argument("--output", required=True, help="multi-hot dataset directory to write")
    p.add_argument("--lookup_dir", default=None,
                   help="where the lookup tables go and are reused from (default: <output>.lookup)")
    p.add_argument("--multi_hot_sizes", default=None, help="ids per row of each table (default: MLPerf's)")
    p.add_argument("--num_embeddings_per_feature", default=None,
                   help="rows of each table; ids are taken modulo them (default: cardinalities capped at 40M)")
    p.add_argument("--distribution", choices=["uniform", "pareto"], default="uniform",
                   help="MLPerf's --multi_hot_distribution_type (default uniform, MLPerf's benchmark setting)")
    p.add_argument("--block_rows", type=int, default=1 << 18, help="rows read and written per block")
    p.add_argument("--overwrite", action="store_true", help="replace this tool's earlier output in --output")
    return p


def main(argv: Optional[Iterable[str]] = None) -> FeatureSpec:
    args = build_parser().parse_args(None if argv is None else list(argv))
    spec = FeatureSpec.from_yaml(os.path.join(args.input, "feature_spec.yaml"))
    categorical = list(spec.channel_spec.get("categorical", []))
    if not categorical:
        raise FeatureSpecError(f"{spec.origin}: no 'categorical' channel to make multi-hot")
    for name in categorical:
        if spec.max_hotness(name) > 1:
            raise MultiHotError(f"{spec.origin}: feature {name!r} is already multi-hot; the input must be one-hot")
    sizes, hotness = settle_sizes(spec, categorical, args.num_embeddings_per_feature, args.multi_hot_sizes)
    lookups = build_lookup_tables(args.lookup_dir or os.path.abspath(args.output) + ".lookup", sizes, hotness,
                                  args.distribution)
    out = multi_hot_spec(spec, categorical, sizes, hotness)
    with atomic_directory(args.output, overwrite=args.overwrite, tool=TOOL, marker="feature_spec.yaml") as tmp:
        out.base_directory = tmp
        for mapping in spec.source_spec:
            rows = convert_mapping(spec, out, mapping, categorical, sizes, lookups, args.block_rows)
            print(f"[{TOOL}] {mapping}: {rows} rows", flush=True)
        out.to_yaml(os.path.join(tmp, "feature_spec.yaml"))
    out.base_directory = os.path.abspath(args.output)
    return out


if __name__ == "__main__":
    from recsys_common.cli import run_main
    run_main(main, input_errors=(FeatureSpecError, MultiHotError, FileExistsError))
