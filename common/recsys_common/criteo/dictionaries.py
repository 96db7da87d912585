"""Frequency dictionaries of categorical values, as every Criteo path here builds them, and a fast exact lookup.

The id rule (one place, shared by the single-machine engine and the raw click-log tools; the Spark job's
``build_dictionaries`` implements the same rule in Spark SQL and ``common/tests/test_criteo_engine.py`` checks that
both give byte-identical output): per column, values seen at least ``max(frequency_limit, 1)`` times get ids
``FIRST_FREQUENT_ID, FIRST_FREQUENT_ID + 1, ...`` by decreasing count, ties by value in UTF-8 byte order; id
``MISSING_ID`` (0) is a missing value, ``RARE_ID`` (1) a value seen fewer times or never.

    counts = merge_counts([pl.DataFrame({"value": ["a", "b", "a"], "count": [1, 1, 1]})])
    dictionary = build_dictionary(counts, frequency_limit=2)    # value "a" -> id 2
    ids = DictionaryLookup(dictionary).ids(pl.Series(["a", "b", "zz"]))   # [2, 1, 1]
"""
from __future__ import annotations

from typing import Iterable

import numpy as np
import polars as pl

from . import FIRST_FREQUENT_ID, RARE_ID

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
