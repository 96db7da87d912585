"""`python triton/evaluate_accuracy.py -h`: see :mod:`wide_deep.serving.accuracy`."""
import sys

from wide_deep.serving.accuracy import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
