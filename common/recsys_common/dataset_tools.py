"""NVIDIA's dataset helper commands, once for every recipe that ships them (PyTorch/DLRM, TensorFlow2/DLRM_DCNv2).

Each recipe exposes them under its own module name with NVIDIA's flags (``dlrm.scripts.gen_csv``,
``dlrm_dcnv2.dataloading.gen_csv``, ...) through a few lines that call the functions here:

- ``gen_csv``: headerless CSV files for a FeatureSpec whose chunks are CSV (the first step of bring-your-own data;
  ``recsys_common.transcode`` then converts them to split binary). ``--size`` rows go to the ``train`` mapping,
  ``--size // 10`` (at least 1) to every other one; ``cardinality: auto`` features get ids below 1000 and keep
  ``auto`` in the spec saved next to the CSVs (transcode computes it). Any mix of features: one-hot, numerical, and
  multi-hot (``max_hotness`` in the spec, or a ``multihot`` channel), whose values are written as a list in one cell
  the way NVIDIA's W&D ``gen_csv.py`` writes them (``"[12, 5, 7]"``; 1 to ``max_hotness`` ids per row).
- ``prepare_synthetic_dataset``: a Criteo-shaped split-binary dataset (or one in the formats of ``--feature_spec``)
  with power-law ids and labels from a hidden logistic model (``recsys_common.synthetic``), so a trained model
  reaches an AUC well above 0.5 on the test mapping.

``tool`` names the module a user ran: it is the program name in ``--help`` and the owner recorded in the output
directory (``recsys_common.io.atomic_directory``: ``--overwrite`` replaces only that tool's earlier outputs).
"""
from __future__ import annotations

import argparse
from typing import Dict, Optional, Sequence

from .feature_spec import FeatureSpec
from .synthetic import generate_dataset, summarize

AUTO_CARDINALITY_FOR_GENERATION = 1000   # ids of 'cardinality: auto' features are drawn from [0, 1000)


def _overwrite_flag(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("--overwrite", action="store_true",
                        help=f"write into a non-empty {what}, replacing this tool's own earlier outputs there (other "
                             f"files are kept; a name taken by another file is refused)")


# --------------------------------------------------------------------------------------------------------- gen_csv
def gen_csv_parser(tool: str, description: Optional[str] = None) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"python -m {tool}", description=description,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--feature_spec_in", required=True, help="FeatureSpec YAML with csv chunks")
    p.add_argument("--output", default="/data", help="output directory (the spec is copied there)")
    p.add_argument("--size", type=int, default=1000, help="rows of the train mapping")
    p.add_argument("--seed", type=int, default=12345)
    _overwrite_flag(p, "--output")
    return p


def generate_csv(feature_spec_in: str, output: str, size: int, seed: int = 12345, overwrite: bool = False,
                 tool: str = "recsys_common.dataset_tools") -> FeatureSpec:
    """Write CSV rows for every mapping of the spec at ``feature_spec_in`` under ``output``; returns the written spec.

    Raises ValueError (naming the spec and mapping) when a chunk is not CSV, FileExistsError for a non-empty
    ``output`` without ``overwrite``.
    """
    if size < 1:
        raise ValueError(f"--size must be >= 1, got {size}")
    spec = FeatureSpec.from_yaml(feature_spec_in, allow_auto=True)
    for mapping, chunks in spec.source_spec.items():
        for chunk in chunks:
            if chunk["type"] != "csv":
                raise ValueError(f"{feature_spec_in}: source_spec.{mapping} has a {chunk['type']!r} chunk; "
                                 f"gen_csv writes csv chunks only")
    generating = spec.copy()
    for meta in generating.feature_spec.values():
        if meta.get("cardinality") == "auto":
            meta["cardinality"] = AUTO_CARDINALITY_FOR_GENERATION
    rows = {m: (size if m == "train" else max(1, size // 10)) for m in spec.source_spec}
    # Saved next to the CSVs: the input spec with its 'auto' cardinalities (transcode computes them).
    out = generate_dataset(generating, output, rows, seed=seed, overwrite=overwrite, saved_spec=spec, tool=tool)
    print(f"wrote {sum(rows.values())} rows of CSV under {output}")
    return out


def gen_csv_main(argv: Optional[Sequence[str]], tool: str, description: Optional[str] = None) -> FeatureSpec:
    args = gen_csv_parser(tool, description).parse_args(None if argv is None else list(argv))
    return generate_csv(args.feature_spec_in, args.output, args.size, args.seed, args.overwrite, tool=tool)


# ------------------------------------------------------------------------------------------- prepare_synthetic_dataset
def prepare_synthetic_parser(tool: str, description: Optional[str] = None,
                             default_dir: str = "/tmp/dlrm_synthetic_data") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"python -m {tool}", description=description,
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
    p.add_argument("--synthetic_dataset_dir", default=default_dir)
    p.add_argument("--seed", type=int, default=12345)
    _overwrite_flag(p, "--synthetic_dataset_dir")
    return p


def parse_table_sizes(text: str) -> list:
    """``"1000,20,5"`` -> ``[1000, 20, 5]``; a clear ValueError naming the flag otherwise."""
    try:
        sizes = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise ValueError(f"--synthetic_dataset_table_sizes: expected comma-separated integers, got {text!r}") from None
    if not sizes or min(sizes) < 1:
        raise ValueError(f"--synthetic_dataset_table_sizes: expected positive integers, got {text!r}")
    return sizes


def prepare_synthetic_dataset(output_dir: str, num_entries: int, test_entries: Optional[int] = None,
                              table_sizes: Sequence[int] = (100000,) * 26, num_numerical_features: int = 13,
                              feature_spec: Optional[str] = None, seed: int = 12345, overwrite: bool = False,
                              tool: str = "recsys_common.dataset_tools") -> FeatureSpec:
    """Generate the dataset (``train``: ``num_entries`` rows, every other mapping ``test_entries``, default
    ``num_entries // 8``) in ``output_dir``; returns its spec. The spec file is moved in last (crash-safe)."""
    if num_entries < 1:
        raise ValueError(f"--synthetic_dataset_num_entries must be >= 1, got {num_entries}")
    if feature_spec:
        spec = FeatureSpec.from_yaml(feature_spec)
    else:
        spec = FeatureSpec.get_default_feature_spec(num_numerical_features, list(table_sizes))
    test_rows = test_entries or max(1, num_entries // 8)
    rows: Dict[str, int] = {m: (num_entries if m == "train" else test_rows) for m in spec.source_spec}
    out = generate_dataset(spec, output_dir, rows, seed=seed, overwrite=overwrite, tool=tool)
    print(summarize(out))
    return out


# The data tools' bad input (a spec, a flag's value, a non-empty output): exit 2 through recsys_common.cli.run_main.
INPUT_ERRORS = (ValueError, FileExistsError)   # FeatureSpecError and DatasetError are ValueErrors


def prepare_synthetic_main(argv: Optional[Sequence[str]], tool: str, description: Optional[str] = None,
                           default_dir: str = "/tmp/dlrm_synthetic_data") -> FeatureSpec:
    args = prepare_synthetic_parser(tool, description, default_dir).parse_args(None if argv is None else list(argv))
    sizes = None if args.feature_spec else parse_table_sizes(args.synthetic_dataset_table_sizes)
    return prepare_synthetic_dataset(args.synthetic_dataset_dir, args.synthetic_dataset_num_entries,
                                     args.synthetic_dataset_test_entries, sizes or (), args.num_numerical_features,
                                     args.feature_spec, args.seed, args.overwrite, tool=tool)
