"""Serving tools for the DLRM recipe: checkpoint -> Triton model repository (``deployer``), accuracy and latency
through a KServe-v2 server (``evaluate_accuracy``, ``evaluate_latency``). Run from ``PyTorch/DLRM`` as
``python -m deployment.<tool>``; see the README's "Deployment" section."""
