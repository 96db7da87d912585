"""Shared entry point: `python main.py --model dlrm|dcnv2 [flags]` (NVIDIA's main.py; `--model` picks the defaults)."""
from dlrm_dcnv2.train import command

if __name__ == "__main__":
    command()
