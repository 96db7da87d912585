"""Command ``python synthetic.py``: a generated MovieLens-shaped ratings CSV; the code is :mod:`neumf.data.synthetic`."""
from recsys_common.cli import run_main
from neumf.data.synthetic import main

if __name__ == "__main__":
    run_main(main, prog="synthetic.py")
