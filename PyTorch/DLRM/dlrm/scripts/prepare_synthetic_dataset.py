"""Write a synthetic Criteo-shaped dataset (split binary + feature_spec.yaml) to train on without Criteo.

    python -m dlrm.scripts.prepare_synthetic_dataset --synthetic_dataset_dir /tmp/dlrm_synthetic_data \\
        --synthetic_dataset_num_entries 1048576 --synthetic_dataset_table_sizes 100000,100000,...

A thin wrapper over ``recsys_common.synthetic`` (the one implementation): power-law ids, labels from a hidden
logistic model, so a trained DLRM reaches an AUC well above 0.5 on the test mapping. Flags as NVIDIA's script.
"""
from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m dlrm.scripts.prepare_synthetic_dataset", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--synthetic_dataset_num_entries", type=int, default=2 ** 15 * 1024,
                   help="rows of the train mapping (default 33554432)")
    p.add_argument("--synthetic_dataset_test_entries", type=int, default=None,
                   help="rows of the test mapping (default: num_entries // 8)")
    p.add_argument("--num_numerical_features", type=int, default=13)
    p.add_argument("--synthetic_dataset_table_sizes", default=",".join(["100000"] * 26),
                   help="comma-separated cardinalities, one per categorical feature (default 26 x 100000)")
    p.add_argument("--feature_spec", default=None,
                   help="FeatureSpec YAML to generate instead of the Criteo-shaped default (its formats are kept)")
    p.add_argument("--synthetic_dataset_dir", default="/tmp/dlrm_synthetic_data")
    p.add_argument("--seed", type=int, default=12345)
    p.add_argument("--overwrite", action="store_true",
                   help="write into a non-empty --synthetic_dataset_dir, replacing this script's own earlier dataset "
                        "there (other files are kept; a name taken by another file is refused)")
    return p


def main(argv: Optional[Sequence[str]] = None):
    from recsys_common.feature_spec import FeatureSpec
    from recsys_common.synthetic import generate_dataset, summarize
    args = build_parser().parse_args(argv)
    if args.feature_spec:
        spec = FeatureSpec.from_yaml(args.feature_spec)
    else:
        sizes = [int(s) for s in args.synthetic_dataset_table_sizes.split(",") if s.strip()]
        spec = FeatureSpec.get_default_feature_spec(args.num_numerical_features, sizes)
    out_dir = args.synthetic_dataset_dir
    test_rows = args.synthetic_dataset_test_entries or max(1, args.synthetic_dataset_num_entries // 8)
    rows = {m: (args.synthetic_dataset_num_entries if m == "train" else test_rows) for m in spec.source_spec}
    # A non-empty directory is refused before generating; feature_spec.yaml is moved in last (crash-safe overwrite).
    out = generate_dataset(spec, out_dir, rows, seed=args.seed, overwrite=args.overwrite,
                           tool="dlrm.scripts.prepare_synthetic_dataset")
    print(summarize(out))
    return out


if __name__ == "__main__":
    try:
        main()
    except (ValueError, FileExistsError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
