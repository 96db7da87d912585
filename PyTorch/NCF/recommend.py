"""NVIDIA-style command ``python recommend.py``: the code is :mod:`neumf.recommend`."""
from recsys_common.cli import run_main
from neumf.recommend import INPUT_ERRORS, main

if __name__ == "__main__":
    run_main(main, prog="recommend.py", input_errors=INPUT_ERRORS)
