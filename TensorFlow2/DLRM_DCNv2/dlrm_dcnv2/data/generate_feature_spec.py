"""Write the FeatureSpec of a synthetic dataset with the real Criteo 1TB table sizes (NVIDIA's three model sizes).

    python -m dlrm_dcnv2.dataloading.generate_feature_spec --variant criteo_t15_synthetic --dst /data/t15/feature_spec.yaml

``--variant``: ``criteo_t15_synthetic`` (frequency limit 15, 4.2 B parameters at dim 128, "small"),
``criteo_t3_synthetic`` (22.8 B, "large"), ``criteo_t0_synthetic`` (113 B, "extra large"); the cardinalities are in
``recsys_common.criteo.variants``. The spec has NVIDIA's split-binary layout (13 numerical, 26 categorical features,
``train`` and ``test`` mappings). Use it for speed runs on the real shapes without the data:
``dlrm.py --dataset_type synthetic --synthetic_dataset_use_feature_spec --feature_spec <dst>``, or to generate files
with ``prepare_synthetic_dataset --feature_spec <dst>``.

``--dst``: the YAML file to write (default ``feature_spec.yaml``), or an existing directory to write
``feature_spec.yaml`` into. An existing file is replaced only with ``--overwrite``; the write is atomic.
"""
from __future__ import annotations

import argparse
import os
from typing import NoReturn, Optional, Sequence

from recsys_common.cli import run_main
from recsys_common.criteo.variants import VARIANTS, variant_feature_spec
from recsys_common.dataset_tools import INPUT_ERRORS

TOOL = "dlrm_dcnv2.dataloading.generate_feature_spec"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"python -m {TOOL}", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variant", choices=VARIANTS, required=True, help="which model size")
    p.add_argument("--dst", default="feature_spec.yaml", help="output YAML file, or a directory to write it in")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --dst file")
    return p


def main(argv: Optional[Sequence[str]] = None):
    """Returns the FeatureSpec written (its ``origin`` is the file)."""
    args = build_parser().parse_args(None if argv is None else list(argv))
    dst = os.path.join(args.dst, "feature_spec.yaml") if os.path.isdir(args.dst) else args.dst
    if os.path.lexists(dst) and not args.overwrite:
        raise FileExistsError(f"{dst}: exists; pass --overwrite to replace it")
    parent = os.path.dirname(os.path.abspath(dst))
    if not os.path.isdir(parent):
        raise ValueError(f"--dst {args.dst}: directory {parent} does not exist")
    spec = variant_feature_spec(args.variant)
    spec.base_directory, spec.origin = parent, os.path.abspath(dst)
    spec.to_yaml(dst)
    total = sum(spec.cardinality(f) for f in spec.channel_spec["categorical"])
    print(f"wrote {dst}: {args.variant}, {len(spec.channel_spec['categorical'])} tables, {total:,} embedding rows")
    return spec


def command() -> NoReturn:
    """The command line (exit 2 for bad input)."""
    run_main(main, input_errors=INPUT_ERRORS)


if __name__ == "__main__":
    command()
