"""Generate headerless CSV files for a FeatureSpec whose chunks are CSV (the first step of bring-your-own data).

    python -m dlrm.scripts.gen_csv --feature_spec_in tests/transcoding/small_csv.yaml --output /tmp/csv --size 1000
    python -m dlrm.scripts.transcode --input /tmp/csv --output /tmp/binary      # -> split binary for training

A thin wrapper over ``recsys_common.synthetic`` (it writes each mapping in the spec's own chunk types). ``--size`` rows
go to the ``train`` mapping, ``--size // 10`` (at least 1) to every other one. Flags as NVIDIA's script.
"""
from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m dlrm.scripts.gen_csv", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--feature_spec_in", required=True, help="FeatureSpec YAML with csv chunks")
    p.add_argument("--output", default="/data", help="output directory (the spec is copied there)")
    p.add_argument("--size", type=int, default=1000, help="rows of the train mapping")
    p.add_argument("--seed", type=int, default=12345)
    p.add_argument("--overwrite", action="store_true",
                   help="write into a non-empty --output, replacing this script's own earlier CSVs there (other files "
                        "are kept; a name taken by another file is refused)")
    return p


def main(argv: Optional[Sequence[str]] = None):
    from recsys_common.feature_spec import FeatureSpec
    from recsys_common.synthetic import generate_dataset
    args = build_parser().parse_args(argv)
    spec = FeatureSpec.from_yaml(args.feature_spec_in, allow_auto=True)
    for mapping, chunks in spec.source_spec.items():
        for chunk in chunks:
            if chunk["type"] != "csv":
                raise ValueError(f"{args.feature_spec_in}: source_spec.{mapping} has a {chunk['type']!r} chunk; "
                                 f"gen_csv writes csv chunks only")
    generating = spec.copy()
    for meta in generating.feature_spec.values():  # 'auto' cardinality: generate ids from a small range
        if meta.get("cardinality") == "auto":
            meta["cardinality"] = 1000
    rows = {m: (args.size if m == "train" else max(1, args.size // 10)) for m in spec.source_spec}
    # Saved next to the CSVs: the input spec with its 'auto' cardinalities (transcode computes them).
    out = generate_dataset(generating, args.output, rows, seed=args.seed, overwrite=args.overwrite, saved_spec=spec,
                           tool="dlrm.scripts.gen_csv")
    print(f"wrote {sum(rows.values())} rows of CSV under {args.output}")
    return out


if __name__ == "__main__":
    try:
        main()
    except (ValueError, FileExistsError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
