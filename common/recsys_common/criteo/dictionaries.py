"""Frequency dictionaries of categorical values, as every Criteo path here builds them, and a fast exact lookup.

The id rule (one place, shared by the single-machine engine and the raw click-log tools; the Spark job's
``build_dictionaries`` implements the same rule in Spark SQL and ``common/tests/test_criteo_engine.py`` checks that
both give byte-identical output): per column, values seen at least ``max(frequency_limit, 1)`` times get ids
``FIRST_FREQUENT_ID, FIRST_FREQUENT_ID + 1, ...`` by decreasing count, ties by value in UTF-8 byte order; id
``MISSING_ID`` (0) is a missing value, ``RARE_ID`` (1) a value seen fewer times or never.

    counts = merge_counts([pl.DataFrame({"value": ["a", "b", "a"], "count": [1, 1, 1]})])
    dictionary = build_dictionary(counts, frequency_limit=2)    # value "a" -> id 2
    ids = DictionaryLookup(dictionary).ids(pl.Series(["a", "b", "zz"]))   # [2, 1, 1]

Saved with a prepared dataset (``save_dictionaries``; both Criteo engines and ``recsys_common.prepare_clicks``), so
that raw values met later (a served request, ``recsys_common.serving.raw_features``) map exactly as in training::

    dictionaries/<i>.parquet      value (string), count (uint64), id (int64) of categorical feature i, by id
    dictionaries/criteo.json      (Criteo datasets) the rule: frequency limit, ids, raw columns, integer transform
"""
from __future__ import annotations

import json
import os
from typing import Any, Dict, Iterable, List

import numpy as np
import polars as pl

from . import (CATEGORICAL_COLUMNS, FIRST_FREQUENT_ID, MISSING_ID, NUM_CATEGORICAL, NUM_NUMERICAL, NUMERICAL_COLUMNS,
               RARE_ID)
from .layout import CriteoInputError
from ..io import atomic_write_text

DICTIONARY_DIRECTORY = "dictionaries"
CRITEO_RULE_FILE = "criteo.json"
_RULE_FORMAT = "recsys_common.criteo.dictionaries/1"
# The integer features' transform, as both engines compute it (``polars_preprocess.log_numerical``): the raw
# request path reads this text back and refuses a dataset that says something else.
NUMERICAL_TRANSFORM = "log(double(x) + 3) -> float32 -> float16 for x > -3, else 0; missing -> 0"

# Polars' hash is deterministic for a given seed within one Polars version; it is only used inside one process.
_HASH_SEED = 0x5EED


def merge_counts(frames: Iterable[pl.DataFrame]) -> pl.DataFrame:
    """Sum ``value, count`` frames (one column's counts from several chunks or files) into one ``value, count``."""
    frames = [f for f in frames if f.height]
    if not frames:
        return pl.DataFrame({"value": [], "count": []}, schema={"value": pl.Utf8, "count": pl.UInt64})
    return (pl.concat([f.select(pl.col("value").cast(pl.Utf8), pl.col("count").cast(pl.UInt64)) for f in frames])
            .group_by("value").agg(pl.col("count").sum()))


def build_dictionary(counts: pl.DataFrame, frequency_limit: int) -> pl.DataFrame:
    """``value, count`` -> ``value, count, id`` of the frequent values, ids by decreasing count, ties by value."""
    frequent = counts.filter(pl.col("count") >= max(int(frequency_limit), 1))
    # Polars sorts strings by their UTF-8 bytes, as Spark orders a string column.
    frequent = frequent.sort(["count", "value"], descending=[True, False])
    return frequent.with_columns(pl.int_range(FIRST_FREQUENT_ID, FIRST_FREQUENT_ID + frequent.height,
                                              dtype=pl.Int64).alias("id"))


class DictionaryLookup:
    """value -> id for one column's dictionary, exact, in time proportional to the values looked up.

    A hash join against a dictionary of millions of values costs time proportional to the dictionary on every call;
    this sorts the dictionary's value hashes once, then each lookup is a binary search per value followed by a
    string comparison with the candidate (so a hash collision can never give a wrong id; colliding values are
    resolved by a small join).
    """

    def __init__(self, dictionary: pl.DataFrame):
        hashes = dictionary["value"].hash(_HASH_SEED).to_numpy()
        order = np.argsort(hashes, kind="stable")
        self._hashes = hashes[order]
        self._values = dictionary["value"].gather(order)
        self._ids = dictionary["id"].to_numpy()[order].astype(np.int64)
        self._dictionary = dictionary.select("value", "id")
        self.size = dictionary.height

    def ids(self, values: pl.Series) -> np.ndarray:
        """Ids (int64) of ``values`` (no nulls): the dictionary's id, or ``RARE_ID`` for a value not in it."""
        out = np.full(len(values), RARE_ID, dtype=np.int64)
        if not len(values) or not self.size:
            return out
        h = values.hash(_HASH_SEED).to_numpy()
        pos = np.searchsorted(self._hashes, h)
        pos_clipped = np.minimum(pos, self.size - 1)
        candidate = self._hashes[pos_clipped] == h
        if not candidate.any():
            return out
        index = np.flatnonzero(candidate)
        same = (self._values.gather(pos_clipped[index]) == values.gather(index)).to_numpy()
        out[index[same]] = self._ids[pos_clipped[index[same]]]
        unresolved = index[~same]
        if len(unresolved):
            # A hash shared by several dictionary values (or by a value not in the dictionary): exact join.
            frame = pl.DataFrame({"value": values.gather(unresolved), "_i": unresolved})
            joined = frame.join(self._dictionary, on="value", how="inner")
            out[joined["_i"].to_numpy()] = joined["id"].to_numpy()
        return out


def dictionary_path(dataset: str, index: int) -> str:
    """``dataset/dictionaries/<index>.parquet``: categorical feature ``index``'s value -> id table."""
    return os.path.join(dataset, DICTIONARY_DIRECTORY, f"{int(index)}.parquet")


def save_dictionary(dictionary: pl.DataFrame, path: str) -> None:
    """One dictionary (``value, count, id``, any integer types) as ``value`` Utf8, ``count`` UInt64, ``id`` Int64,
    rows by id: the one layout every engine writes, so two engines' files compare equal as tables."""
    frame = dictionary.select(pl.col("value").cast(pl.Utf8), pl.col("count").cast(pl.UInt64),
                              pl.col("id").cast(pl.Int64)).sort("id")
    frame.write_parquet(path)


def criteo_rule(frequency_limit: int, dictionary_source: str) -> Dict[str, Any]:
    """What ``dictionaries/criteo.json`` says: everything besides the tables that maps a raw Criteo row to ids.
    Both engines write exactly this (no engine name, no time), so their files are equal."""
    return {
        "format": _RULE_FORMAT,
        "frequency_limit": int(frequency_limit), "dictionary_source": dictionary_source,
        "ids": {"missing": MISSING_ID, "rare_or_unseen": RARE_ID, "first_frequent": FIRST_FREQUENT_ID},
        "numerical": {"raw_columns": [f"I{i + 1}" for i in range(NUM_NUMERICAL)], "features": NUMERICAL_COLUMNS,
                      "transform": NUMERICAL_TRANSFORM},
        "categorical": {"raw_columns": [f"C{i + 1}" for i in range(NUM_CATEGORICAL)], "features": CATEGORICAL_COLUMNS,
                        "files": [f"{i}.parquet" for i in range(NUM_CATEGORICAL)]},
    }


def save_criteo_rule(directory: str, frequency_limit: int, dictionary_source: str) -> None:
    """``directory/criteo.json`` (``directory`` is a dataset's ``dictionaries/``), written atomically."""
    atomic_write_text(os.path.join(directory, CRITEO_RULE_FILE),
                      json.dumps(criteo_rule(frequency_limit, dictionary_source), indent=1) + "\n")


def load_criteo_rule(dataset: str) -> Dict[str, Any]:
    """A Criteo dataset's ``dictionaries/criteo.json``, checked: a clear error naming the file when it is missing
    (a dataset written before the engines saved their dictionaries) or describes another rule."""
    path = os.path.join(dataset, DICTIONARY_DIRECTORY, CRITEO_RULE_FILE)
    try:
        with open(path, encoding="utf-8") as f:
            rule = json.load(f)
    except FileNotFoundError:
        raise CriteoInputError(f"{path}: not found; {dataset} has no saved dictionaries (prepare it again with "
                                    f"recsys_common.criteo.polars_preprocess, or spark_preprocess + "
                                    f"to_split_binary, of this version)") from None
    except (OSError, ValueError) as e:
        raise CriteoInputError(f"{path}: cannot read: {e}") from None
    expected = criteo_rule(rule.get("frequency_limit", 0) if isinstance(rule, dict) else 0,
                           rule.get("dictionary_source", "") if isinstance(rule, dict) else "")
    if rule != expected:
        raise CriteoInputError(f"{path}: not the rule this version maps raw values with ({_RULE_FORMAT}, "
                                    f"transform {NUMERICAL_TRANSFORM!r}); prepare the dataset again")
    return rule


def load_dictionaries(dataset: str, count: int) -> List[pl.DataFrame]:
    """The ``count`` saved dictionaries of ``dataset`` (``value, count, id``), each checked to number its values
    ``FIRST_FREQUENT_ID, ...`` densely (a file that does not is refused, naming it)."""
    out = []
    for i in range(count):
        path = dictionary_path(dataset, i)
        try:
            frame = pl.read_parquet(path, columns=["value", "id"])
        except (OSError, pl.exceptions.PolarsError) as e:
            raise CriteoInputError(f"{path}: cannot read dictionary {i}: {e}") from None
        ids = frame["id"].to_numpy()
        if not np.array_equal(ids, np.arange(FIRST_FREQUENT_ID, FIRST_FREQUENT_ID + len(ids))) \
                or frame["value"].null_count() or frame["value"].n_unique() != frame.height:
            raise CriteoInputError(f"{path}: not a dictionary (ids must be {FIRST_FREQUENT_ID}, "
                                        f"{FIRST_FREQUENT_ID + 1}, ... in order; values distinct, none missing)")
        out.append(frame)
    return out
