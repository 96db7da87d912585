"""Click probabilities for a user's rows from a checkpoint, without a server: ``python predict.py -h``
(see ``deployment/predict.py``)."""
import sys

from deployment.predict import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
