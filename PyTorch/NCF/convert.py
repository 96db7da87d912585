"""NVIDIA-style command ``python convert.py``: the code is :mod:`neumf.data.convert`."""
from recsys_common.cli import run_main
from neumf.data.convert import INPUT_ERRORS, main

if __name__ == "__main__":
    run_main(main, prog="convert.py", input_errors=INPUT_ERRORS)
