"""Checkpoint -> Triton model repository: the command (NVIDIA's ``triton/export_model.py`` runs this file) over
:mod:`wide_deep.serving`.

    python deployment/deploy.py --checkpoint-dir /tmp/wide_deep_quickstart/model \\
        --dataset_path /tmp/wide_deep_quickstart/data --embedding_sizes_file /tmp/wide_deep_quickstart/embedding_sizes.json \\
        --deep_hidden_units 32 32 --model-repository /tmp/wd_repo

writes ``<repo>/widedeep-onnx/`` and ``<repo>/widedeep-savedmodel/`` (``--model movielens``: ``movielens-onnx``,
``movielens-savedmodel``); what they hold, the serving inputs and the checks are :mod:`wide_deep.serving`'s
docstring. Also ``python -m deployment.deploy`` from the recipe directory.
"""
from __future__ import annotations

import argparse
import sys
from typing import Dict, Optional, Sequence

from recsys_common.cli import InputError, exit_status
from recsys_common.io import OutputDirectoryError, check_output_directory
from recsys_common.serving.raw_ensemble import add_raw_ensembles, add_raw_features_argument
from recsys_common.serving.triton_options import add_backend_argument, add_batching_delay_arguments
from wide_deep.serving import FORMATS, MOVIELENS, export_repository, model_from_args, model_parser


def build_parser() -> argparse.ArgumentParser:
    p = model_parser("triton/export_model.py", __doc__)
    t = p.add_argument_group("Triton model repository")
    t.add_argument("--model-repository", required=True, help="output directory (Triton's --model-repository)")
    t.add_argument("--model-name", default=None,
                   help="model name prefix: <name>-onnx, <name>-savedmodel (default widedeep / movielens)")
    t.add_argument("--model-version", type=int, default=1, help="version directory")
    t.add_argument("--output-types", nargs="+", choices=sorted(FORMATS), default=["onnx", "tf-savedmodel"],
                   help="formats to export (NVIDIA's mnemonics)")
    t.add_argument("--max-batch-size", type=int, default=131072, help="Triton max_batch_size")
    t.add_argument("--batching", choices=["dynamic", "disabled"], default="dynamic", help="Triton dynamic batching")
    # --max-queue-delay-us (NVIDIA's W&D), --dynamic-batching-delay-us, or NVIDIA's PyTorch --triton-dyn-batching-delay
    # in ms: one value in microseconds (recsys_common.serving.triton_options); 0 = batch without waiting
    add_batching_delay_arguments(t, default_us=0)
    t.add_argument("--preferred-batch-sizes", type=int, nargs="*", default=None, help="dynamic batcher preference")
    t.add_argument("--engine-count-per-device", type=int, default=1, help="model instances (instance_group count)")
    t.add_argument("--device-kind", choices=["cpu", "gpu"], default="cpu", help="instance_group kind")
    t.add_argument("--onnx-opset", type=int, default=13, help="ONNX opset (NVIDIA's --onnx-opsets 13)")
    t.add_argument("--overwrite", action="store_true",
                   help="replace this tool's earlier models in a non-empty repository (other files are kept)")
    add_backend_argument(t)
    add_raw_features_argument(t)   # --model movielens: the ETL's output directory (its workflow/)
    return p


def export(argv: Optional[Sequence[str]] = None) -> Dict[str, str]:
    """Export; returns ``{format: model directory}``. Raises ``InputError`` (flags), ``OutputDirectoryError``,
    ``FileNotFoundError`` or ``ValueError`` (a checkpoint that does not match the flags)."""
    args = build_parser().parse_args(argv)
    for flag in ("max_batch_size", "engine_count_per_device", "model_version"):
        if getattr(args, flag) < 1:
            raise InputError(f"--{flag.replace('_', '-')} must be at least 1, got {getattr(args, flag)}")
    check_output_directory(args.model_repository, args.overwrite)  # refuse before the (slow) model load
    model, config, spec = model_from_args(args)
    written = export_repository(
        model, config, spec, args.model_repository, recipe=args.model,
        model_name=args.model_name or ("movielens" if args.model == MOVIELENS else "widedeep"),
        formats=args.output_types, version=args.model_version, max_batch_size=args.max_batch_size,
        dynamic_batching=args.batching == "dynamic" and args.dynamic_batching_delay_us is not None,
        max_queue_delay_us=args.dynamic_batching_delay_us or 0,
        preferred_batch_sizes=args.preferred_batch_sizes, instance_count=args.engine_count_per_device,
        instance_kind="KIND_GPU" if args.device_kind == "gpu" else "KIND_CPU", opset=args.onnx_opset,
        overwrite=args.overwrite, backend=args.triton_backend)
    for fmt, path in written.items():
        print(f"[export_model] {fmt}: {path}")
    for name in add_raw_ensembles(list(written.values()), args.raw_features_from):
        print(f"[export_model] raw-request ensemble: {name}")
    return written


def main(argv: Optional[Sequence[str]] = None) -> int:
    """The command line's exit status (recsys_common.cli): 0, or 2 with one ``error:`` line (bad flags, a
    checkpoint that does not match them, an existing repository)."""
    return exit_status(export, argv, prog="export_model.py",
                       input_errors=(OutputDirectoryError, FileNotFoundError, ValueError))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
