"""How an exporter configures its models in a Triton repository: one options object and one flag group.

Every exporter (PyTorch DLRM and NCF through ``torch_export``, TensorFlow2 DLRM_DCNv2 ``deploy.py``, Wide & Deep
``triton/export_model.py``) takes the same settings; :class:`TritonOptions` holds them, checked once. The dynamic
batching delay is held in ONE unit, microseconds (Triton's ``max_queue_delay_microseconds``), whatever flag gave it:

    flag                              unit  meaning of 0 / negative                      where users know it from
    --triton-dyn-batching-delay MS    ms    0 or -1: no dynamic batcher (NVIDIA's "off")  NVIDIA's PyTorch deployer
    --dynamic-batching-delay-us US    us    0: dynamic batcher, no wait; < 0 refused     NVIDIA's TF2 DLRM deploy.py
    --max-queue-delay-us US           us    alias of --dynamic-batching-delay-us         Triton's config field

``dynamic_batching_delay_us`` is ``None`` when the dynamic batcher is off. With it on, the preferred batch sizes are
half and all of ``max_batch_size`` (NVIDIA's deployer). This module imports no framework (TF2 and PyTorch tools share
it; the PyTorch recipes run on GPU machines without TensorFlow).

    >>> p = argparse.ArgumentParser()
    >>> _ = add_triton_arguments(p, default_model_name="dlrm")
    >>> triton_options(p.parse_args(["--triton-dyn-batching-delay", "0.5"])).dynamic_batching_delay_us
    500
"""
from __future__ import annotations

import argparse
import dataclasses
from typing import List, Optional

from recsys_common.cli import InputError

MICROSECONDS_PER_MILLISECOND = 1000
INSTANCE_KINDS = ("KIND_CPU", "KIND_GPU")
#: How the models run in Triton: "native" (each format on its platform's backend: onnxruntime, libtorch, TensorFlow;
#: NVIDIA's containers) or "python" (Triton's Python backend running the same file on the CPU: ``python_backend``).
BACKENDS = ("native", "python")


class TritonOptionsError(InputError):
    """A Triton setting that no model repository can have; the message names the flag."""


def delay_us_from_ms(delay_ms: float) -> Optional[int]:
    """NVIDIA's ``--triton-dyn-batching-delay`` (milliseconds; 0 and -1 turn the dynamic batcher off) as microseconds,
    ``None`` for off. Other negative values are refused.

    >>> delay_us_from_ms(0.5), delay_us_from_ms(0), delay_us_from_ms(-1)
    (500, None, None)
    """
    if delay_ms in (0, -1):
        return None
    if delay_ms < 0:
        raise TritonOptionsError(f"--triton-dyn-batching-delay must be > 0 ms, or 0 / -1 for no dynamic batching; "
                                 f"got {delay_ms}")
    return int(round(delay_ms * MICROSECONDS_PER_MILLISECOND))


def check_delay_us(delay_us: Optional[int], flag: str = "--dynamic-batching-delay-us") -> Optional[int]:
    """``delay_us`` (microseconds, ``None``: off) if valid; ``TritonOptionsError`` naming ``flag`` if negative."""
    if delay_us is None:
        return None
    if int(delay_us) != delay_us or delay_us < 0:
        raise TritonOptionsError(f"{flag} must be a whole number of microseconds >= 0, got {delay_us}")
    return int(delay_us)


@dataclasses.dataclass(frozen=True)
class TritonOptions:
    """The Triton settings of an export, checked when built (``TritonOptionsError`` names the flag).

    Attributes:
        model_name: the model name, or the prefix of the per-format names (``<name>-onnx``, ``<name>-ts``).
        version: the version directory (>= 1).
        max_batch_size: ``max_batch_size`` of every model (> 0: rows per request, the batch dimension implicit).
        dynamic_batching_delay_us: Triton's ``max_queue_delay_microseconds``; ``None``: no dynamic batcher.
        instance_count: ``instance_group`` count (model copies per device).
        instance_kind: ``KIND_CPU`` or ``KIND_GPU``.
        repository: the model repository directory to write.
        overwrite: replace this tool's earlier models in a non-empty ``repository`` (other files stay).
        backend: "native" or "python" (``BACKENDS``; python: the CPU repository, every instance ``KIND_CPU``).
    """
    model_name: str
    version: int = 1
    max_batch_size: int = 65536
    dynamic_batching_delay_us: Optional[int] = None
    instance_count: int = 1
    instance_kind: str = "KIND_CPU"
    repository: str = "./triton_models"
    overwrite: bool = False
    backend: str = "native"

    def __post_init__(self):
        if not self.model_name:
            raise TritonOptionsError("--triton-model-name must not be empty")
        for flag, value in (("--triton-model-version", self.version), ("--triton-max-batch-size", self.max_batch_size),
                            ("--triton-engine-count", self.instance_count)):
            if isinstance(value, bool) or int(value) != value or value < 1:
                raise TritonOptionsError(f"{flag} must be an integer >= 1, got {value}")
        check_delay_us(self.dynamic_batching_delay_us)
        if self.instance_kind not in INSTANCE_KINDS:
            raise TritonOptionsError(f"instance kind {self.instance_kind!r} is not one of {INSTANCE_KINDS}")
        if self.backend not in BACKENDS:
            raise TritonOptionsError(f"--triton-backend must be one of {BACKENDS}, got {self.backend!r}")

    @property
    def preferred_batch_sizes(self) -> Optional[List[int]]:
        """With the dynamic batcher: half-full and full batches (NVIDIA's deployer); ``None`` without it."""
        if self.dynamic_batching_delay_us is None:
            return None
        return sorted({max(1, self.max_batch_size // 2), self.max_batch_size})


class _DelayMilliseconds(argparse.Action):
    """``--triton-dyn-batching-delay MS`` stored as microseconds (``None``: off) in ``dynamic_batching_delay_us``."""

    def __call__(self, parser, namespace, values, option_string=None):
        try:
            setattr(namespace, self.dest, delay_us_from_ms(float(values)))
        except (TritonOptionsError, ValueError) as err:
            parser.error(f"{option_string}: {err}")


class _DelayMicroseconds(argparse.Action):
    """``--dynamic-batching-delay-us US`` / ``--max-queue-delay-us US``: microseconds, 0 = batcher without a wait."""

    def __call__(self, parser, namespace, values, option_string=None):
        try:
            setattr(namespace, self.dest, check_delay_us(int(values), option_string))
        except (TritonOptionsError, ValueError) as err:
            parser.error(f"{option_string}: {err}")


def add_batching_delay_arguments(parser, *, default_us: Optional[int] = None) -> None:
    """The dynamic batching delay in each spelling users know (table above), all into ``dynamic_batching_delay_us``
    (microseconds; ``None``: off). ``default_us``: the tool's default (``None``: no dynamic batcher)."""
    default_text = "no dynamic batching" if default_us is None else f"{default_us} us"
    parser.add_argument("--triton-dyn-batching-delay", dest="dynamic_batching_delay_us", action=_DelayMilliseconds,
                        metavar="MS", default=default_us,
                        help=f"dynamic batching queue delay in MILLIseconds (NVIDIA's flag); 0 or -1: no dynamic "
                             f"batching (default: {default_text})")
    parser.add_argument("--dynamic-batching-delay-us", "--max-queue-delay-us", dest="dynamic_batching_delay_us",
                        action=_DelayMicroseconds, metavar="US", default=default_us,
                        help="the same delay in MICROseconds (Triton's max_queue_delay_microseconds); 0: dynamic "
                             "batching without waiting")


def add_backend_argument(parser) -> None:
    """``--triton-backend native|python`` into ``triton_backend`` (see ``BACKENDS``)."""
    parser.add_argument("--triton-backend", choices=BACKENDS, default="native",
                        help="native: each model on its format's Triton backend (onnxruntime, libtorch, TensorFlow; "
                             "NVIDIA's containers); python: the CPU repository, the same files run by Triton's "
                             "Python backend (what `python -m recsys_common.serving.triton_server` serves)")


def add_triton_arguments(parser, *, default_model_name: str, default_max_batch_size: int = 65536,
                         max_batch_size_help: str = "max_batch_size in config.pbtxt (rows per request)"):
    """NVIDIA's ``--triton-*`` group of the PyTorch deployers (``--triton-model-name``, ``--triton-model-version``,
    ``--triton-max-batch-size``, the batching delay, ``--triton-engine-count``, ``--save-dir``, ``--deploy_cpu``,
    ``--overwrite``, ``--triton-backend``); :func:`triton_options` builds the options object from the parsed flags.
    Returns the group."""
    triton = parser.add_argument_group("triton related flags (NVIDIA's names)")
    triton.add_argument("--triton-model-name", default=default_model_name,
                        help="model name prefix: <name>-onnx and <name>-ts")
    triton.add_argument("--triton-model-version", type=int, default=1, help="version directory")
    triton.add_argument("--triton-max-batch-size", type=int, default=default_max_batch_size, help=max_batch_size_help)
    add_batching_delay_arguments(triton)
    triton.add_argument("--triton-engine-count", type=int, default=1, help="instance_group count")
    triton.add_argument("--save-dir", "--model-repository", dest="save_dir", default="./triton_models",
                        help="the Triton model repository to write")
    triton.add_argument("--deploy_cpu", action="store_true",
                        help="instance_group kind KIND_CPU (default KIND_GPU, as NVIDIA's deployer)")
    triton.add_argument("--overwrite", action="store_true",
                        help="replace this tool's earlier models in a non-empty --save-dir (other files stay)")
    add_backend_argument(triton)
    return triton


def triton_options(args: argparse.Namespace) -> TritonOptions:
    """The :class:`TritonOptions` of flags added by :func:`add_triton_arguments` (``TritonOptionsError`` names the
    flag)."""
    return TritonOptions(model_name=args.triton_model_name, version=args.triton_model_version,
                         max_batch_size=args.triton_max_batch_size,
                         dynamic_batching_delay_us=args.dynamic_batching_delay_us,
                         instance_count=args.triton_engine_count,
                         instance_kind="KIND_CPU" if args.deploy_cpu else "KIND_GPU",
                         repository=args.save_dir, overwrite=args.overwrite, backend=args.triton_backend)
