"""Serving DLRM / DCNv2: the commands (thin command lines over :mod:`dlrm_dcnv2.serving`, which holds the library:
a checkpoint rebuilt as serving functions, SavedModel / ONNX export, the Triton repository).

* :mod:`deployment.deploy`: the command line (seed's ``deployment/deploy.py``) writing the Triton repository.
* :mod:`deployment.evaluate_accuracy`, :mod:`deployment.evaluate_latency`: clients of a running server (Triton,
  or MLServer through ``recsys_common.serving.mlserver_launcher`` where Triton cannot run).

Run from ``TensorFlow2/DLRM_DCNv2`` as ``python -m deployment.deploy ...`` (the seed's spelling). The package
``dlrm_dcnv2`` never imports this directory.
"""
