"""Click probabilities for a user's rows from a checkpoint, without a server: ``python predict.py -h``
(see :mod:`wide_deep.serving.predict`)."""
import sys

from wide_deep.serving.predict import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
