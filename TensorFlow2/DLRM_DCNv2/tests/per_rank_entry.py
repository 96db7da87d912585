"""Run dlrm.py / dcnv2.py with ``{rank}`` in the arguments replaced by this Horovod rank (a test helper).

``horovodrun -np 2 python tests/per_rank_entry.py dlrm --dataset_path DIR/rank_{rank} ...`` gives each rank a
dataset directory of its own, in which the test has made the categorical files of the other ranks' tables
unreadable as data: the run only matches the one-rank run if each rank reads nothing but its own tables' files.
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
RECIPE = os.path.dirname(HERE)
for path in (RECIPE, os.path.join(RECIPE, "..", "..", "common")):
    if path not in sys.path:
        sys.path.insert(0, path)
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

from dlrm_dcnv2.train import cli  # noqa: E402

if __name__ == "__main__":
    rank = os.environ.get("HOROVOD_RANK", "0")
    model, argv = sys.argv[1], [a.replace("{rank}", rank) for a in sys.argv[2:]]
    sys.exit(cli(argv, model=model))
