"""Facts about the machine that benchmarks record next to their figures, and a free loopback port."""
from __future__ import annotations

import platform
import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that is free right now (the OS picks it; servers and tests bind ports at runtime
    because others run torchrun and servers beside them)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def cpu_model_name() -> str:
    """``lscpu``'s "Model name", read from /proc/cpuinfo; ``platform.processor()`` (or the architecture) elsewhere."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def cpu_bf16_instructions(cpuinfo: str = "/proc/cpuinfo") -> str:
    """Which bfloat16 instructions run this CPU's bf16 GEMMs, from /proc/cpuinfo's flags: ``"amx"`` (AMX-BF16
    tiles), ``"avx512_bf16"`` (AVX512-BF16 dot products) or ``"none"`` (bf16 is then converted to float32 around
    every product, which is usually slower than float32 itself); ``"unknown"`` where /proc/cpuinfo cannot be read."""
    try:
        with open(cpuinfo) as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    return "amx" if "amx_bf16" in flags else "avx512_bf16" if "avx512_bf16" in flags else "none"
    except OSError:
        pass
    return "unknown"
