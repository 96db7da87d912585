"""Wide & Deep on Outbrain: ``python main.py --dataset_path DIR [flags]`` (``-h`` lists them), or under
``horovodrun -np N sh hvd_wrapper.sh python main.py ...`` (see :mod:`wide_deep.train`)."""
import sys

from wide_deep.train import command

if __name__ == "__main__":
    sys.exit(command(sys.argv[1:]))
