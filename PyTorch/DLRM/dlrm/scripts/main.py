"""``python -m dlrm.scripts.main``: NVIDIA's command name for :mod:`dlrm.train` (flags and configuration:
:mod:`dlrm.cli`). ``main`` is re-exported for callers of the old module."""
import sys

from dlrm.train import command_line, main  # noqa: F401

if __name__ == "__main__":
    sys.exit(command_line())
