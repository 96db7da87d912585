"""`python triton/export_model.py -h`: see :mod:`wide_deep.serving.export`."""
import sys

from wide_deep.serving.export import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
