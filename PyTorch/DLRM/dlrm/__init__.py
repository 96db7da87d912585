"""DLRM (Deep Learning Recommendation Model) in PyTorch: model parts, data, training and entry points.

``python -m dlrm.scripts.main --help`` lists the flags. ``dlrm.model`` holds the network, ``dlrm.data`` the readers of
NVIDIA's split-binary datasets (through ``recsys_common``), ``dlrm.cli`` the flags and the run's one configuration,
``dlrm.train`` the training loop, ``dlrm.evaluation`` the test-set metrics, ``dlrm.checkpointing`` the checkpoints,
``dlrm.serving`` the served model, ``dlrm.utils`` the learning-rate schedule, exact AUC, mixed precision and
process-group helpers.
"""
__version__ = "0.1.0"
