"""Transcoding: headerless CSV + a FeatureSpec -> parquet or NVIDIA's split_binary, with the completed spec.

The role of NVIDIA's ``transcode.py`` (the bring-your-own-data path). The input spec describes CSV chunks (files
relative to ``--input``); categorical features may say ``cardinality: auto``, which becomes ``max(value) + 1`` over
all mappings. The output spec (``--feature_spec_out``, written last) describes the new files:

split_binary (the DLRM recipes' format, NVIDIA's layout and constraints):
    ``<mapping>/numerical.bin`` float16, all features of the ``numerical`` channel(s) in channel order;
    ``<mapping>/label.bin`` bool (float32 if labels are not 0/1);
    ``<mapping>/<feature>.bin`` one per categorical, smallest of int8/int16/int32 holding the cardinality;
    any other feature its own ``<mapping>/<feature>.bin`` in its dtype.
parquet:
    ``<mapping>/part_0.parquet`` with one column per feature, dtypes as in the spec.

    python -m recsys_common.transcode --input raw/ --feature_spec_in spec.yaml --output data/ --format split_binary
"""
from __future__ import annotations

import argparse
import os
import re
import sys
from typing import Dict, Iterable, List, Optional

import numpy as np

from .datasets import DatasetError, DatasetWriter, read_columns
from .feature_spec import AUTO, FeatureSpec, FeatureSpecError, is_categorical_channel, smallest_int_dtype
from .io import atomic_directory, check_output_directory

FORMATS = ("split_binary", "parquet")


def _file_stem(name: str) -> str:
    stem = name[:-4] if name.endswith(".bin") else name
    return re.sub(r"[^A-Za-z0-9_.-]", "_", stem)


def _roles(spec: FeatureSpec):
    label = [f for ch, fs in spec.channel_spec.items() if "label" in ch.lower() for f in fs]
    categorical = [f for ch, fs in spec.channel_spec.items() if is_categorical_channel(ch) for f in fs]
    categorical += [f for f, m in spec.feature_spec.items() if "cardinality" in m and f not in categorical]
    numerical = [f for ch, fs in spec.channel_spec.items()
                 if not is_categorical_channel(ch) and "label" not in ch.lower() for f in fs if f not in categorical]
    other = [f for f in spec.feature_spec if f not in set(label + categorical + numerical)]
    return label, categorical, numerical, other


def completed_spec(spec_in: FeatureSpec, columns: Dict[str, Dict[str, np.ndarray]], fmt: str,
                   output_dir: str) -> FeatureSpec:
    """The output spec: cardinalities filled in, dtypes and source_spec for ``fmt``."""
    label, categorical, numerical, other = _roles(spec_in)
    out = spec_in.copy()
    out.base_directory = os.path.abspath(output_dir)
    for f in categorical:
        meta = out.feature_spec[f]
        observed = [int(c[f].max()) for c in columns.values() if f in c and c[f].size]
        lowest = [int(c[f].min()) for c in columns.values() if f in c and c[f].size]
        if lowest and min(lowest) < 0:
            raise DatasetError(f"{spec_in.origin}: categorical feature {f!r} has negative value {min(lowest)}; "
                               f"categorical values must be integers in [0, cardinality)")
        if meta.get("cardinality") == AUTO:
            meta["cardinality"] = (max(observed) + 1) if observed else 1
        if fmt == "split_binary":
            meta["dtype"] = smallest_int_dtype(int(meta["cardinality"]))
    labels_binary = all(np.isin(c[f], (0, 1)).all() for c in columns.values() for f in label if f in c)
    if fmt == "split_binary":
        for f in numerical:
            out.feature_spec[f]["dtype"] = "float16"
        for f in label:
            out.feature_spec[f]["dtype"] = "bool" if labels_binary else "float32"
    for f, meta in out.feature_spec.items():
        # An input spec without dtypes (NVIDIA's hand-written BYO specs): the output spec states the dtypes written.
        if meta.get("dtype") is None:
            meta["dtype"] = str(out.numpy_dtype(f))
    source_spec = {}
    for mapping in spec_in.source_spec:
        stored = set(spec_in.features_of_mapping(mapping))
        if fmt == "parquet":
            feats = [f for f in spec_in.feature_spec if f in stored]
            source_spec[mapping] = [{"type": "parquet", "features": feats, "files": [f"{mapping}/part_0.parquet"]}]
            continue
        chunks = []
        nums = [f for f in numerical if f in stored]
        if nums:
            chunks.append({"type": "split_binary", "features": nums, "files": [f"{mapping}/numerical.bin"]})
        for f in label:
            if f in stored:
                name = "label.bin" if len(label) == 1 else f"{_file_stem(f)}.bin"
                chunks.append({"type": "split_binary", "features": [f], "files": [f"{mapping}/{name}"]})
        for f in categorical + other:
            if f in stored:
                chunks.append({"type": "split_binary", "features": [f], "files": [f"{mapping}/{_file_stem(f)}.bin"]})
        source_spec[mapping] = chunks
    out.source_spec = source_spec
    return out


def transcode(input_dir: str, spec_in_path: str, output_dir: str, fmt: str = "split_binary",
              spec_out_name: str = "feature_spec.yaml", chunk_size: int = 65536,
              overwrite: bool = False) -> FeatureSpec:
    """Convert every mapping; the completed spec appears last, over a complete set of files.

    ``output_dir`` may hold other files (even the input): a non-empty one is refused unless ``overwrite``, which
    replaces only this tool's earlier outputs there (``recsys_common.io.atomic_directory``).
    """
    if fmt not in FORMATS:
        raise ValueError(f"unknown output format {fmt!r} (choose from {', '.join(FORMATS)})")
    spec_in = FeatureSpec.from_yaml(spec_in_path, allow_auto=True)
    spec_in.base_directory = os.path.abspath(input_dir)
    spec_in.validate(check_files=True, allow_auto=True)
    for mapping, chunks in spec_in.source_spec.items():
        for i, chunk in enumerate(chunks):
            if chunk["type"] != "csv":
                raise FeatureSpecError(f"{spec_in_path}: source_spec.{mapping}[{i}].type is {chunk['type']!r}; "
                                       f"transcode reads csv chunks")
    # Read with cardinality checks off: 'auto' cardinalities are computed from these very values.
    reading = spec_in.copy()
    for meta in reading.feature_spec.values():
        if meta.get("cardinality") == AUTO:
            meta["cardinality"] = np.iinfo(np.int64).max
    check_output_directory(output_dir, overwrite)   # before reading the input, which may be long
    columns = {m: read_columns(reading, m, check_values=False) for m in spec_in.source_spec}
    with atomic_directory(output_dir, overwrite=overwrite, tool="recsys_common.transcode",
                          marker=os.path.normpath(spec_out_name)) as tmp_dir:
        out = completed_spec(spec_in, columns, fmt, tmp_dir)
        for mapping, cols in columns.items():
            n = len(next(iter(cols.values()))) if cols else 0
            with DatasetWriter(out, mapping) as writer:
                for start in range(0, max(n, 1), chunk_size):
                    writer.write({f: v[start:start + chunk_size] for f, v in cols.items()})
        out.to_yaml(os.path.join(tmp_dir, spec_out_name))
    out.base_directory = os.path.abspath(output_dir)
    out.origin = os.path.join(out.base_directory, spec_out_name)
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m recsys_common.transcode",
        description="Convert headerless CSV files described by a FeatureSpec into parquet or split_binary, "
                    "computing 'cardinality: auto' and writing the completed FeatureSpec.")
    p.add_argument("--input", required=True, help="directory the input spec's CSV file paths are relative to")
    p.add_argument("--feature_spec_in", default="feature_spec.yaml",
                   help="input FeatureSpec YAML; a relative name is looked up in --input (default feature_spec.yaml)")
    p.add_argument("--output", required=True,
                   help="output dataset directory: new or empty unless --overwrite (other files there are kept)")
    p.add_argument("--feature_spec_out", default="feature_spec.yaml",
                   help="name of the completed spec written in --output (default feature_spec.yaml)")
    p.add_argument("--format", choices=FORMATS, default="split_binary", help="output format (default split_binary)")
    p.add_argument("--chunk_size", type=int, default=65536, help="rows written per block (default 65536)")
    p.add_argument("--overwrite", action="store_true",
                   help="write into a non-empty --output, replacing this tool's own earlier outputs there (other "
                        "files, such as the input, are kept; a name taken by another file is refused)")
    return p


def main(argv: Optional[Iterable[str]] = None) -> FeatureSpec:
    args = build_parser().parse_args(None if argv is None else list(argv))
    spec_path = args.feature_spec_in
    if not os.path.isabs(spec_path) and not os.path.exists(spec_path):
        spec_path = os.path.join(args.input, spec_path)
    out = transcode(args.input, spec_path, args.output, args.format, args.feature_spec_out, args.chunk_size,
                    args.overwrite)
    cards = {f: m["cardinality"] for f, m in out.feature_spec.items() if "cardinality" in m}
    print(f"wrote {out.origin} ({args.format}); cardinalities: {cards}")
    return out


def run_cli(argv: Optional[Iterable[str]] = None) -> None:
    """``main`` for a command line: bad input prints one clear line and exits 1 instead of a traceback."""
    try:
        main(argv)
    except (FeatureSpecError, DatasetError, FileExistsError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    run_cli()
