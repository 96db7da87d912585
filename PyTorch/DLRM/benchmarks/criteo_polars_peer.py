#!/usr/bin/env python3
"""The plain Polars Criteo preprocessing a user would write first: the peer ``benchmarks/preprocess.py`` measures
the recipe's engine (``recsys_common.criteo.polars_preprocess``) against (engine ``peer``, its default script).

One file, one pass of obvious Polars: read Kaggle's ``train.txt`` (tab-separated, no header) whole into memory,
count every categorical value, keep those seen at least ``--frequency_limit`` times (ids 2, 3, ... by decreasing
count, ties by value; rarer values 1, missing 0), ``log(x + 3)`` of the integers (missing or ``x <= -3``: 0), cut
Kaggle's split (the last seventh of the lines held out: its first half ``test``, the rest ``validation``) and write
NVIDIA's split-binary layout with its ``feature_spec.yaml``. No resume, no bounded memory, no checks of malformed
rows, train rows in input order: the same bytes as ``polars_preprocess --train_ordering input`` on clean input.

    python benchmarks/criteo_polars_peer.py --input train.txt --output /tmp/criteo_peer --frequency_limit 15
"""
import argparse
import os

import numpy as np
import polars as pl

from recsys_common.feature_spec import FeatureSpec, smallest_int_dtype

INTS, CATS = [f"i{k}" for k in range(1, 14)], [f"c{k}" for k in range(1, 27)]


def main():
    parser = argparse.ArgumentParser(description="plain Polars Criteo Kaggle preprocessing (the benchmark's peer)")
    parser.add_argument("--input", required=True, help="Kaggle train.txt")
    parser.add_argument("--output", required=True, help="split-binary dataset directory")
    parser.add_argument("--frequency_limit", type=int, default=15)
    args = parser.parse_args()

    schema = {"label": pl.Int8, **{c: pl.Int64 for c in INTS}, **{c: pl.Utf8 for c in CATS}}
    df = pl.read_csv(args.input, separator="\t", has_header=False, new_columns=list(schema),
                     schema_overrides=schema, quote_char=None)
    numerical = [pl.when(pl.col(c) > -3).then((pl.col(c) + 3).cast(pl.Float64).log()).otherwise(0.0)
                 .fill_null(0.0).cast(pl.Float32).cast(pl.Float16).alias(c) for c in INTS]
    categorical, cardinalities = [], []
    for c in CATS:
        counts = df[c].value_counts(name="count").drop_nulls().filter(pl.col("count") >= args.frequency_limit)
        ids = counts.sort(["count", c], descending=[True, False]).with_row_index("id", offset=2).drop("count")
        dtype = getattr(pl, smallest_int_dtype(ids.height + 2).capitalize())
        cardinalities.append(ids.height + 2)
        mapped = df.select(c).join(ids, on=c, how="left", maintain_order="left")
        categorical.append(mapped.select(pl.when(pl.col(c).is_null()).then(0).otherwise(pl.col("id").fill_null(1))
                                         .cast(dtype).alias(c)).to_series())
    out = df.select(pl.col("label").cast(pl.Boolean), pl.concat_arr(numerical).alias("numerical"))
    out = out.with_columns(categorical)

    held = out.height // 7
    train, test_rows = out.height - held, (held + 1) // 2
    splits = {"train": (0, train), "test": (train, test_rows), "validation": (train + test_rows, held - test_rows)}
    for split, (start, length) in splits.items():
        part = out.slice(start, length)
        os.makedirs(os.path.join(args.output, split), exist_ok=True)
        part["label"].to_numpy().tofile(os.path.join(args.output, split, "label.bin"))
        part["numerical"].to_numpy().tofile(os.path.join(args.output, split, "numerical.bin"))
        for i, c in enumerate(CATS):
            part[c].to_numpy().tofile(os.path.join(args.output, split, f"cat_{i}.bin"))
    FeatureSpec.get_default_feature_spec(len(INTS), cardinalities, mappings=list(splits)).to_yaml(
        os.path.join(args.output, "feature_spec.yaml"))


if __name__ == "__main__":
    main()
