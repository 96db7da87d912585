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
