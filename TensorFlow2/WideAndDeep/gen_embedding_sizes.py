"""Embedding widths for every categorical feature of a FeatureSpec, as the JSON ``main.py`` reads
(``--embedding_sizes_file``): ``{"feature": width, ...}``.

    python gen_embedding_sizes.py --feature_spec_in /tmp/wd_data/feature_spec.yaml --output /tmp/wd_data/emb.json

NVIDIA's flags (``--feature_spec_in --output --max_size``). The width of a feature of cardinality ``c`` is
``min(max_size, ceil(6 * c ** 0.25))`` (the fourth-root rule of thumb of the Wide & Deep literature), at least 1.
The file is written atomically (``recsys_common.io.atomic_write_text``).
"""
from __future__ import annotations

import argparse
import json
import math
from typing import Dict, Optional, Sequence

from recsys_common.cli import run_main
from recsys_common.dataset_tools import INPUT_ERRORS
from recsys_common.feature_spec import FeatureSpec
from recsys_common.io import atomic_write_text

CATEGORICAL_CHANNELS = ("onehot_categorical", "multihot_categorical")


def embedding_width(cardinality: int, max_size: int) -> int:
    """``min(max_size, ceil(6 * cardinality ** 0.25))``, at least 1."""
    return max(1, min(max_size, math.ceil(6 * cardinality ** 0.25)))


def embedding_sizes(spec, max_size: int) -> Dict[str, int]:
    """``{feature: width}`` for the features of the spec's categorical channels, in channel order; ``{}`` for a spec
    with numerical features only (NVIDIA's writes ``{}`` too: the model is then a linear part and an MLP over the
    numericals)."""
    names = [n for ch in CATEGORICAL_CHANNELS for n in spec.channel_spec.get(ch, [])]
    return {n: embedding_width(spec.cardinality(n), max_size) for n in names}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python gen_embedding_sizes.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--feature_spec_in", required=True, help="FeatureSpec YAML with numeric cardinalities")
    p.add_argument("--output", required=True, help="JSON file to write")
    p.add_argument("--max_size", type=int, default=256, help="largest embedding width")
    return p


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, int]:
    """Writes ``--output``; returns the sizes."""
    args = build_parser().parse_args(None if argv is None else list(argv))
    if args.max_size < 1:
        raise ValueError(f"--max_size must be >= 1, got {args.max_size}")
    sizes = embedding_sizes(FeatureSpec.from_yaml(args.feature_spec_in), args.max_size)
    atomic_write_text(args.output, json.dumps(sizes, indent=2) + "\n")
    print(f"wrote {args.output}: {len(sizes)} embedding sizes")
    return sizes


if __name__ == "__main__":
    run_main(main, input_errors=INPUT_ERRORS)
