"""Published Criteo 1TB cardinalities at NVIDIA's frequency thresholds, for synthetic data of the real shapes.

The 26 table sizes (Criteo feature order C1..C26 unless noted) of the dataset preprocessed with frequency limit 15,
3 and 0, as NVIDIA's TF2 DLRM/DCNv2 recipe names its synthetic variants (``generate_feature_spec --variant``;
reference B.2). Their sums match the published model sizes at embedding dim 128, float32 (checked by
``TensorFlow2/DLRM_DCNv2/tests/test_scripts.py``):

========================  ===========  ==================  =======================
variant                   rows         parameters (dim 128) size
========================  ===========  ==================  =======================
criteo_t15_synthetic      32,709,138   4.19 B               15.6 GiB ("small")
criteo_t3_synthetic       177,944,291  22.8 B               84.9 GiB ("large")
criteo_t0_synthetic       882,774,559  113 B                421 GiB ("extra large")
========================  ===========  ==================  =======================

``criteo_t3`` is listed in the order NVIDIA's file writes it (which is not C1..C26). Our reference gives only the two
largest ``t0`` tables (292,775,614 and 227,605,432); the list below is the unthresholded Criteo 1TB table sizes as
other public DLRM implementations publish them (e.g. as a ``column_size_array`` for "criteo1t"), which holds those
two and whose sum gives exactly the 421 GiB above.
"""
from __future__ import annotations

from typing import Dict, List

from . import NUM_NUMERICAL
from ..feature_spec import FeatureSpec

CARDINALITIES: Dict[str, List[int]] = {
    "criteo_t15_synthetic": [7912889, 33823, 17139, 7339, 20046, 4, 7105, 1382, 63, 5554114, 582469, 245828, 11, 2209,
                             10667, 104, 4, 968, 15, 8165896, 2675940, 7156453, 302516, 12022, 97, 35],
    "criteo_t3_synthetic": [45833188, 36747, 1572176, 345139, 11, 2209, 11268, 128, 4, 975, 15, 48937457, 17246,
                            11316796, 40094537, 452104, 12607, 105, 36, 7414, 20244, 4, 7115, 1442, 63, 29275261],
    "criteo_t0_synthetic": [227605432, 39060, 17295, 7424, 20265, 3, 7122, 1543, 63, 130229467, 3067956, 405282, 10,
                            2209, 11938, 155, 4, 976, 14, 292775614, 40790948, 187188510, 590152, 12973, 108, 36],
}
VARIANTS = tuple(CARDINALITIES)


def variant_feature_spec(variant: str, mappings=("train", "test")):
    """The split-binary FeatureSpec (13 numerical, 26 categorical features) of a variant; ValueError names the
    known variants."""
    if variant not in CARDINALITIES:
        raise ValueError(f"unknown variant {variant!r}; expected one of {', '.join(VARIANTS)}")
    return FeatureSpec.get_default_feature_spec(NUM_NUMERICAL, CARDINALITIES[variant], mappings=mappings)
