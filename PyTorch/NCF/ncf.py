"""NVIDIA's command: train or evaluate NCF (``python ncf.py --data DIR``; torchrun / torch.distributed.launch for
several processes). The code is in the ``neumf`` package: flags in ``neumf/cli.py``, the loop in ``neumf/train.py``."""
from neumf.train import INPUT_ERRORS, main
from recsys_common.cli import run_main

if __name__ == "__main__":
    run_main(main, prog="ncf.py", input_errors=INPUT_ERRORS)
