"""Serving DLRM / DCNv2: the commands (thin command lines over :mod:`dlrm_dcnv2.serving`, which holds the library:
a checkpoint rebuilt as serving functions, SavedModel / ONNX export, the Triton repository).

* :mod:`deployment.deploy`: the command line (seed's ``deployment/deploy.py``) writing the Triton repository.
* :mod:`deployment.evaluate_accuracy`, :mod:`deployment.evaluate_latency`: clients of a running Triton server
  (on a CPU machine: ``python -m recsys_common.serving.triton_server`` on the ``--triton-backend python`` repository).

Run from ``TensorFlow2/DLRM_DCNv2`` as ``python -m deployment.deploy ...`` (the seed's spelling). The package
``dlrm_dcnv2`` never imports this directory.
"""
