"""`python triton/evaluate_latency.py -h`: see :mod:`wide_deep.serving.latency`."""
import sys

from wide_deep.serving.latency import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
