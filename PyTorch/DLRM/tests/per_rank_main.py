"""Run ``python -m dlrm.scripts.main`` with ``{rank}`` in the arguments replaced by this process's RANK (a test
helper: under torchrun, ``--save_checkpoint_path DIR/node{rank}`` gives each process a directory of its own, as
node-local disks would on a multi-node job)."""
import os
import sys

from dlrm.train import command_line

if __name__ == "__main__":
    rank = os.environ.get("RANK", "0")
    sys.argv = [sys.argv[0]] + [a.replace("{rank}", rank) for a in sys.argv[1:]]
    sys.exit(command_line())
