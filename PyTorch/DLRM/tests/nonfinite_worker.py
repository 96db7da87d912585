"""torchrun worker of tests/test_distributed_failures.py: the training loop's NaN guard (``NonFiniteLoss``) on 2 ranks.

    torchrun --nproc_per_node=2 tests/nonfinite_worker.py OUT_DIR

Only rank 1's loss is NaN, at step 2 of 4. Each rank runs the CPU guard (checked every step) and the CUDA one
(recorded on the device, checked at step 3 and at the end) and writes to OUT_DIR/rank<R>.json the step at which
each stopped it and the message: both ranks must stop at the same step, or the one going on would wait forever in
its next collective.
"""
import json
import os
import sys

import torch
import torch.distributed as dist

from dlrm.train import NonFiniteLoss
from recsys_common.torch_distributed import shutdown_process_group


def run_guard(per_step: bool, rank: int):
    guard = NonFiniteLoss(torch.device("cpu"), per_step=per_step)
    for step in range(1, 5):
        try:
            guard.record(torch.tensor(float("nan") if rank == 1 and step == 2 else 0.5), step)
            if not per_step and step == 3:
                guard.check()
        except FloatingPointError as error:
            return {"stopped_at": step, "message": str(error)}
    try:
        guard.check()
    except FloatingPointError as error:
        return {"stopped_at": "end", "message": str(error)}
    return {"stopped_at": None, "message": ""}


if __name__ == "__main__":
    dist.init_process_group("gloo")
    try:
        rank = dist.get_rank()
        result = {"per_step": run_guard(True, rank), "deferred": run_guard(False, rank)}
        with open(os.path.join(sys.argv[1], f"rank{rank}.json"), "w") as f:
            json.dump(result, f)
    finally:
        shutdown_process_group(barrier=sys.exc_info()[1] is None)
