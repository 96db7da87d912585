"""Checkpoint -> Triton model repository (the seed's ``deployment/deploy.py``), for DLRM and DCNv2.

    python -m deployment.deploy --checkpoint-dir /tmp/dlrm_dcnv2_quickstart/dlrm_checkpoint \\
        --model-repository-path /tmp/dlrm_repo [--layout monolithic|ensemble|both] [--overwrite]

What it writes (``--model-name`` defaults to the checkpoint's model, ``dlrm`` or ``dcnv2``)::

    --layout monolithic (default): the whole model, once per --formats entry
        <repo>/<name>-onnx/        config.pbtxt (platform onnxruntime_onnx),       1/model.onnx
        <repo>/<name>-savedmodel/  config.pbtxt (platform tensorflow_savedmodel),  1/model.savedmodel/
    --layout ensemble: the seed's two-model ensemble for models larger than one GPU
        <repo>/<name>-sparse/      the embedding lookups   (cat_<t> -> embeddings), --sparse-format
        <repo>/<name>-dense/       MLPs + interaction/cross (numerical, embeddings -> probability), --dense-format
        <repo>/<name>/             platform "ensemble": sparse then dense, the monolithic model's inputs and output
    --layout both: all of the above
    --triton-backend python: the same models as the CPU repository, each run by Triton's Python backend
        (config.pbtxt backend "python", 1/model.py beside the model file; the ensemble stays Triton's own), what
        ``python -m recsys_common.serving.triton_server`` serves on a machine without NVIDIA's container

Every model directory also gets ``recsys_serving.json`` (inputs with their dims and id ranges, the checkpoint, the
feature spec when ``--dataset_path`` is given, ``negative_downsampling_rate``). Inputs and output: see
:mod:`dlrm_dcnv2.serving`. A model trained on negatives down-sampled to rate ``w`` (the feature spec's recorded rate,
or ``--negative_downsampling_rate``, which overrides it) serves ``sigmoid(logit + log w)``, the full data's
probability; the correction is in the monolithic and the dense graphs.

The checkpoint describes its model (``state.json``); ``--dataset_path``/``--feature_spec`` are checked against it
(a feature with more ids than its table, another hotness or number of numerical features is a clear error).
The repository is written atomically (``recsys_common.serving.repository``): an existing non-empty one is refused
unless ``--overwrite``, which replaces only what this tool wrote there.

NVIDIA's seed serves the sparse half with Merlin HPS (``--sparse-format hps``: GPU embedding cache in front of a
CPU/SSD parameter server) and the dense half with TensorRT (``--dense-format trt``); neither exists on these
machines, so both are refused here with that reason; the TensorFlow SavedModel sparse model is what the HPS model
would replace (same inputs and ``embeddings`` output), and the ONNX dense model is what TensorRT would compile.
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Any, Dict, Optional, Sequence

# DeployError is this command's bad-input error (defined with the library it checks for)
from dlrm_dcnv2.serving import FORMATS, LAYOUTS, DeployError, check_downsampling_rate, write_repository
from recsys_common.cli import exit_status
from recsys_common.serving.raw_ensemble import add_raw_ensembles, add_raw_features_argument
from recsys_common.serving.triton_options import add_backend_argument, add_batching_delay_arguments

UNAVAILABLE_FORMATS = {
    "hps": "Merlin HPS (the seed's sparse backend) needs NVIDIA's HugeCTR/HPS Triton backend, which is not on PyPI "
           "and cannot run on these CPU machines; use --sparse-format tf-savedmodel (what HPS would replace) or onnx",
    "trt": "TensorRT needs an NVIDIA GPU and the TensorRT runtime; use --dense-format onnx (Triton can compile it "
           "with its TensorRT execution accelerator) or tf-savedmodel",
}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m deployment.deploy", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint-dir", required=True,
                   help="checkpoint of dlrm.py / dcnv2.py: one step_<N> directory, or a --save_checkpoint_path "
                        "directory (its newest step_<N>)")
    p.add_argument("--model-repository-path", required=True, help="Triton model repository to write")
    p.add_argument("--model-name", default=None,
                   help="model name (the ensemble's; monolithic models get -onnx / -savedmodel appended); default: "
                        "the checkpoint's model, dlrm or dcnv2")
    p.add_argument("--sparse-model-name", default=None, help="ensemble member of the lookups (default <name>-sparse)")
    p.add_argument("--dense-model-name", default=None, help="ensemble member of the MLPs (default <name>-dense)")
    p.add_argument("--model-version", type=int, default=1, help="version directory of every model")
    p.add_argument("--layout", choices=LAYOUTS, default="monolithic",
                   help="monolithic models, the sparse/dense ensemble, or both")
    p.add_argument("--monolithic", action="store_const", const="monolithic", dest="layout",
                   help="the seed's flag: same as --layout monolithic")
    p.add_argument("--formats", default="onnx,tf-savedmodel",
                   help="comma-separated formats of the monolithic model: onnx, tf-savedmodel")
    p.add_argument("--sparse-format", default="tf-savedmodel", choices=FORMATS + ("hps",),
                   help="format of the ensemble's sparse model (hps: not available here, see the module docstring)")
    p.add_argument("--dense-format", default="onnx", choices=FORMATS + ("trt",),
                   help="format of the ensemble's dense model (trt: not available here)")
    p.add_argument("--max-batch-size", type=int, default=32768, help="Triton max_batch_size of every model")
    # --dynamic-batching-delay-us (the seed's), --max-queue-delay-us, or NVIDIA's PyTorch --triton-dyn-batching-delay
    # in ms: one value in microseconds (recsys_common.serving.triton_options; default: no dynamic batcher)
    add_batching_delay_arguments(p)
    p.add_argument("--engine-count-per-device", type=int, default=1,
                   help="model instances per device (Triton instance_group count)")
    p.add_argument("--cpu", action="store_true",
                   help="instances on the CPU (KIND_CPU); default KIND_GPU as the seed's Triton deployment")
    p.add_argument("--onnx-opset", type=int, default=17, help="ONNX opset of the tf2onnx conversion")
    p.add_argument("--dataset_path", default=None,
                   help="dataset whose feature spec is checked against the checkpoint and recorded in the sidecar")
    p.add_argument("--feature_spec", default="feature_spec.yaml", help="feature spec file relative to --dataset_path")
    p.add_argument("--negative_downsampling_rate", type=float, default=None,
                   help="w in (0, 1]: the training data kept each negative with probability w (as "
                        "recsys_common.prepare_clicks'); the served probability is sigmoid(logit + log w), the full "
                        "data's. Default: the rate recorded in --dataset_path's feature spec (1.0 without one)")
    add_raw_features_argument(p)
    p.add_argument("--overwrite", action="store_true",
                   help="replace an existing repository's models written by this tool (other files are kept)")
    add_backend_argument(p)
    return p


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    args = build_parser().parse_args(list(argv) if argv is not None else None)
    args.format_list = [f.strip() for f in args.formats.split(",") if f.strip()]
    bad = [f for f in args.format_list if f not in FORMATS]
    if bad or not args.format_list:
        raise DeployError(f"--formats {args.formats!r}: expected a comma-separated list of {', '.join(FORMATS)}")
    for flag, value in (("--sparse-format", args.sparse_format), ("--dense-format", args.dense_format)):
        if value in UNAVAILABLE_FORMATS and args.layout != "monolithic":
            raise DeployError(f"{flag} {value}: {UNAVAILABLE_FORMATS[value]}")
    for flag, value, low in (("--max-batch-size", args.max_batch_size, 1), ("--model-version", args.model_version, 1),
                             ("--engine-count-per-device", args.engine_count_per_device, 1)):
        if value is not None and value < low:
            raise DeployError(f"{flag} must be at least {low}, got {value}")
    check_downsampling_rate(args.negative_downsampling_rate)
    return args


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    """Parse ``argv`` and write the repository; returns ``dlrm_dcnv2.serving.write_repository``'s result."""
    args = parse_args(argv)
    result = write_repository(args.checkpoint_dir, args.model_repository_path, model_name=args.model_name,
                              sparse_model_name=args.sparse_model_name, dense_model_name=args.dense_model_name,
                              version=args.model_version, layout=args.layout, formats=args.format_list,
                              sparse_format=args.sparse_format, dense_format=args.dense_format,
                              max_batch_size=args.max_batch_size,
                              dynamic_batching_delay_us=args.dynamic_batching_delay_us,
                              instance_count=args.engine_count_per_device, cpu=args.cpu, opset=args.onnx_opset,
                              dataset_path=args.dataset_path, feature_spec=args.feature_spec,
                              overwrite=args.overwrite, negative_downsampling_rate=args.negative_downsampling_rate,
                              backend=args.triton_backend)
    result["raw_models"] = add_raw_ensembles([os.path.join(args.model_repository_path, m) for m in result["models"]],
                                             args.raw_features_from)
    return result


def cli(argv: Optional[Sequence[str]] = None) -> int:
    """Command line: prints the models written; a clear one-line error and exit status 1 (2 for flags)."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")

    def report(result: Dict[str, Any]) -> None:
        for model, platform in result["models"].items():
            print(f"deployed {model} ({platform}) in {result['repository']}")
        rate = result["negative_downsampling_rate"]
        print(f"negative down-sampling rate {rate:g}: " + (f"served probability = sigmoid(logit + log {rate:g})"
                                                          if rate < 1.0 else "no correction"))
    return exit_status(main, argv, failures=(ValueError, OSError), with_type=True, report=report)


if __name__ == "__main__":
    sys.exit(cli())
