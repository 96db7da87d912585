"""NCF (NeuMF, GMF, MLP) in PyTorch, laid out as every recipe of this repository is:

    neumf/model.py          the model (NVIDIA's ``neumf.py``: its names import from ``neumf`` as before)
    neumf/data/             the converted dataset in memory, MovieLens conversion, generated data
    neumf/cli.py            ncf.py's flags -> one frozen NcfConfig
    neumf/train.py          the training loop (``python ncf.py`` calls ``neumf.train.main``)
    neumf/evaluation.py     HR@K / NDCG@K
    neumf/checkpointing.py  --checkpoint_dir: model.pth, last.pth, exact resume
    neumf/serving.py        the served model and the Triton repository's sidecar
"""
from .model import (MODEL_NAMES, NVIDIA_MARKER, GMF, MLP, Dropout, GMFBranch, MLPBranch, NeuMF,  # noqa: F401
                    Popularity, Predictor, build_model, fix_gmf_predictor, from_nvidia_state_dict,
                    is_nvidia_state_dict, neumf_state_from_pretrained, strip_ddp_prefix, to_nvidia_state_dict)
