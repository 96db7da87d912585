"""Facts about the machine that benchmarks record next to their figures."""
from __future__ import annotations

import platform


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
