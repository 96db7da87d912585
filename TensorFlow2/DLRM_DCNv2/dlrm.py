"""DLRM: `python dlrm.py --dataset_path ... [flags]` or `horovodrun -np N python dlrm.py ...` (`--help`: the flags)."""
from dlrm_dcnv2.train import command

if __name__ == "__main__":
    command(model="dlrm")
