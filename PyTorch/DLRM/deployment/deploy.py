"""DLRM checkpoint -> Triton model repository (ONNX and/or TorchScript), with NVIDIA's deployer flags.

``python -m deployment.deployer`` (NVIDIA's name for this command) runs it too.

    python -m deployment.deploy --deploy_cpu --save-dir /tmp/dlrm_triton \
        -- --model_checkpoint /tmp/dlrm_quickstart/checkpoint --dataset /tmp/dlrm_quickstart/data
    python -m deployment.deploy --onnx --triton-max-batch-size 65536 --triton-dyn-batching-delay 0.5 \
        --triton-engine-count 2 --save-dir repo -- --model_checkpoint CKPT --embedding_dim 128

Flags as NVIDIA's PyTorch DLRM ``triton/deployer.py``: ``--ts-script | --ts-trace | --onnx``, ``--triton-*``,
``--save-dir``, ``--deploy_cpu``, then (after an optional ``--``) the model's flags ``--model_checkpoint``,
``--dataset``, ``--embedding_dim``, ``--bottom_mlp_sizes``, ``--top_mlp_sizes``, ``--interaction_op``,
``--num_numerical_features``. Differences (README, "Deployment"): the format flags combine (none = ``--onnx
--ts-script``) and each format is one model ``<--triton-model-name>-onnx`` / ``-ts`` in one repository; the model
configuration is read from the checkpoint, so the model flags are optional and, when given, checked against it (a
difference is an error naming the layer or table); ``--overwrite``; the models are float32 (no ``--fp16``).

Served model: inputs ``numerical`` FP32 ``[N]`` and ``categorical`` INT64 ``[T]`` per row, output ``probability``
FP32 ``[1]`` (``sigmoid`` of the logit, plus ``log w`` for a model trained on negatives down-sampled to rate
``w``: ``--negative_downsampling_rate``, default the dataset's recorded rate); see :mod:`dlrm.serving`. The export
itself, the ``--triton-*`` flags and the format rule are ``recsys_common.serving.torch_export`` / ``triton_options``, shared with NCF's deployer; the batching
delay is also accepted in microseconds (``--dynamic-batching-delay-us``, ``--max-queue-delay-us``). After export each
written model is run on ``--check_rows`` random rows against the eager model (NVIDIA's "conversion correctness
test"): the largest absolute difference is printed (JSON) and above ``--check_tolerance`` the deployer fails.

The directory is ``deployment/``, not the seed's ``triton/``: a directory named ``triton`` on ``sys.path`` (the recipe
directory, with ``python -m``) is imported by torch as the OpenAI Triton compiler, and torch's optimizers then fail
on machines without it.
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Dict, List, Optional, Sequence

from dlrm import serving
from dlrm.checkpointing import CheckpointError
from dlrm.data import DataError, dataset_info
from recsys_common.cli import InputError, exit_status
from recsys_common.feature_spec import FeatureSpec, negative_downsampling_rate
from recsys_common.serving import torch_export
from recsys_common.serving.raw_ensemble import add_raw_ensembles, add_raw_features_argument
from recsys_common.serving.torch_export import add_format_arguments
from recsys_common.serving.triton_options import add_triton_arguments, triton_options

TOOL = "deployment.deploy"
# The owner recorded in the repository (--overwrite replaces its files): NVIDIA's command name, as before the move, so
# that --overwrite still replaces the models of repositories written then.
TOOL_PATH = "PyTorch/DLRM/deployment/deployer.py"


class DeployError(InputError):
    """Flags that cannot produce a model repository; the message names the flag."""


def _sizes(values: Optional[Sequence[str]], flag: str) -> Optional[List[int]]:
    """``["512", "256"]`` (NVIDIA's nargs form) or ``["512,256"]`` (dlrm.scripts.main's form) -> ints."""
    if values is None:
        return None
    try:
        return [int(v) for value in values for v in str(value).split(",") if v]
    except ValueError:
        raise DeployError(f"--{flag} must be integers (512 256 128 or 512,256,128), got {' '.join(values)}") from None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"python -m {TOOL}",
                                description="Export a DLRM checkpoint to a Triton model repository")
    add_format_arguments(p)
    triton = add_triton_arguments(p, default_model_name="dlrm")
    triton.add_argument("--triton-no-cuda", action="store_true",
                        help="accepted for NVIDIA's command lines; export always runs on the CPU here")
    model = p.add_argument_group("model (after an optional '--', as NVIDIA's; checked against the checkpoint)")
    model.add_argument("--model_checkpoint", "--load_checkpoint_path", dest="model_checkpoint", default=None,
                       help="checkpoint written by dlrm.scripts.main: a step_<N> directory or its "
                            "--save_checkpoint_path (the newest)")
    model.add_argument("--dataset", default=None,
                       help="dataset directory whose FeatureSpec's cardinalities must equal the table sizes; the "
                            "FeatureSpec is recorded in recsys_serving.json")
    model.add_argument("--feature_spec", default="feature_spec.yaml", help="FeatureSpec file name in --dataset")
    model.add_argument("--num_numerical_features", type=int, default=None)
    model.add_argument("--embedding_dim", type=int, default=None)
    model.add_argument("--bottom_mlp_sizes", nargs="+", default=None)
    model.add_argument("--top_mlp_sizes", nargs="+", default=None)
    model.add_argument("--interaction_op", choices=("dot", "cat"), default=None)
    model.add_argument("--negative_downsampling_rate", type=float, default=None,
                       help="w in (0, 1]: the training data kept each negative with probability w (as "
                            "recsys_common.prepare_clicks'); the served probability is sigmoid(logit + log w), the "
                            "full data's. Default: the rate recorded in --dataset's FeatureSpec (1.0 without "
                            "--dataset or record: no correction)")
    model.add_argument("--opset", type=int, default=17, help="ONNX opset")
    model.add_argument("--check_rows", type=int, default=4096,
                       help="rows of the exported-vs-eager check after export (0: skip)")
    model.add_argument("--check_tolerance", type=float, default=1e-4,
                       help="largest |exported - eager| probability accepted by that check")
    add_raw_features_argument(model)
    return p


def dataset_tables(dataset: str, feature_spec: str):
    """``(table sizes, FeatureSpec as a dict, its path)`` of ``dataset``'s FeatureSpec."""
    info = dataset_info(dataset, feature_spec)
    return info.cardinalities, info.spec.to_dict(), info.spec.origin, info.num_numerical_features


def deploy(argv: Optional[Sequence[str]] = None) -> Dict:
    """Parse ``argv``, write the repository; returns ``{"models", "max_abs_diff", "config", "checkpoint",
    "negative_downsampling_rate"}`` (the rate whose ``log`` the served logit gets, also in recsys_serving.json).
    Raises :class:`DeployError`, ``ModelMismatchError``, ``CheckpointError``, ``FileExistsError`` on bad input."""
    argv = [a for a in (sys.argv[1:] if argv is None else argv) if a != "--"]  # NVIDIA's "--" before model flags
    args = build_parser().parse_args(argv)
    formats = torch_export.selected_formats(args.onnx, args.ts_script, args.ts_trace)
    options = triton_options(args)
    if not args.model_checkpoint:
        raise DeployError("--model_checkpoint is required (a checkpoint written by dlrm.scripts.main)")
    if args.check_rows < 0:
        raise DeployError(f"--check_rows must be >= 0, got {args.check_rows}")
    expected = dict(num_numerical_features=args.num_numerical_features, embedding_dim=args.embedding_dim,
                    bottom_mlp_sizes=_sizes(args.bottom_mlp_sizes, "bottom_mlp_sizes"),
                    top_mlp_sizes=_sizes(args.top_mlp_sizes, "top_mlp_sizes"), interaction_op=args.interaction_op)
    spec_dict, rate = None, 1.0
    if args.negative_downsampling_rate is not None:   # checked before minutes of loading
        rate = serving.check_negative_downsampling_rate(args.negative_downsampling_rate)
    if args.dataset:
        sizes, spec_dict, origin, num_numerical = dataset_tables(args.dataset, args.feature_spec)
        if args.negative_downsampling_rate is None:
            rate = negative_downsampling_rate(FeatureSpec.from_dict(spec_dict, origin=origin))
        expected.update(table_sizes=sizes, table_source=f"{origin} (cardinality)")
        if expected["num_numerical_features"] is None:
            expected["num_numerical_features"] = num_numerical
    model, config, path = serving.load_model(args.model_checkpoint, **expected)
    module = serving.serving_module(model, rate)
    print(f"{TOOL}: negative down-sampling rate {rate:g}: "
          + (f"served probabilities are sigmoid(logit + log {rate:g})" if rate < 1.0 else "no correction"),
          file=sys.stderr)
    model_dirs = torch_export.write_repository(module, serving.sidecar(config, path, spec_dict, rate), formats,
                                               options, tool=TOOL_PATH, opset=args.opset)
    diffs = {}
    if args.check_rows:
        diffs = torch_export.check_exported(module, model_dirs, options.version,
                                            serving.example_inputs(config, args.check_rows, seed=1),
                                            serving.OUTPUT_NAME)
        worst = max(diffs.values())
        if worst > args.check_tolerance:
            raise DeployError(f"exported model differs from the eager model by {worst:.3g} (> --check_tolerance "
                              f"{args.check_tolerance}): {diffs}")
    raw_models = add_raw_ensembles(model_dirs, args.raw_features_from)
    return {"models": model_dirs, "raw_models": raw_models, "max_abs_diff": diffs, "config": config.to_dict(),
            "checkpoint": path, "negative_downsampling_rate": rate}


def main(argv: Optional[Sequence[str]] = None) -> int:
    """CLI: prints the result as JSON; on bad input prints ``error: ...`` and returns 2."""
    return exit_status(deploy, argv, prog=TOOL, report=lambda result: print(json.dumps(result, indent=1)),
                       input_errors=(DeployError, CheckpointError, DataError, ValueError, FileExistsError, OSError))


if __name__ == "__main__":
    sys.exit(main())
