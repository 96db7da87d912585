"""Serving: Triton model repositories (GPU and CPU variants), a KServe-v2 client, and a real Triton server on the CPU.

Modules (import them directly; this package imports nothing heavy):

    model_config      ``config.pbtxt`` written through Triton's own protobuf (``TensorSpec``, ``EnsembleStep``,
                      ``model_config_text``, ``parse_model_config``, ``check_model_directory``).
    repository        ``model_repository``: an atomic writer of a Triton model repository (``--overwrite`` replaces
                      only this tool's files; ``backend="python"`` writes the CPU variant); ``read_sidecar`` reads
                      ``recsys_serving.json``.
    python_backend    the CPU repository: each model rewritten for Triton's Python backend (same names, tensors,
                      batching; ensembles stay Triton's), ``triton_python_model.py`` copied in as ``model.py``.
    triton_python_model  that ``model.py``: ONNX / TorchScript / SavedModel run inside Triton's stub, the sidecar's
                      id and string-length checks, the dynamic batcher's requests as one call (``RecsysPythonModel``
                      for other Python-backend models). Loaded by Triton only, never imported here.
    triton_server     ``serve_repository``: the tritonserver ``make setup`` installs, on loopback, every model READY,
                      always stopped (``python -m recsys_common.serving.triton_server --model-repository DIR``).
    _process_watchdog the server's parent: stops it when the launching process dies.
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
                      microseconds, the backend), NVIDIA's ``--triton-*`` flag group, ``--triton-backend`` and the
                      delay flags in ms and us.
    torch_export      PyTorch module -> Triton repository (ONNX / TorchScript), the format flags, the exported-vs-eager
                      check: PyTorch DLRM's and NCF's deployers (imports torch, never TensorFlow).
    raw_features, raw_ensemble, raw_preprocess_model
                      raw feature values in requests: the preprocessing step and the ensembles in front of a model.

MLServer 1.7.1 with our compatibility layer, the stand-in before a real Triton ran here, is retired; its last commit
is a2f23de (``common/benchmarks/triton_serving.sh`` there compares the two servers).
"""
