"""DCNV2 entry point: `python dcnv2.py --dataset_path ... [flags]` or `horovodrun -np N python dcnv2.py ...`.

The flags and their DCNV2 defaults: `python dcnv2.py --help` (the README's table is generated from the same parser).
"""
import os
import sys

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")  # Keras 2 (tf-keras): Horovod's TF integration needs it
HERE = os.path.dirname(os.path.abspath(__file__))
for path in (HERE, os.path.join(HERE, "..", "..", "common")):
    if os.path.isdir(path) and path not in sys.path:
        sys.path.insert(0, path)

from dlrm_dcnv2.main import cli  # noqa: E402

if __name__ == "__main__":
    sys.exit(cli(sys.argv[1:], model="dcnv2"))
