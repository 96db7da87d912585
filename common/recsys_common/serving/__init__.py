"""Serving: Triton model repositories, a KServe-v2 client, and MLServer as the stand-in server on machines without
Triton.

Modules (import them directly; this package imports nothing heavy, so that the MLServer process, which loads
``mlserver_runtime``, never pulls in ``tritonclient.grpc``; the two define the same protobuf symbols and cannot live in
one process):

    model_config      ``config.pbtxt`` written through Triton's own protobuf (``TensorSpec``, ``EnsembleStep``,
                      ``model_config_text``, ``parse_model_config``, ``check_model_directory``).
    repository        ``model_repository``: an atomic writer of a Triton model repository (``--overwrite`` replaces
                      only this tool's files); ``read_sidecar`` reads ``recsys_serving.json``.
    mlserver_runtime  ``OnnxModel`` / ``TorchScriptModel``: the MLServer runtimes (onnxruntime, torch) serving a
                      repository's ONNX / TorchScript models, with Triton's model-config HTTP route; imported only
                      inside the MLServer process.
    triton_extensions Triton's binary tensor extension (HTTP) and gRPC ``ModelConfig`` added to MLServer (no fork).
    mlserver_launcher ``serve_repository``: MLServer on loopback serving a Triton repository's ONNX and TorchScript
                      models, always stopped (``python -m recsys_common.serving.mlserver_launcher --model-repository
                      DIR``).
    perf_analyzer     Triton's perf_analyzer on our request rows, side by side with ``latency`` (``make setup``
                      installs the binary).
    id_range_torch,   the id range check inside exported graphs (a row with an out-of-range id scores NaN).
    id_range_tf
    client            ``InferenceClient`` (tritonclient HTTP / gRPC with timeouts, ``ServingError``),
                      ``infer_in_batches``.
    latency           ``measure_latency``, ``write_latency_report`` (JSON + PNG), ``add_latency_arguments``,
                      ``run_latency``: the core of every recipe's ``evaluate_latency``.
    rows              request rows: ``random_rows`` (random valid rows from a sidecar's inputs), ``cycling_rows``.
    triton_options    ``TritonOptions`` (one options object for every exporter; the batching delay held in
                      microseconds), NVIDIA's ``--triton-*`` flag group and the delay flags in ms and us.
    torch_export      PyTorch module -> Triton repository (ONNX / TorchScript), the format flags, the exported-vs-eager
                      check: PyTorch DLRM's and NCF's deployers (imports torch, never TensorFlow).
"""
