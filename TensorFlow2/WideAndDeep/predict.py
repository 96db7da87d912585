"""Click probabilities for a user's rows from a checkpoint, without a server: ``python predict.py -h``
(see :mod:`wide_deep.serving.predict`)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(1, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                "common"))
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

from wide_deep.serving.predict import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
