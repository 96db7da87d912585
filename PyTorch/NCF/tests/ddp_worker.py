"""Run ncf_train.main in a torchrun / torch.distributed.launch process and save this rank's summary as JSON.

    torchrun --nproc_per_node=2 tests/ddp_worker.py OUT_DIR <ncf.py arguments>
"""
import json
import os
import sys

sys.path[:0] = [os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]

from neumf import train as ncf_train  # noqa: E402
from recsys_common.torch_distributed import live_gloo_threads  # noqa: E402

if __name__ == "__main__":
    # torch.distributed.launch without --use_env puts --local-rank=N before our arguments: hand it to ncf.py
    launcher_args = [a for a in sys.argv[1:] if a.startswith(("--local-rank", "--local_rank"))]
    rest = [a for a in sys.argv[1:] if a not in launcher_args]
    out_dir, argv = rest[0], rest[1:] + launcher_args
    summary = ncf_train.main(argv)  # tears the process group down before returning
    rank, world_size = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    # written after the teardown, so that the test can check that no gloo thread outlived it
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump({"summary": summary, "world_size": world_size,
                   "gloo_threads_after_teardown": live_gloo_threads()}, f)
