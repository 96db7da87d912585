"""DLRM (Deep Learning Recommendation Model) in PyTorch: model parts, data, training utilities and entry points.

``python -m dlrm.scripts.main --help`` lists the flags. ``dlrm.model`` holds the network, ``dlrm.data`` the readers of
NVIDIA's split-binary datasets (through ``recsys_common``), ``dlrm.utils`` the learning-rate schedule, exact AUC,
checkpoints and process-group helpers.
"""
__version__ = "0.1.0"
