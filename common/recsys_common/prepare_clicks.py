"""A user's raw click log (CSV / TSV / parquet with a header) -> a dataset every DLRM recipe trains on.

    python -m recsys_common.prepare_clicks --input train.csv --output /data/clicks --label click \\
        --categorical C1 banner_pos site_id app_id device_model C14 C17 C19 C20 C21 --numerical C15 C16 \\
        --frequency_limit 3 --split random --split_fractions 0.8 0.1 0.1 --seed 0

    python -m recsys_common.prepare_clicks apply --dataset /data/clicks --input new.csv --output /data/new_rows

The same semantics as the Criteo preprocessing (``recsys_common.criteo``), for any columns:

- **categorical** (any column, read as text): per feature, values seen at least ``--frequency_limit`` times get
  ids ``2, 3, ...`` by decreasing count (ties by value); id 0 = missing (empty field), id 1 = rare (seen fewer times)
  or unseen (a value of a new row that is not in the dictionary). Counted over the train split
  (``--dictionary_source train``, the default: a validation or test value never seen in training is "unseen", as it
  will be in production) or over every row (``all``, NVIDIA's Criteo setting). The dictionaries are saved
  (``dictionaries/<i>.parquet``: value, count, id) so new rows map the same way (``apply``, ``ClickEncoder``).
- **numerical**: ``--numerical_transform log`` (Criteo's ``log(x + 3)``; missing or ``x <= -3`` -> 0; float16 as
  NVIDIA's ``numerical.bin``), ``standardize`` (``(x - mean) / std`` with the train split's mean and std; missing -> 0;
  float32) or ``none`` (missing -> 0; float32).
- **label**: 0/1 (also ``true``/``false``); anything else is an error naming the file, line and value.
- **split**: ``random`` (each row goes to train / validation / test by a hash of its row number and ``--seed``: the
  same rows whatever ``--block_rows``), or ``time`` (``--time_column``: the earliest ``--split_fractions[0]`` of
  the rows by that column's value are train, then validation, then test; rows of one timestamp stay together;
  values are compared as numbers when they all are, else as text, so ISO dates and Avazu's ``YYMMDDHH`` both sort).
  Train rows are shuffled within each block of ``--block_rows`` rows (``--no_shuffle_train`` keeps file order).
- **negative down-sampling** (``--negative_downsampling_rate W``, default 1 = keep every row): in the train split
  only, each negative row is kept with probability ``W`` (by a hash of its row number and ``--seed``, salted apart
  from the split's: the same rows whatever ``--block_rows``); positives are always kept, and validation and test
  are untouched, so they measure the real distribution. The dictionaries and ``standardize`` statistics are still
  counted over the whole train split. ``W`` is recorded in ``feature_spec.yaml``'s ``metadata``
  (``negative_downsampling_rate``, read by ``feature_spec.negative_downsampling_rate``) and in
  ``prepare_clicks.json`` with the train rows before and after; a model trained on it predicts the CTR of the
  down-sampled data, and evaluation corrects its logits by ``+ log(W)``
  (``recsys_common.metrics.correct_downsampled_logits``). ``apply`` never down-samples.

Output (``--output_format split_binary``, NVIDIA's layout that both DLRM recipes read)::

    feature_spec.yaml                         features = the column names; channels categorical / numerical / label
    <split>/label.bin  numerical.bin  cat_<i>.bin      for split in train, validation (if its fraction > 0), test
    dictionaries/<i>.parquet                  the value -> id mapping of categorical feature i
    prepare_clicks.json                       the settings, statistics (mean/std), row counts: what ``apply`` reuses

``--output_format parquet``: ``<split>/data.parquet`` (one column per feature) instead of the ``.bin`` files.

Engine and memory: Polars (as the Criteo engine) on blocks of ``--block_rows`` lines read by ``BlockReader``, two
passes over the input after a numpy check of every line's field count. Pass 1 sums each block's value counts into
the running counts (``recsys_common.criteo.dictionaries.merge_counts``; also the numericals' sums for
``standardize`` and the checks of every label and number); pass 2 maps and writes each block through
``recsys_common.datasets.DatasetWriter``. Memory is the dictionaries plus one block, whatever the number of rows
(a time split adds one count per distinct timestamp). Progress (rows done of total, rows/s, time left) is printed
per block. The output appears all at once (``recsys_common.io.atomic_directory``): a
non-empty ``--output`` is refused unless ``--overwrite``, and a failure leaves nothing behind.

Bad input is refused before anything is written, with the file, line (1-based, the header is line 1) and column: a
column name that is not in the header, a numerical value that is not a number, a label that is not 0/1, an empty
input, a split left without rows.

``main(argv)`` returns a dict (the written FeatureSpec and the report); ``prepare(...)`` does the same from explicit
arguments; ``ClickEncoder.load(dataset).encode(frame)`` maps new rows to the model's inputs.
"""
from __future__ import annotations

import argparse
import contextlib
import csv
import io
import itertools
import json
import math
import os
import sys
import time
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from recsys_common.cli import InputError
from .criteo import FIRST_FREQUENT_ID, MISSING_ID
from .criteo.dictionaries import DictionaryLookup, build_dictionary, merge_counts
from .datasets import DatasetWriter
from .feature_spec import FeatureSpec, smallest_int_dtype
from .io import atomic_directory, atomic_write_text, check_output_directory
from .logger import Progress

TOOL = "recsys_common.prepare_clicks"
REPORT_NAME = "prepare_clicks.json"
SPLITS = ("train", "validation", "test")
TRANSFORMS = ("log", "standardize", "none")
FORMATS = ("split_binary", "parquet")
DEFAULT_FREQUENCY_LIMIT = 3
LABEL_FEATURE = "label"

_ROW = "__row"          # global 0-based data-row number (across --input files, in order)
_SPLIT = "__split"      # 0 train, 1 validation, 2 test
_MASK32 = 0xFFFFFFFF
# Mixed into --seed for the down-sampling hash, so that which train negatives are kept does not depend on where in
# the train fraction a row's split hash fell (the split uses random_unit(row, seed) itself).
_DOWNSAMPLING_SALT = 0x6E656773          # "negs"


class ClickLogError(InputError):
    """Input that cannot be prepared as asked; the message names the file, line and column."""


# ------------------------------------------------------------------------------------------------ reading the input
def _polars():
    try:
        import polars as pl
    except ImportError:  # pragma: no cover - polars is in ci/requirements.txt
        raise ImportError("recsys_common.prepare_clicks needs polars (pip install polars==2.1.0)") from None
    return pl


def input_format(path: str, requested: str = "auto") -> str:
    if requested != "auto":
        return requested
    lower = path.lower()
    if lower.endswith((".parquet", ".pq")):
        return "parquet"
    if lower.endswith((".tsv", ".tsv.gz", ".txt")):
        return "tsv"
    return "csv"


def check_scalar_columns(path: str, schema: Any, columns: Sequence[str]) -> None:
    """Each of ``columns`` of a parquet ``schema`` holds one value per row: a number, text, a boolean or a date
    (dictionary-encoded or not). A list, struct or map column has no one text form to count, so it is refused
    naming the file and the column, instead of being counted by some rendering of its contents."""
    import pyarrow as pa
    for name in columns:
        column_type = schema.field(name).type
        if pa.types.is_dictionary(column_type):
            column_type = column_type.value_type
        if isinstance(column_type, pa.ExtensionType):
            column_type = column_type.storage_type
        if pa.types.is_nested(column_type):
            raise ClickLogError(f"{path}: column {name!r} is of the nested type {column_type}; expected one number, "
                                f"text or boolean value per row")


def file_columns(path: str, fmt: str = "auto", delimiter: Optional[str] = None) -> List[str]:
    """The column names of an input file (CSV/TSV: its header line; parquet: its schema)."""
    if not os.path.isfile(path):
        raise ClickLogError(f"{path}: input file not found")
    kind = input_format(path, fmt)
    if kind == "parquet":
        import pyarrow.parquet as pq
        try:
            return list(pq.ParquetFile(path).schema_arrow.names)
        except Exception as e:   # pyarrow raises several types for a file that is not parquet
            raise ClickLogError(f"{path}: not a readable parquet file: {e}") from None
    if os.path.getsize(path) == 0:
        raise ClickLogError(f"{path}: the file is empty (expected a header line and rows)")
    with open(path, "rb") as f:
        header = f.readline().decode("utf-8-sig", "replace").rstrip("\r\n")
    separator = delimiter or ("\t" if kind == "tsv" else ",")
    names = next(csv.reader([header], delimiter=separator))
    if not header or len(set(names)) != len(names):
        raise ClickLogError(f"{path}:1: the header must name every column once, got {header[:200]!r}")
    return names


def check_field_counts(path: str, separator: str, expected: int, chunk_bytes: int = 4 << 20) -> int:
    """Every line of a CSV/TSV file has ``expected`` fields, else ClickLogError naming the line (a truncated or
    shifted row would otherwise be read with missing or dropped values). One fast pass over the bytes (numpy), a
    chunk at a time. Lines holding a quote character are left to the parser (a quoted field may hold the separator
    or a newline); line numbers count newlines. Returns the number of data lines."""
    sep, quote, newline = ord(separator), ord('"'), ord("\n")
    line_number = 1                     # the header
    data_lines = 0
    with open(path, "rb") as f:
        f.readline()
        rest = b""
        while True:
            data = f.read(chunk_bytes)
            buffer = rest + data
            if not buffer:
                break
            if data:
                cut = buffer.rfind(b"\n") + 1
                if cut == 0:
                    rest = buffer
                    continue
                block, rest = buffer[:cut], buffer[cut:]
            else:
                block, rest = buffer + b"\n", b""          # a last line without a newline
            raw = np.frombuffer(block, np.uint8)
            ends = np.flatnonzero(raw == newline)
            starts = np.concatenate([[0], ends[:-1] + 1])
            # Running counts (int32: chunks are small) at each line's end minus those before its start.
            seps = np.cumsum(raw == sep, dtype=np.int32)
            before = np.where(starts > 0, seps[np.maximum(starts - 1, 0)], 0)
            fields = seps[ends] - before + 1
            quotes = np.cumsum(raw == quote, dtype=np.int32)
            has_quote = quotes[ends] - np.where(starts > 0, quotes[np.maximum(starts - 1, 0)], 0) > 0
            del seps, quotes
            length = ends - starts - (raw[np.maximum(ends - 1, 0)] == ord("\r"))
            bad = np.flatnonzero((fields != expected) & ~has_quote & (length > 0))
            if bad.size:
                i = int(bad[0])
                text = bytes(block[starts[i]:ends[i]]).decode("utf-8", "replace").rstrip("\r")
                raise ClickLogError(f"{path}:{line_number + i + 1}: {int(fields[i])} field(s), but the header has "
                                    f"{expected} (a truncated or malformed row): {text[:200]!r}")
            line_number += len(ends)
            data_lines += int(np.count_nonzero(length > 0))
    return data_lines


@contextlib.contextmanager
def _parse_errors(described: str):
    """A parse error of Polars (an unterminated quote, say) as a ClickLogError naming the input."""
    pl = _polars()
    try:
        yield
    except pl.exceptions.PolarsError as e:
        message = str(e).strip().splitlines()
        raise ClickLogError(f"{described}: cannot be read as {'parquet' if 'parquet' in described else 'CSV'}: "
                            f"{' '.join(message[:3])}") from None


def _check_columns(path: str, header: Sequence[str], wanted: Dict[str, Sequence[str]]) -> None:
    for role, names in wanted.items():
        missing = [n for n in names if n not in header]
        if missing:
            shown = ", ".join(header[:30]) + (", ..." if len(header) > 30 else "")
            raise ClickLogError(f"{path}: {role} column(s) {missing} not in the header (columns: {shown})")


# ------------------------------------------------------------------------------------------------ row -> split
def _hash32(x):
    """A 32-bit integer mixer (the "lowbias32"-style finaliser) written with operations that behave the same on a
    Polars expression and a numpy int64 array (values stay below 2**63, so nothing overflows)."""
    x = x & _MASK32
    x = (x ^ (x // 65536)) * 0x45D9F3B & _MASK32
    x = (x ^ (x // 65536)) * 0x45D9F3B & _MASK32
    return x ^ (x // 65536)


def random_unit(row, seed: int):
    """Uniform number in [0, 1) for a row number (Polars expression or numpy int64): depends on (row, seed) only."""
    salted = (row & _MASK32) ^ _hash32(row // (1 << 32) + (seed & _MASK32) * 2654435761)
    return _hash32(_hash32(salted)) / float(1 << 32)


def negative_kept(rows: np.ndarray, labels: np.ndarray, rate: float, seed: int) -> np.ndarray:
    """Boolean mask of the train rows kept by negative down-sampling at ``rate``: every positive, and a negative when
    the uniform number of its global row number (``random_unit`` with ``seed`` salted) is below ``rate``."""
    if rate >= 1.0:
        return np.ones(len(rows), dtype=bool)
    u = random_unit(np.asarray(rows, dtype=np.int64), (int(seed) ^ _DOWNSAMPLING_SALT) & _MASK32)
    return np.asarray(labels).astype(bool) | (u < rate)


def check_downsampling_rate(rate: Any) -> float:
    """``--negative_downsampling_rate`` as a float in (0, 1], else ClickLogError naming the flag."""
    try:
        value = float(rate)
    except (TypeError, ValueError):
        value = float("nan")
    if not 0.0 < value <= 1.0:
        raise ClickLogError(f"--negative_downsampling_rate must be a number in (0, 1] (the probability a train "
                            f"negative is kept; 1 keeps every row), got {rate!r}")
    return value


def _split_expr(split: Dict[str, Any]):
    """Polars expression: 0 train, 1 validation, 2 test."""
    pl = _polars()
    train_f, valid_f, _ = split["fractions"]
    if split["kind"] == "random":
        u = random_unit(pl.col(_ROW).cast(pl.Int64), split["seed"])
        return pl.when(u < train_f).then(0).when(u < train_f + valid_f).then(1).otherwise(2).cast(pl.Int8)
    key = _time_key(pl.col(split["time_column"]), split["time_numeric"])
    return (pl.when(key <= split["train_until"]).then(0)
            .when(key <= split["validation_until"]).then(1).otherwise(2).cast(pl.Int8))


def _time_key(expr, numeric: bool):
    pl = _polars()
    return expr.cast(pl.Float64, strict=False) if numeric else expr.cast(pl.String)


def time_cutoffs(reader, path_desc: str, time_column: str, fractions: Sequence[float],
                 block_rows: int = 1 << 18) -> Dict[str, Any]:
    """One pass counting rows per distinct timestamp (block by block); returns the last timestamp of train and
    validation."""
    pl = _polars()
    counts = merge_counts([])
    for block in _batches(reader.select([pl.col(time_column).alias("value")]), block_rows, path_desc):
        if block["value"].null_count():
            raise ClickLogError(f"{path_desc}: time column {time_column!r} has empty values; every row needs a time")
        counts = merge_counts([counts, block["value"].value_counts(name="count")])
    counts = counts.rename({"value": "t", "count": "n"})
    numeric = counts["t"].cast(pl.Float64, strict=False).null_count() == 0
    key = counts["t"].cast(pl.Float64) if numeric else counts["t"]
    counts = counts.with_columns(key.alias("k")).sort("k")
    cumulative = counts["n"].cum_sum().to_numpy()
    keys = counts["k"].to_list()
    total = int(cumulative[-1])
    train_end = int(np.searchsorted(cumulative, fractions[0] * total, side="left"))
    valid_end = int(np.searchsorted(cumulative, (fractions[0] + fractions[1]) * total, side="left"))
    train_end = min(train_end, len(keys) - 1)
    valid_end = min(max(valid_end, train_end), len(keys) - 1)
    return {"time_numeric": bool(numeric), "train_until": keys[train_end],
            "validation_until": keys[valid_end] if fractions[1] > 0 else keys[train_end],
            "distinct_times": len(keys)}


# ------------------------------------------------------------------------------------------------ pass 1: statistics
def _bad_numeric(name: str):
    """True where a value is present but does not parse as a number."""
    pl = _polars()
    raw = pl.col(name)
    return raw.is_not_null() & raw.cast(pl.String).str.strip_chars().cast(pl.Float64, strict=False).is_null()


def _as_float(name: str):
    pl = _polars()
    return pl.col(name).cast(pl.String).str.strip_chars().cast(pl.Float64, strict=False)


def _label_int(name: str):
    """0/1 from 0, 1, 0.0, 1.0, true, false (any case); null where it is none of these."""
    pl = _polars()
    text = pl.col(name).cast(pl.String).str.strip_chars().str.to_lowercase()
    return (pl.when(text.is_in(["1", "1.0", "true"])).then(1)
            .when(text.is_in(["0", "0.0", "false"])).then(0).otherwise(None).cast(pl.Int8))


def count_values(lf, categorical: Sequence[str], numerical: Sequence[str], label: str, train_only: bool,
                 want_moments: bool, block_rows: int, described: str, total_rows: Optional[int] = None):
    """Pass 1, one streaming scan in blocks of ``block_rows`` rows: value counts of every categorical column (train
    rows, or all; summed block by block with ``criteo.dictionaries.merge_counts``, so memory is one block plus the
    counts), numerical sums over train rows, and the first row of every bad value (label, numericals).

    Returns ``(stats, counts)``: ``counts[i]`` is a ``value, count`` frame of categorical column ``i``."""
    pl = _polars()
    aggs = [pl.col(_ROW), pl.col(_SPLIT), _label_int(label).is_null().alias("__bad_label")]
    aggs += [pl.col(c).cast(pl.String).alias(f"__cat_{i}") for i, c in enumerate(categorical)]
    for i, n in enumerate(numerical):
        aggs.append(_bad_numeric(n).alias(f"__bad_num_{i}"))
        if want_moments:
            aggs.append(_as_float(n).alias(f"__num_{i}"))
    counts = [merge_counts([]) for _ in categorical]
    stats: Dict[str, Any] = {"rows": 0, "rows_train": 0, "rows_validation": 0, "rows_test": 0, "bad_label_row": None}
    for i, _ in enumerate(numerical):
        stats.update({f"bad_num_{i}": None, f"n_{i}": 0, f"s_{i}": 0.0, f"q_{i}": 0.0})
    progress = _Progress(total_rows, "pass 1 (count)") if total_rows else None

    def first_bad(block, flag: str, current):
        rows = block.filter(pl.col(flag))[_ROW]
        return current if current is not None or rows.len() == 0 else int(rows.min())

    for block in _batches(lf.select(aggs), block_rows, described):
        split = block[_SPLIT]
        stats["rows"] += block.height
        for k, name in enumerate(SPLITS):
            stats[f"rows_{name}"] += int((split == k).sum())
        stats["bad_label_row"] = first_bad(block, "__bad_label", stats["bad_label_row"])
        counted = block.filter(pl.col(_SPLIT) == 0) if train_only else block
        for i, _ in enumerate(categorical):
            values = counted[f"__cat_{i}"].drop_nulls()
            block_counts = values.value_counts(name="count").rename({f"__cat_{i}": "value"})
            counts[i] = merge_counts([counts[i], block_counts])
        for i, _ in enumerate(numerical):
            stats[f"bad_num_{i}"] = first_bad(block, f"__bad_num_{i}", stats[f"bad_num_{i}"])
            if want_moments:
                x = block.filter(pl.col(_SPLIT) == 0)[f"__num_{i}"].drop_nulls().drop_nans().to_numpy()
                stats[f"n_{i}"] += int(x.size)
                stats[f"s_{i}"] += float(x.sum())
                stats[f"q_{i}"] += float((x * x).sum())
        if progress:
            progress.update(block.height)
    if progress:
        progress.update(0, final=True)
    return stats, counts


def build_dictionaries(counts, categorical: Sequence[str], frequency_limit: int) -> List[Any]:
    """Per feature, a DataFrame ``value, count, id`` by the Criteo rule (``recsys_common.criteo.dictionaries``:
    values seen >= frequency_limit times, ids 2.. by decreasing count, ties by value)."""
    return [build_dictionary(counts[i], frequency_limit) for i, _ in enumerate(categorical)]


# ------------------------------------------------------------------------------------------------ pass 2: mapping
def map_categorical(values, lookup: "DictionaryLookup") -> np.ndarray:
    """Text values (a Polars Series, nulls = missing) -> int64 ids: 0 missing, 1 rare/unseen, 2.. frequent."""
    ids = np.full(len(values), MISSING_ID, dtype=np.int64)
    present = values.is_not_null().to_numpy()
    if present.any():
        ids[present] = lookup.ids(values.filter(values.is_not_null()))
    return ids


def _numerical_expr(name: str, transform: str, stats: Optional[Dict[str, float]]):
    pl = _polars()
    x = _as_float(name)
    if transform == "log":
        value = pl.when(x > -3).then((x + 3).log()).otherwise(0.0)
    elif transform == "standardize":
        value = (x - stats["mean"]) / stats["std"]
    else:
        value = x
    return value.fill_null(0.0).fill_nan(0.0)


def mapped_columns(config: Dict[str, Any]) -> List[Any]:
    """The expressions of pass 2 (and of ``apply``): label and numerical features as the model reads them, the
    categorical columns as text (``map_block`` looks them up)."""
    pl = _polars()
    exprs = [_label_int(config["label"]).cast(pl.Boolean).alias(LABEL_FEATURE)]
    for i, name in enumerate(config["categorical"]):
        exprs.append(pl.col(name).cast(pl.String).alias(f"__cat_{i}"))
    for i, name in enumerate(config["numerical"]):
        stats = config["numerical_stats"][i] if config["numerical_stats"] else None
        exprs.append(_numerical_expr(name, config["numerical_transform"], stats)
                     .alias(config["features"]["numerical"][i]))
    return exprs


def map_block(block, config: Dict[str, Any], lookups: Sequence["DictionaryLookup"],
              with_label: bool = True) -> Dict[str, np.ndarray]:
    """A block of ``mapped_columns`` output -> feature name -> numpy array (what DatasetWriter takes)."""
    names = config["features"]
    out = {LABEL_FEATURE: block[LABEL_FEATURE].to_numpy()} if with_label else {}
    for i, name in enumerate(names["categorical"]):
        out[name] = map_categorical(block[f"__cat_{i}"], lookups[i])
    for name in names["numerical"]:
        out[name] = block[name].to_numpy()
    return out


def feature_names(categorical: Sequence[str], numerical: Sequence[str], label: str) -> Dict[str, List[str]]:
    """Feature names in the spec: the column names (the label feature is always ``label``)."""
    names = {"categorical": list(categorical), "numerical": list(numerical)}
    taken = set()
    for name in list(categorical) + list(numerical):
        if name in taken:
            raise ClickLogError(f"column {name!r} is named twice in --categorical/--numerical")
        if name == LABEL_FEATURE:
            raise ClickLogError(f"column {name!r} cannot be a feature: the spec's label feature is named {name!r}")
        taken.add(name)
    if label in taken:
        raise ClickLogError(f"the label column {label!r} is also listed as a feature")
    return names


def make_feature_spec(config: Dict[str, Any], cardinalities: Sequence[int], splits: Sequence[str],
                      output_format: str, metadata: Dict[str, Any]) -> FeatureSpec:
    cats, nums = config["features"]["categorical"], config["features"]["numerical"]
    # float16 as NVIDIA's numerical.bin for log(x + 3) (small, bounded values); parquet has no float16 column type.
    num_dtype = "float16" if config["numerical_transform"] == "log" and output_format == "split_binary" else "float32"
    features: Dict[str, Dict[str, Any]] = {LABEL_FEATURE: {"dtype": "bool"}}
    for name in nums:
        features[name] = {"dtype": num_dtype}
    for name, card in zip(cats, cardinalities):
        features[name] = {"dtype": smallest_int_dtype(int(card)), "cardinality": int(card)}
    source: Dict[str, List[Dict[str, Any]]] = {}
    for split in splits:
        if output_format == "parquet":
            source[split] = [{"type": "parquet", "features": [LABEL_FEATURE] + nums + cats,
                              "files": [f"{split}/data.parquet"]}]
            continue
        chunks = []
        if nums:
            chunks.append({"type": "split_binary", "features": list(nums), "files": [f"{split}/numerical.bin"]})
        chunks.append({"type": "split_binary", "features": [LABEL_FEATURE], "files": [f"{split}/label.bin"]})
        for i, name in enumerate(cats):
            chunks.append({"type": "split_binary", "features": [name], "files": [f"{split}/cat_{i}.bin"]})
        source[split] = chunks
    channels = {"categorical": list(cats), "numerical": list(nums), "label": [LABEL_FEATURE]}
    return FeatureSpec(features, source, channels, metadata)


def _Progress(total: int, what: str) -> Progress:
    """``[prepare_clicks] pass 2: 1,048,576 of 40,428,967 rows (2.6 %), 310,000 rows/s, 0:02:07 left``."""
    return Progress(f"[prepare_clicks] {what}", total)


# ------------------------------------------------------------------------------------------------ the whole job
class BlockReader:
    """The input files as eager Polars frames of at most ``block_rows`` rows, every column as text, with the global
    row number ``__row``, the file's index ``__file`` and the row's line (CSV/TSV, 1-based, the header is line 1) or
    row (parquet, 0-based) ``__line``; ``select`` / ``with_columns`` are queued and applied to each block.

    CSV/TSV files are read ``block_rows`` lines at a time and each block is parsed by Polars' CSV reader; parquet
    files by pyarrow's ``iter_batches``. Nothing reads ahead, so memory is one block whatever the input's size
    (Polars' own streaming ``collect_batches`` kept more buffered the longer the input: 420 -> 520 MB anonymous
    memory from 1M to 4M Avazu-shaped rows with a slow consumer, measured 2026-11-25). Blank lines are skipped; a
    quoted field holding a newline is not supported (the block boundary may cut it: a parse error names the file).
    """

    def __init__(self, inputs: Sequence[str], fmt: str, delimiter: Optional[str], columns: Sequence[str],
                 ops: Tuple = ()):
        self.inputs, self.fmt, self.delimiter, self.columns, self.ops = list(inputs), fmt, delimiter, list(columns), ops

    def _with(self, kind: str, exprs) -> "BlockReader":
        return BlockReader(self.inputs, self.fmt, self.delimiter, self.columns, self.ops + ((kind, exprs),))

    def select(self, exprs) -> "BlockReader":
        return self._with("select", exprs)

    def with_columns(self, *exprs) -> "BlockReader":
        return self._with("with_columns", list(exprs))

    def blocks(self, block_rows: int) -> Iterator[Any]:
        pl = _polars()
        offset = 0
        for index, path in enumerate(self.inputs):
            for frame, lines in self._file_blocks(path, block_rows):
                n = frame.height
                frame = frame.with_columns(pl.int_range(offset, offset + n, dtype=pl.Int64).alias(_ROW),
                                           pl.lit(index, dtype=pl.Int32).alias("__file"),
                                           pl.Series("__line", lines, dtype=pl.Int64))
                offset += n
                for kind, exprs in self.ops:
                    frame = getattr(frame, kind)(exprs)
                yield frame

    def _file_blocks(self, path: str, block_rows: int) -> Iterator[Tuple[Any, np.ndarray]]:
        pl = _polars()
        kind = input_format(path, self.fmt)
        if kind == "parquet":
            import pyarrow.parquet as pq
            first = 0
            parquet = pq.ParquetFile(path)
            check_scalar_columns(path, parquet.schema_arrow, self.columns)
            for batch in parquet.iter_batches(batch_size=block_rows, columns=self.columns):
                frame = pl.from_arrow(batch).select([pl.col(c).cast(pl.String) for c in self.columns])
                yield frame, np.arange(first, first + frame.height)
                first += frame.height
            return
        separator = self.delimiter or ("\t" if kind == "tsv" else ",")
        with open(path, "rb") as f:
            header = f.readline()
            if header.startswith(b"\xef\xbb\xbf"):      # a UTF-8 byte-order mark (spreadsheet exports)
                header = header[3:]
            line_number = 2
            while True:
                lines = list(itertools.islice(f, block_rows))
                if not lines:
                    break
                keep = [i for i, line in enumerate(lines) if line.strip(b"\r\n")]
                numbers = np.asarray(keep, dtype=np.int64) + line_number
                line_number += len(lines)
                if not keep:
                    continue
                data = header + b"".join(lines[i] if lines[i].endswith(b"\n") else lines[i] + b"\n" for i in keep)
                # Every column as text: ids stay exactly as written (hex, leading zeros), and a bad number is
                # reported by us with its line instead of by the CSV parser without one.
                frame = pl.read_csv(io.BytesIO(data), separator=separator, has_header=True, infer_schema=False,
                                    columns=self.columns, empty_string_is_null=True)
                yield frame, numbers


def _scan_all(inputs: Sequence[str], fmt: str, delimiter: Optional[str], roles: Dict[str, Sequence[str]]):
    """A BlockReader over every input (same columns in each), the columns of ``roles`` (role -> names) only; and
    the number of rows (from the field-count check, or parquet's metadata), for the progress lines."""
    total_rows = 0
    needed = list(dict.fromkeys(n for names in roles.values() for n in names))
    for path in inputs:
        header = file_columns(path, fmt, delimiter)
        _check_columns(path, header, roles)
        kind = input_format(path, fmt)
        if kind != "parquet":
            print(f"[prepare_clicks] checking the field count of every line of {path}", flush=True)
            total_rows += check_field_counts(path, delimiter or ("\t" if kind == "tsv" else ","), len(header))
        else:
            import pyarrow.parquet as pq
            total_rows += pq.ParquetFile(path).metadata.num_rows
    return BlockReader(inputs, fmt, delimiter, needed), total_rows


def _batches(reader: BlockReader, block_rows: int, described: str) -> Iterator[Any]:
    """The reader's blocks, parse errors named."""
    with _parse_errors(described):
        yield from reader.blocks(block_rows)


def _raise_bad_row(reader: BlockReader, row: int, column: str, what: str, block_rows: int) -> None:
    pl = _polars()
    for block in _batches(reader, block_rows, reader.inputs[0]):
        hit = block.filter(pl.col(_ROW) == row)
        if hit.height:
            path = reader.inputs[int(hit["__file"][0])]
            line = int(hit["__line"][0])
            where = f"{path}: row {line}" if input_format(path, reader.fmt) == "parquet" else f"{path}:{line}"
            raise ClickLogError(f"{where}: column {column!r}: {hit[column][0]!r} is not {what}")
    raise ClickLogError(f"{reader.inputs[0]}: row {row}: column {column!r} is not {what}")


def _fingerprint(inputs: Sequence[str], settings: Dict[str, Any]) -> Dict[str, Any]:
    """What pass 1's saved results depend on: every input's path, size and modification time, and the settings."""
    files = [[os.path.abspath(p), os.path.getsize(p), os.stat(p).st_mtime_ns] for p in inputs]
    return json.loads(json.dumps({"files": files, "settings": settings}, default=str))


def _load_pass1(work_dir: str, fingerprint: Dict[str, Any]):
    """Pass 0/1 results saved by an earlier run that was stopped in pass 2, if they match; else None."""
    path = os.path.join(work_dir, "pass1.json")
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as f:
        saved = json.load(f)
    if saved.get("fingerprint") != fingerprint:
        print(f"[prepare_clicks] {work_dir}: saved counts are of other inputs or settings; counting again",
              flush=True)
        return None
    pl = _polars()
    counts = [pl.read_parquet(os.path.join(work_dir, f"counts_{i}.parquet")) for i in range(saved["num_counts"])]
    return saved["split_config"], saved["stats"], counts


def _save_pass1(work_dir: str, fingerprint: Dict[str, Any], split_config: Dict[str, Any], stats: Dict[str, Any],
                counts: Sequence[Any]) -> None:
    """Pass 1's results, so that a run killed in pass 2 does not count again (``pass1.json`` written last)."""
    os.makedirs(work_dir, exist_ok=True)
    for i, frame in enumerate(counts):
        target = os.path.join(work_dir, f"counts_{i}.parquet")
        frame.write_parquet(target + ".tmp")
        os.replace(target + ".tmp", target)
    atomic_write_text(os.path.join(work_dir, "pass1.json"), json.dumps(
        {"fingerprint": fingerprint, "split_config": split_config, "stats": stats, "num_counts": len(counts)},
        default=str) + "\n")


def _remove_work_dir(work_dir: str, num_counts: int) -> None:
    """Delete only the files this tool wrote there, then the directory if it is empty."""
    for name in ["pass1.json"] + [f"counts_{i}.parquet" for i in range(num_counts)]:
        with contextlib.suppress(FileNotFoundError):
            os.remove(os.path.join(work_dir, name))
    with contextlib.suppress(OSError):
        os.rmdir(work_dir)


def _checked_fractions(inputs: Sequence[str], categorical: Sequence[str], numerical: Sequence[str],
                       split_fractions: Sequence[float], split: str, time_column: Optional[str],
                       frequency_limit: int, block_rows: int) -> List[float]:
    """The arguments of :func:`prepare` checked before any pass over the data; the split fractions as floats."""
    if not inputs:
        raise ClickLogError("no --input file given")
    if not categorical and not numerical:
        raise ClickLogError("give at least one --categorical or --numerical column")
    fractions = [float(f) for f in split_fractions]
    if len(fractions) != 3 or any(f < 0 for f in fractions) or fractions[0] <= 0 or fractions[2] <= 0 \
            or abs(sum(fractions) - 1.0) > 1e-6:
        raise ClickLogError(f"--split_fractions must be three numbers train validation test, train and test > 0, "
                            f"summing to 1; got {split_fractions}")
    if split == "time" and not time_column:
        raise ClickLogError("--split time needs --time_column")
    if frequency_limit < 1:
        raise ClickLogError(f"--frequency_limit must be >= 1, got {frequency_limit}")
    if block_rows < 1:
        raise ClickLogError(f"--block_rows must be >= 1, got {block_rows}")
    return fractions


def _count_pass(lf, described: str, work_dir: str, fingerprint: str, split_config: Dict[str, Any],
                categorical: Sequence[str], numerical: Sequence[str], label: str, dictionary_source: str,
                standardize: bool, block_rows: int, total_rows: Optional[int]):
    """Passes 0-1 (the time cutoffs, the value counts), or what a run stopped in pass 2 saved of them:
    ``(split_config, stats, counts, resumed)``."""
    resumed = _load_pass1(work_dir, fingerprint)
    if resumed is not None:
        print(f"[prepare_clicks] passes 0-1: reusing the counts saved in {work_dir} by a run stopped in pass 2",
              flush=True)
        return (*resumed, True)
    if split_config["kind"] == "time":
        time_column = split_config["time_column"]
        print(f"[prepare_clicks] pass 0: rows per distinct {time_column!r}", flush=True)
        with _parse_errors(described):
            split_config.update(time_cutoffs(lf, described, time_column, split_config["fractions"], block_rows))
    print(f"[prepare_clicks] pass 1: counting values of {len(categorical)} categorical column(s) over "
          f"{'train rows' if dictionary_source == 'train' else 'all rows'} of {described}", flush=True)
    with _parse_errors(described):
        stats, counts = count_values(lf.with_columns(_split_expr(split_config).alias(_SPLIT)), categorical,
                                     numerical, label, dictionary_source == "train", standardize, block_rows,
                                     described, total_rows)
    return split_config, stats, counts, False


def _split_rows(lf, stats, described: str, label: str, numerical: Sequence[str], split_config: Dict[str, Any],
                block_rows: int) -> Dict[str, int]:
    """Rows per split counted in pass 1, after refusing a bad label or number (naming its row) and an empty split."""
    rows = int(stats["rows"])
    if rows == 0:
        raise ClickLogError(f"{described}: no data rows (only a header?)")
    if stats["bad_label_row"] is not None:
        _raise_bad_row(lf, int(stats["bad_label_row"]), label, "a 0/1 label", block_rows)
    for i, name in enumerate(numerical):
        if stats[f"bad_num_{i}"] is not None:
            _raise_bad_row(lf, int(stats[f"bad_num_{i}"]), name, "a number", block_rows)
    split_rows = {"train": int(stats["rows_train"]), "validation": int(stats["rows_validation"]),
                  "test": int(stats["rows_test"])}
    fractions = split_config["fractions"]
    for name, wanted in zip(SPLITS, fractions):
        if wanted > 0 and split_rows[name] == 0:
            hint = (f"; the time column {split_config['time_column']!r} has {split_config['distinct_times']} "
                    f"distinct value(s), and rows of one time stay in one split" if split_config["kind"] == "time"
                    else f"; {rows} rows are too few for these fractions")
            raise ClickLogError(f"{described}: the {name} split would have no rows (fractions {fractions}){hint}")
    return split_rows


def _numerical_stats(stats, numerical: Sequence[str], numerical_transform: str) -> List[Dict[str, float]]:
    """Train mean and standard deviation of each numerical column (``standardize`` only; else empty)."""
    if numerical_transform != "standardize":
        return []
    out = []
    for i, _ in enumerate(numerical):
        n, s, q = stats[f"n_{i}"] or 0, stats[f"s_{i}"] or 0.0, stats[f"q_{i}"] or 0.0
        mean = s / n if n else 0.0
        std = math.sqrt(max(q / n - mean * mean, 0.0)) if n else 1.0
        out.append({"mean": mean, "std": std if std > 0 else 1.0, "count": int(n)})
    return out


def _dataset_metadata(inputs: Sequence[str], label: str, numerical_transform: str, split_config: Dict[str, Any],
                      split_rows: Dict[str, int], splits: Sequence[str], downsampling: float) -> Dict[str, Any]:
    """The feature spec's ``metadata`` (``num_samples`` is replaced by the rows written once pass 2 is done)."""
    return {
        "dataset": "prepare_clicks", "inputs": [os.path.basename(p) for p in inputs], "label": label,
        "categorical_ids": "0 missing, 1 rare or unseen, 2.. frequent values by decreasing count",
        "numerical_transform": {"log": "log(x + 3); missing or x <= -3 -> 0",
                                "standardize": "(x - train mean) / train std; missing -> 0",
                                "none": "x; missing -> 0"}[numerical_transform],
        "split": {k: v for k, v in split_config.items()},
        "num_samples": {s: split_rows[s] for s in splits},    # train: the rows written (after down-sampling)
        "negative_downsampling_rate": downsampling,
    }


def _write_blocks(pass2, writers: Dict[str, DatasetWriter], config: Dict[str, Any], lookups, rows: int,
                  block_rows: int, described: str, downsampling: float, seed: int, shuffle_train: bool):
    """Pass 2: map every block and write its rows to their splits (train negatives down-sampled, train rows
    permuted within the block); returns (rows seen per split before down-sampling, positives written per split)."""
    progress = _Progress(rows, "pass 2 (map and write)")
    positives = {s: 0 for s in writers}
    seen = {s: 0 for s in writers}            # rows of each split before down-sampling (pass 1's counts)
    for block_number, block in enumerate(_batches(pass2, block_rows, described)):
        split_of_row = block[_SPLIT].to_numpy()
        arrays = map_block(block, config, lookups)
        for index, name in enumerate(SPLITS):
            if name not in writers:
                continue
            rows_here = np.flatnonzero(split_of_row == index)
            seen[name] += int(rows_here.size)
            if name == "train" and downsampling < 1.0:
                rows_here = rows_here[negative_kept(block[_ROW].to_numpy()[rows_here],
                                                    arrays[LABEL_FEATURE][rows_here], downsampling, seed)]
            if not rows_here.size:
                continue
            if name == "train" and shuffle_train:
                rows_here = np.random.default_rng([seed, block_number]).permutation(rows_here)
            part = {c: a[rows_here] for c, a in arrays.items()}
            positives[name] += int(part[LABEL_FEATURE].sum())
            writers[name].write(part)
        progress.update(block.height)
    progress.update(0, final=True)
    return seen, positives


@contextlib.contextmanager
def _split_writers(spec, splits: Sequence[str]) -> Iterator[Dict[str, DatasetWriter]]:
    """One open :class:`DatasetWriter` per split; all closed (with the error, if any) on the way out."""
    writers = {s: DatasetWriter(spec, s) for s in splits}
    for w in writers.values():
        w.__enter__()
    try:
        yield writers
    except BaseException as error:
        for w in writers.values():
            w.__exit__(type(error), error, None)
        raise
    for w in writers.values():
        w.__exit__(None, None, None)


def prepare(inputs: Sequence[str], output: str, label: str, categorical: Sequence[str],
            numerical: Sequence[str] = (), input_format_name: str = "auto", delimiter: Optional[str] = None,
            frequency_limit: int = DEFAULT_FREQUENCY_LIMIT, dictionary_source: str = "train",
            numerical_transform: str = "log", split: str = "random",
            split_fractions: Sequence[float] = (0.8, 0.1, 0.1), time_column: Optional[str] = None, seed: int = 0,
            shuffle_train: bool = True, output_format: str = "split_binary", block_rows: int = 1 << 18,
            overwrite: bool = False, work_dir: Optional[str] = None,
            negative_downsampling_rate: float = 1.0) -> Dict[str, Any]:
    """Prepare ``inputs`` into ``output``; returns ``{"spec": FeatureSpec, "report": dict}``. See the module doc."""
    pl = _polars()
    started = time.time()
    inputs = list(inputs)
    fractions = _checked_fractions(inputs, categorical, numerical, split_fractions, split, time_column,
                                   frequency_limit, block_rows)
    downsampling = check_downsampling_rate(negative_downsampling_rate)
    names = feature_names(categorical, numerical, label)
    check_output_directory(output, overwrite)   # refused before the passes over the data, not after
    roles = {"label": [label], "categorical": list(categorical), "numerical": list(numerical)}
    if split == "time":
        roles["time"] = [time_column]
    lf, total_rows = _scan_all(inputs, input_format_name, delimiter, roles)
    described = inputs[0] if len(inputs) == 1 else f"{inputs[0]} (+{len(inputs) - 1} more)"
    work_dir = work_dir or os.path.abspath(output).rstrip(os.sep) + ".prepare_clicks.work"
    fingerprint = _fingerprint(inputs, {
        "label": label, "categorical": list(categorical), "numerical": list(numerical), "split": split,
        "fractions": fractions, "time_column": time_column, "seed": int(seed), "format": input_format_name,
        "delimiter": delimiter, "dictionary_source": dictionary_source,
        "moments": numerical_transform == "standardize"})
    t1 = time.time()
    split_config = {"kind": split, "fractions": fractions, "seed": int(seed)}
    if split == "time":
        split_config["time_column"] = time_column
    split_config, stats, counts, resumed = _count_pass(
        lf, described, work_dir, fingerprint, split_config, categorical, numerical, label, dictionary_source,
        numerical_transform == "standardize", block_rows, total_rows)
    lf = lf.with_columns(_split_expr(split_config).alias(_SPLIT))
    split_rows = _split_rows(lf, stats, described, label, numerical, split_config, block_rows)
    rows = int(stats["rows"])
    print(f"[prepare_clicks] pass 1: {rows:,} rows in {time.time() - t1:.1f} s", flush=True)
    if not resumed:
        _save_pass1(work_dir, fingerprint, split_config, stats, counts)
    dictionaries = build_dictionaries(counts, categorical, frequency_limit)
    cardinalities = [FIRST_FREQUENT_ID + d.height for d in dictionaries]
    splits = [s for s, f in zip(SPLITS, fractions) if f > 0]
    config = {
        "label": label, "categorical": list(categorical), "numerical": list(numerical), "features": names,
        "frequency_limit": int(frequency_limit), "dictionary_source": dictionary_source,
        "numerical_transform": numerical_transform,
        "numerical_stats": _numerical_stats(stats, numerical, numerical_transform),
        "input_format": input_format_name, "delimiter": delimiter,
    }
    metadata = _dataset_metadata(inputs, label, numerical_transform, split_config, split_rows, splits, downsampling)
    pass2 = lf.select([pl.col(_ROW), pl.col(_SPLIT)] + mapped_columns(config))
    lookups = [DictionaryLookup(d) for d in dictionaries]
    with atomic_directory(output, overwrite=overwrite, tool=TOOL, marker="feature_spec.yaml") as tmp:
        spec = make_feature_spec(config, cardinalities, splits, output_format, metadata)
        spec.base_directory = tmp
        with _split_writers(spec, splits) as writers:
            seen, positives = _write_blocks(pass2, writers, config, lookups, rows, block_rows, described,
                                            downsampling, seed, shuffle_train)
        written = {s: writers[s].rows_written for s in splits}
        if seen != {s: split_rows[s] for s in splits}:
            raise ClickLogError(f"{described}: pass 2 read {seen} rows, pass 1 counted {split_rows}: "
                                f"did the input change while it was being read?")
        spec.metadata["num_samples"] = dict(written)
        os.makedirs(os.path.join(tmp, "dictionaries"))
        for i, d in enumerate(dictionaries):
            d.write_parquet(os.path.join(tmp, "dictionaries", f"{i}.parquet"))
        report = _run_report(config, split_config, rows, written, positives, seen, names, cardinalities, counts,
                             categorical, downsampling, seed, output_format, started, pl.__version__)
        atomic_write_text(os.path.join(tmp, REPORT_NAME), json.dumps(report, indent=1, default=str) + "\n")
        spec.to_yaml(os.path.join(tmp, "feature_spec.yaml"))
    _remove_work_dir(work_dir, len(counts))
    print(f"[prepare_clicks] wrote {output}: " + ", ".join(
        f"{s} {written[s]:,} rows (positive rate {report['positive_rate'][s]})" for s in splits)
        + (f"; train negatives kept at rate {downsampling} ({seen['train']:,} -> {written['train']:,} train rows)"
           if downsampling < 1.0 else "") + f"; {time.time() - started:.1f} s", flush=True)
    return {"spec": FeatureSpec.from_yaml(os.path.join(output, "feature_spec.yaml")), "report": report}


def _run_report(config, split_config, rows, written, positives, seen, names, cardinalities, counts, categorical,
                downsampling, seed, output_format, started, polars_version) -> Dict[str, Any]:
    """``prepare_clicks_report.json``: what was read, written and chosen. Every train positive is kept, so the
    train positive rate before down-sampling is positives / rows seen."""
    return {
        "tool": TOOL, "config": config, "split": split_config, "rows": rows, "num_samples": written,
        "positive_rate": {s: round(positives[s] / written[s], 6) if written[s] else None for s in written},
        "cardinalities": dict(zip(names["categorical"], cardinalities)),
        "values_seen": {c: int(counts[i].height) for i, c in enumerate(categorical)},
        "negative_downsampling": {"rate": downsampling, "train_rows_before": seen["train"],
                                  "train_rows_after": written["train"],
                                  "train_positive_rate_before": round(positives["train"] / seen["train"], 6),
                                  "seed": int(seed)},
        "output_format": output_format, "seconds": round(time.time() - started, 2),
        "polars": polars_version,
    }


class ClickEncoder:
    """The saved mapping of a prepared dataset, applied to new rows (a Polars/pandas frame, or a dict of lists).

        encoder = ClickEncoder.load("/data/clicks")
        inputs = encoder.encode({"site_id": ["1fbe01fe"], "C15": ["320"], ...})
        inputs["categorical"]   # int64 [B, n_categorical]: 0 missing, 1 rare/unseen, as in training
        inputs["numerical"]     # float32 [B, n_numerical], transformed as in training

    ``encode`` gives PyTorch DLRM's served inputs (``numerical``, ``categorical``); ``served_inputs(...)`` those of
    TensorFlow2 DLRM/DCNv2's (``numerical`` and one ``cat_<t>`` per feature).
    """

    def __init__(self, dataset: str, config: Dict[str, Any], dictionaries: List[Any]):
        self.dataset, self.config, self.dictionaries = dataset, config, dictionaries
        self.lookups = [DictionaryLookup(d) for d in dictionaries]

    @classmethod
    def load(cls, dataset: str) -> "ClickEncoder":
        pl = _polars()
        path = os.path.join(dataset, REPORT_NAME)
        try:
            with open(path, encoding="utf-8") as f:
                report = json.load(f)
        except FileNotFoundError:
            raise ClickLogError(f"{path}: not found; is {dataset} a dataset written by {TOOL}?") from None
        config = report["config"]
        dictionaries = []
        for i, _ in enumerate(config["categorical"]):
            dictionaries.append(pl.read_parquet(os.path.join(dataset, "dictionaries", f"{i}.parquet")))
        return cls(dataset, config, dictionaries)

    def _frame(self, rows: Any, need_label: bool):
        pl = _polars()
        frame = rows if isinstance(rows, pl.DataFrame) else pl.DataFrame(rows) if isinstance(rows, dict) \
            else pl.from_pandas(rows)
        needed = self.config["categorical"] + self.config["numerical"] + ([self.config["label"]] if need_label else [])
        _check_columns("rows to encode", frame.columns, {"needed": needed})
        # An empty string is a missing value, as an empty CSV field is when the dataset was prepared.
        return frame.select([pl.when(pl.col(c).cast(pl.String) == "").then(None)
                             .otherwise(pl.col(c).cast(pl.String)).alias(c) for c in needed])

    def encode(self, rows: Any) -> Dict[str, np.ndarray]:
        has_label = self.config["label"] in (rows.columns if hasattr(rows, "columns") else rows)
        frame = self._frame(rows, has_label)
        config = dict(self.config)
        exprs = mapped_columns(config)
        if not has_label:
            exprs = exprs[1:]
        out = frame.select(exprs)
        if has_label and out[LABEL_FEATURE].null_count():
            raise ClickLogError(f"rows to encode: column {self.config['label']!r} has a value that is not 0/1")
        bad = [n for n in config["numerical"] if frame.select(_bad_numeric(n).any()).item()]
        if bad:
            raise ClickLogError(f"rows to encode: numerical column(s) {bad} have a value that is not a number")
        columns = map_block(out, config, self.lookups, with_label=has_label)
        names = config["features"]
        result = {
            "categorical": (np.stack([columns[c] for c in names["categorical"]], axis=1).astype(np.int64)
                            if names["categorical"] else np.zeros((out.height, 0), np.int64)),
            "numerical": (np.stack([columns[c] for c in names["numerical"]], axis=1).astype(np.float32)
                          if names["numerical"] else np.zeros((out.height, 0), np.float32)),
        }
        if has_label:
            result["label"] = columns[LABEL_FEATURE].astype(np.float32)
        return result

    def served_inputs(self, rows: Any) -> Dict[str, np.ndarray]:
        """The served models' request: ``numerical`` FP32 [B, n] and ``cat_<t>`` INT64 [B, 1] per categorical."""
        encoded = self.encode(rows)
        inputs = {"numerical": encoded["numerical"]}
        for t in range(encoded["categorical"].shape[1]):
            inputs[f"cat_{t}"] = encoded["categorical"][:, t:t + 1]
        return inputs


def apply(dataset: str, inputs: Sequence[str], output: str, mapping: str = "test", input_format_name: str = "auto",
          delimiter: Optional[str] = None, block_rows: int = 1 << 18, overwrite: bool = False) -> FeatureSpec:
    """Map new rows with a prepared dataset's dictionaries into a dataset of one mapping (same layout and spec),
    which the recipes' ``predict`` and ``evaluate`` tools read. Rows without the label column get label 0.

    Nothing is down-sampled; the metadata keeps the source dataset's ``negative_downsampling_rate`` (that of the
    rows a model trained on it saw), so evaluating that model on these rows corrects its logits the same way."""
    pl = _polars()
    encoder = ClickEncoder.load(dataset)
    config = encoder.config
    spec_in = FeatureSpec.from_yaml(os.path.join(dataset, "feature_spec.yaml"))
    output_format = "parquet" if any(c["type"] == "parquet" for cs in spec_in.source_spec.values() for c in cs) \
        else "split_binary"
    check_output_directory(output, overwrite)
    label = config["label"]
    has_label = all(label in file_columns(p, input_format_name, delimiter) for p in inputs)
    roles = {"categorical": config["categorical"], "numerical": config["numerical"]}
    if has_label:
        roles["label"] = [label]
    lf, _ = _scan_all(inputs, input_format_name, delimiter, roles)
    aggs = [pl.len().alias("rows")] + [pl.col(_ROW).filter(_bad_numeric(n)).min().alias(f"bad_num_{i}")
                                       for i, n in enumerate(config["numerical"])]
    if has_label:
        aggs.append(pl.col(_ROW).filter(_label_int(label).is_null()).min().alias("bad_label_row"))
    stats = {"rows": 0, "bad_label_row": None, **{f"bad_num_{i}": None for i, _ in enumerate(config["numerical"])}}
    for block in _batches(lf.select(aggs), block_rows, inputs[0]):     # a check pass, block by block
        found = block.row(0, named=True)
        stats["rows"] += int(found["rows"])
        for key, value in found.items():
            if key != "rows" and stats[key] is None and value is not None:
                stats[key] = int(value)
    if stats["rows"] == 0:
        raise ClickLogError(f"{inputs[0]}: no data rows")
    if has_label and stats["bad_label_row"] is not None:
        _raise_bad_row(lf, int(stats["bad_label_row"]), label, "a 0/1 label", block_rows)
    for i, name in enumerate(config["numerical"]):
        if stats[f"bad_num_{i}"] is not None:
            _raise_bad_row(lf, int(stats[f"bad_num_{i}"]), name, "a number", block_rows)
    exprs = mapped_columns(config)
    if not has_label:
        exprs[0] = pl.lit(False).alias(LABEL_FEATURE)
    cardinalities = [spec_in.cardinality(n) for n in config["features"]["categorical"]]
    metadata = dict(spec_in.metadata, dataset="prepare_clicks apply", inputs=[os.path.basename(p) for p in inputs],
                    mapped_with=os.path.abspath(dataset), label_present=has_label,
                    num_samples={mapping: int(stats["rows"])})
    metadata.pop("split", None)
    progress = _Progress(int(stats["rows"]), "apply")
    with atomic_directory(output, overwrite=overwrite, tool=TOOL + ".apply", marker="feature_spec.yaml") as tmp:
        spec = make_feature_spec(config, cardinalities, [mapping], output_format, metadata)
        spec.base_directory = tmp
        with DatasetWriter(spec, mapping) as writer:
            for block in _batches(lf.select(exprs), block_rows, inputs[0]):
                writer.write(map_block(block, config, encoder.lookups))
                progress.update(block.height)
        progress.update(0, final=True)
        spec.to_yaml(os.path.join(tmp, "feature_spec.yaml"))
    return FeatureSpec.from_yaml(os.path.join(output, "feature_spec.yaml"))


# ------------------------------------------------------------------------------------------------ command line
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"python -m {TOOL}", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--input", nargs="+", required=True,
                        help="raw click log file(s) with a header line: .csv, .tsv/.txt, .parquet (same columns)")
    parser.add_argument("--output", required=True, help="dataset directory: new or empty unless --overwrite")
    parser.add_argument("--label", required=True, help="name of the 0/1 label column")
    parser.add_argument("--categorical", nargs="*", default=[], help="names of the categorical columns")
    parser.add_argument("--numerical", nargs="*", default=[], help="names of the numerical columns")
    parser.add_argument("--input_format", choices=("auto", "csv", "tsv", "parquet"), default="auto",
                        help="auto: from the file name (.parquet, .tsv/.txt, else CSV)")
    parser.add_argument("--delimiter", default=None, help="field separator of CSV/TSV input (default , or tab)")
    parser.add_argument("--frequency_limit", type=int, default=DEFAULT_FREQUENCY_LIMIT,
                        help="values seen fewer times share the rare/unseen id 1 (Criteo's flag)")
    parser.add_argument("--dictionary_source", choices=("train", "all"), default="train",
                        help="rows whose values are counted: the train split, or every row (NVIDIA's Criteo)")
    parser.add_argument("--numerical_transform", choices=TRANSFORMS, default="log",
                        help="log: log(x + 3) as Criteo; standardize: train mean/std; none")
    parser.add_argument("--split", choices=("random", "time"), default="random",
                        help="random: by a hash of the row number and --seed; time: by --time_column")
    parser.add_argument("--split_fractions", type=float, nargs=3, default=[0.8, 0.1, 0.1],
                        metavar=("TRAIN", "VALIDATION", "TEST"), help="fractions of the rows (validation may be 0)")
    parser.add_argument("--time_column", default=None, help="column ordering the rows in time (--split time)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random split and the train shuffle")
    parser.add_argument("--no_shuffle_train", action="store_true", help="keep train rows in file order")
    parser.add_argument("--negative_downsampling_rate", type=float, default=1.0, metavar="W",
                        help="keep each train negative with probability W in (0, 1] (a seeded hash of its row "
                             "number); positives, validation and test are kept whole; 1 keeps every row")
    parser.add_argument("--output_format", choices=FORMATS, default="split_binary",
                        help="split_binary (NVIDIA's layout, both DLRM recipes) or parquet")
    parser.add_argument("--block_rows", type=int, default=1 << 18,
                        help="rows read, counted, mapped and written at a time (memory holds about one block)")
    parser.add_argument("--overwrite", action="store_true",
                        help="write into a non-empty --output, replacing only this tool's earlier outputs there")
    parser.add_argument("--work_dir", default=None,
                        help="where pass 1's counts are kept until the output is complete, so that a run killed in "
                             "pass 2 and started again with the same arguments does not count again "
                             "(default: OUTPUT.prepare_clicks.work)")
    return parser


def build_apply_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"python -m {TOOL} apply",
                                     description="map new rows with a prepared dataset's saved dictionaries",
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--dataset", required=True, help="a dataset directory written by this tool")
    parser.add_argument("--input", nargs="+", required=True, help="new rows, same columns (the label may be absent)")
    parser.add_argument("--output", required=True, help="dataset directory to write (one mapping)")
    parser.add_argument("--mapping", default="test", help="name of the mapping to write")
    parser.add_argument("--input_format", choices=("auto", "csv", "tsv", "parquet"), default="auto")
    parser.add_argument("--delimiter", default=None)
    parser.add_argument("--block_rows", type=int, default=1 << 18)
    parser.add_argument("--overwrite", action="store_true")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    """``prepare`` (default) or ``apply`` (first argument); returns ``{"spec": FeatureSpec, "report": dict}``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "apply":
        args = build_apply_parser().parse_args(argv[1:])
        spec = apply(args.dataset, args.input, args.output, mapping=args.mapping,
                     input_format_name=args.input_format, delimiter=args.delimiter, block_rows=args.block_rows,
                     overwrite=args.overwrite)
        return {"spec": spec, "report": spec.metadata}
    args = build_parser().parse_args(argv)
    return prepare(args.input, args.output, args.label, args.categorical, args.numerical,
                   input_format_name=args.input_format, delimiter=args.delimiter,
                   frequency_limit=args.frequency_limit, dictionary_source=args.dictionary_source,
                   numerical_transform=args.numerical_transform, split=args.split,
                   split_fractions=args.split_fractions, time_column=args.time_column, seed=args.seed,
                   shuffle_train=not args.no_shuffle_train, output_format=args.output_format,
                   block_rows=args.block_rows, overwrite=args.overwrite, work_dir=args.work_dir,
                   negative_downsampling_rate=args.negative_downsampling_rate)


# Bad input (a malformed log, a non-empty --output): one error line and exit 2 (recsys_common.cli).
INPUT_ERRORS = (ClickLogError, FileExistsError)

if __name__ == "__main__":
    from recsys_common.cli import run_main
    run_main(main, input_errors=INPUT_ERRORS)
