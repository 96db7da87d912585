"""Wide & Deep on Outbrain: ``python main.py --dataset_path DIR [flags]`` (``-h`` lists them), or under
``horovodrun -np N sh hvd_wrapper.sh python main.py ...``."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(1, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                "common"))
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

from wide_deep.trainer.run import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
