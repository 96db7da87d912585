"""Serving DLRM / DCNv2: checkpoint -> Triton model repository, accuracy and latency through a KServe-v2 server.

* :mod:`deployment.export`: a checkpoint rebuilt as a Keras model, wrapped as serving functions (monolithic,
  sparse half, dense half) and written as a TensorFlow SavedModel or an ONNX model (tf2onnx).
* :mod:`deployment.deploy`: the command line (seed's ``deployment/deploy.py``) writing the Triton repository.
* :mod:`deployment.evaluate_accuracy`, :mod:`deployment.evaluate_latency`: clients of a running server (Triton,
  or MLServer through ``recsys_common.serving.mlserver_launcher`` where Triton cannot run).

Run from ``TensorFlow2/DLRM_DCNv2`` as ``python -m deployment.deploy ...`` (the seed's spelling).
"""
