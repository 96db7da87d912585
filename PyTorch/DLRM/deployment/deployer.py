"""``python -m deployment.deployer``: NVIDIA's command name for :mod:`deployment.deploy` (checkpoint -> Triton model
repository). ``build_parser``, ``deploy`` and ``main`` are re-exported for callers of the old module."""
import sys

from deployment.deploy import build_parser, deploy, main  # noqa: F401

if __name__ == "__main__":
    sys.exit(main())
