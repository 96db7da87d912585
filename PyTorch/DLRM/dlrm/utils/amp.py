"""Mixed precision as NVIDIA's recipe runs it: autocast, and (float16 only) a static loss scaler (:class:`Amp`)."""
from __future__ import annotations

from typing import Optional

import torch

from recsys_common.machine import cpu_bf16_instructions


def cpu_runs_bfloat16_natively(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """True when the CPU has bfloat16 arithmetic instructions: AVX512-BF16 or AMX-BF16 (Linux CPU flags).

    torch 2.13 reports only the vector width (``torch.backends.cpu.get_cpu_capability()`` says ``AVX512`` with or
    without BF16), so the kernel's flag list is read; where it cannot be read the answer is False (float32).
    """
    return cpu_bf16_instructions(cpuinfo) in ("amx", "avx512_bf16")


class Amp:
    """Autocast and (float16 only) a static loss scaler, as NVIDIA's recipe: scale 8192, never grown."""

    def __init__(self, enabled: bool, device, amp_dtype: Optional[str], loss_scale: float):
        self.enabled = enabled
        self.device_type = device.type
        if amp_dtype is None:  # NVIDIA's float16 on CUDA; a CPU runs bfloat16 natively (AVX512-BF16, AMX), not float16
            amp_dtype = "float16" if device.type == "cuda" else "bfloat16"
        self.dtype = torch.float16 if amp_dtype == "float16" else torch.bfloat16
        self.scaler = None
        if enabled and self.dtype == torch.float16:
            # torch.amp.GradScaler(device) is torch >= 2.3 (a CPU scaler too); older 2.x have torch.cuda.amp's only.
            scaler_class = getattr(torch.amp, "GradScaler", None)
            if scaler_class is not None:
                self.scaler = scaler_class(device.type, init_scale=loss_scale, growth_interval=1_000_000_000)
            elif device.type == "cuda":
                self.scaler = torch.cuda.amp.GradScaler(init_scale=loss_scale, growth_interval=1_000_000_000)
            else:
                raise ValueError(f"--amp_dtype float16 on a CPU needs torch >= 2.3 (a CPU loss scaler); this is "
                                 f"torch {torch.__version__}: use --amp_dtype bfloat16")

    def autocast(self):
        # cache_enabled=False: required when parts of the step are captured in CUDA graphs, harmless otherwise.
        return torch.autocast(self.device_type, dtype=self.dtype, enabled=self.enabled, cache_enabled=False)

    @property
    def dtype_name(self) -> str:
        return str(self.dtype).replace("torch.", "") if self.enabled else "float32"
