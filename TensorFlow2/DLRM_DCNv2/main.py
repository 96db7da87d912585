"""Shared entry point: ``python main.py --model dlrm|dcnv2 [flags]`` (same as ``python dlrm.py`` / ``dcnv2.py``).

NVIDIA's ``main.py`` alone lacks the model flags; here ``--model`` picks them (and their defaults).
"""
import os
import sys

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")  # Keras 2 (tf-keras): Horovod's TF integration needs it
HERE = os.path.dirname(os.path.abspath(__file__))
for path in (HERE, os.path.join(HERE, "..", "..", "common")):
    if os.path.isdir(path) and path not in sys.path:
        sys.path.insert(0, path)

from dlrm_dcnv2.main import MODELS, cli  # noqa: E402


def split_model(argv):
    """``(model, remaining argv)`` from ``--model X`` / ``--model=X``; model None when absent."""
    argv = list(argv)
    for i, arg in enumerate(argv):
        if arg == "--model" and i + 1 < len(argv):
            return argv[i + 1], argv[:i] + argv[i + 2:]
        if arg.startswith("--model="):
            return arg.split("=", 1)[1], argv[:i] + argv[i + 1:]
    return None, argv


if __name__ == "__main__":
    model, rest = split_model(sys.argv[1:])
    if model not in MODELS:
        print(f"error: main.py needs --model {{{','.join(MODELS)}}} (got {model!r}); or run dlrm.py / dcnv2.py, "
              f"which set the model and its defaults", file=sys.stderr)
        sys.exit(2)
    sys.exit(cli(rest, model=model))
