"""DCNv2: `python dcnv2.py --dataset_path ... [flags]` or `horovodrun -np N python dcnv2.py ...` (`--help`)."""
from dlrm_dcnv2.train import command

if __name__ == "__main__":
    command(model="dcnv2")
