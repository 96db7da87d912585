"""`python triton/evaluate_latency.py -h`: see :mod:`wide_deep.serving.latency` (run from TensorFlow2/WideAndDeep, or anywhere)."""
import os
import sys

RECIPE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [RECIPE, os.path.join(os.path.dirname(os.path.dirname(RECIPE)), "common")]
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

from wide_deep.serving.latency import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
