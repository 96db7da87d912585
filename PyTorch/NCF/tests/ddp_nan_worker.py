"""torchrun worker for tests/test_safety.py: ncf_train.main where only rank 1's model starts returning NaN.

    NAN_AFTER=K torchrun --nproc_per_node=2 tests/ddp_nan_worker.py OUT_DIR <ncf.py arguments>

Rank 1's NeuMF output turns NaN after K training forwards; each rank writes its exit status, the gloo threads still
alive after ncf_train.main returned (its error exit must tear the process group down too) and its error message to
OUT_DIR/rank<R>.txt. Both ranks must stop at the same step (the loss check is all-reduced), so neither hangs.
"""
import contextlib
import io
import os
import sys

sys.path[:0] = [os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]

from neumf import train as ncf_train  # noqa: E402
import neumf  # noqa: E402
from recsys_common.cli import exit_status  # noqa: E402
from recsys_common.torch_distributed import live_gloo_threads  # noqa: E402

_forward, _calls = neumf.NeuMF.forward, []


def _forward_nan_on_rank_1(self, users, items):
    out = _forward(self, users, items)
    if self.training and os.environ.get("RANK") == "1":
        _calls.append(1)
        if len(_calls) > int(os.environ["NAN_AFTER"]):
            return out * float("nan")
    return out


if __name__ == "__main__":
    neumf.NeuMF.forward = _forward_nan_on_rank_1
    out_dir, argv = sys.argv[1], sys.argv[2:]
    err, code = io.StringIO(), 0
    with contextlib.redirect_stderr(err):
        # as `python ncf.py` runs it: exit status 2 and one "ncf.py: error:" line for a diverged loss
        code = exit_status(ncf_train.main, argv, prog="ncf.py", input_errors=ncf_train.INPUT_ERRORS)
    threads = live_gloo_threads()
    with open(os.path.join(out_dir, f"rank{os.environ['RANK']}.txt"), "w") as f:
        f.write(f"{code}\n{threads}\n{err.getvalue()}")
    sys.exit(code)
