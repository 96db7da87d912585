"""The ``model.py`` of a raw ensemble's preprocessing step: raw request values -> the served model's inputs.

Copied into ``<repo>/<model>-raw-preprocess/1/`` by ``recsys_common.serving.raw_ensemble``, beside
``recsys_python_model.py`` (``triton_python_model.py``: the configuration, the batching of requests and the error
per refused request are its ``RecsysPythonModel``'s) and ``raw_features/``, the dataset files the mapping reads
(dictionaries, id mappings, the click log's settings). Nothing is read outside this version directory.

The mapping itself is ``recsys_common.serving.raw_features`` (the same code the tests compare with training), so the
Triton Python environment needs ``recsys_common`` and Polars importable (``make setup``'s tritonserver has them; in
NVIDIA's container: ``pip install ./common polars``). A value that cannot be mapped (a malformed integer, an NCF id
the training data never had) fails its request with the mapper's message: row, input, column and value.
"""
import os
import sys

import numpy as np

# Triton's stub loads this file by path: make the base class copied beside it importable.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from recsys_python_model import RecsysPythonModel  # noqa: E402  (triton_python_model.py, copied)

from recsys_common.serving.model_config import TensorSpec  # noqa: E402
from recsys_common.serving.raw_features import RAW_FILES_DIRECTORY, load_raw_mapper, model_inputs  # noqa: E402


class TritonPythonModel(RecsysPythonModel):
    """Raw inputs (the ensemble's) in, the served model's inputs out, names and dtypes from ``config.pbtxt``."""

    def setup(self):
        self.mapper = load_raw_mapper(os.path.join(self.version_dir, RAW_FILES_DIRECTORY))
        self.targets = [TensorSpec(name, np.dtype(dtype).name, [1]) for name, dtype in self.output_dtypes.items()]

    def compute(self, arrays):
        return model_inputs(self.mapper.map(arrays), self.targets)
