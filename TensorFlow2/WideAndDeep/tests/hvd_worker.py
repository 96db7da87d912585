"""One rank of tests/test_horovod.py: ``python hvd_worker.py OUT_DIR main.py-flags...``.

Runs ``wide_deep.train.main`` and then writes this rank's trained weights to ``OUT_DIR/weights_<rank>.npz``
(the model instance is captured when ``main`` builds it), so the test can compare ranks.
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(HERE), os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(HERE))), "common")]
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import numpy as np  # noqa: E402

from wide_deep.model import network as model_module  # noqa: E402
from wide_deep import train as run  # noqa: E402

built = []
_original_init = model_module.WideDeepModel.__init__


def _capturing_init(self, *args, **kwargs):
    _original_init(self, *args, **kwargs)
    built.append(self)


model_module.WideDeepModel.__init__ = _capturing_init

if __name__ == "__main__":
    out_dir = sys.argv[1]
    status = run.command(sys.argv[2:])
    rank = int(os.environ.get("HOROVOD_RANK", "0"))
    if status == 0:
        weights = {v.name: v.numpy() for v in built[0].variables}
        np.savez(os.path.join(out_dir, f"weights_{rank}.npz"), **weights)
    sys.exit(status)
