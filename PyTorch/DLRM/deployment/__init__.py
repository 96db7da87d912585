"""Serving commands for the DLRM recipe: checkpoint -> Triton model repository (``deploy``; NVIDIA's name
``deployer`` runs it too), accuracy and latency through a KServe-v2 server (``evaluate_accuracy``,
``evaluate_latency``), served predictions (``client``). Run from ``PyTorch/DLRM`` as ``python -m deployment.<tool>``;
see the README's "Deployment" section. Commands only: the served model is :mod:`dlrm.serving`."""
