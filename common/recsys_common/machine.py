"""Facts about the machine that benchmarks record next to their figures, and a free loopback port."""
from __future__ import annotations

import platform
import socket
import sys
from typing import Optional

# glibc's mallopt parameter numbers (malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_MMAP_MAX = -1, -3, -4


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


def glibc_malloc_options(*, mmap_max: Optional[int] = None, mmap_threshold: Optional[int] = None,
                         trim_threshold: Optional[int] = None) -> bool:
    """Set glibc's allocator options for this process (``mallopt``), where the recipes measured that fresh pages
    cost more than kept ones; returns whether every option given was accepted (False off Linux/glibc: musl and
    others have no ``mallopt``). The options are those of ``MALLOC_MMAP_MAX_``, ``MALLOC_MMAP_THRESHOLD_`` and
    ``MALLOC_TRIM_THRESHOLD_``, which must be set before a process starts; this sets them from inside it.

    Args:
        mmap_max: most blocks served by ``mmap`` (0: every block from the heap).
        mmap_threshold: blocks at least this large are ``mmap``'d (glibc allows up to 32 MiB).
        trim_threshold: free heap top kept before it is handed back (-1: never trimmed).
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes
        libc = ctypes.CDLL("libc.so.6")
        options = [(_M_MMAP_MAX, mmap_max), (_M_MMAP_THRESHOLD, mmap_threshold), (_M_TRIM_THRESHOLD, trim_threshold)]
        return all(bool(libc.mallopt(option, value)) for option, value in options if value is not None)
    except (OSError, AttributeError):
        return False
