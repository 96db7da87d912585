"""The 29 features of the preprocessed Outbrain dataset (reference B.4), declared in one place.

Everything downstream reads these names and numbers from here: the NVTabular workflow (hash-bucket sizes, CTR
thresholds, list length), the ``feature_spec.yaml`` it writes (dtypes, cardinalities, ``max_hotness``, channels) and
the model (embedding dimensions, which features are one-hot, multi-hot or numerical).

    >>> len(ONEHOT_FEATURES), len(MULTIHOT_FEATURES), len(NUMERICAL_FEATURES), len(FEATURES)
    (13, 3, 13, 29)
    >>> sum(f.embedding_dim for f in CATEGORICAL_FEATURES)
    1235
    >>> FEATURE_BY_NAME["topic_id_list"].max_hotness, FEATURE_BY_NAME["topic_id_list"].cardinality
    (3, 350)

Channels of the feature spec (NVIDIA's names): ``onehot_categorical``, ``multihot_categorical``, ``numerical``,
``label`` (``clicked``) and ``map`` (``display_id``: the ads of one display form one MAP@12 ranking).
"""
from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional

LABEL = "clicked"
DISPLAY_ID = "display_id"

ONEHOT_CHANNEL = "onehot_categorical"
MULTIHOT_CHANNEL = "multihot_categorical"
NUMERICAL_CHANNEL = "numerical"
LABEL_CHANNEL = "label"
MAP_CHANNEL = "map"

# Multi-hot document lists (topics, entities, categories of the page showing the ads) are cut to this length.
MAX_HOTNESS = 3

# Outbrain timestamps are milliseconds after this instant (2016-06-14 04:00:00 UTC; reference B.3).
TIMESTAMP_DELTA_MS = 1465876799998
MS_PER_DAY = 86_400_000
# Days-since-published outside [0, MAX_DAYS_SINCE_PUBLISHED] are set to 0 (the reference's sanity window).
MAX_DAYS_SINCE_PUBLISHED = 10 * 365
# Train/valid split (reference B.4): a display is in train if its day <= TRAIN_LAST_DAY and its U(0,1) draw is
# above VALID_FRACTION_OF_TRAIN_DAYS; everything else (including the last days) is validation.
TRAIN_LAST_DAY = 10
VALID_FRACTION_OF_TRAIN_DAYS = 0.2

# Columns whose click-through rate and count are joined from the training set, and the least number of training
# rows a value needs for its CTR to be used (below it the CTR is 0: too few impressions to trust).
CTR_INPUTS = ["ad_id", "source_id_promo", "document_id_promo", "publisher_id_promo", "advertiser_id", "campaign_id"]
CTR_THRESHOLDS = {"ad_id": 5, "document_id_promo": 5, "source_id_promo": 10, "publisher_id_promo": 10,
                  "advertiser_id": 10, "campaign_id": 10}
COUNT_FEATURES = ["document_id_promo_count", "ad_id_count"]


@dataclasses.dataclass(frozen=True)
class Feature:
    """One model input column of the preprocessed parquet files.

    kind: ``onehot`` (int32 id in ``[0, cardinality)``), ``multihot`` (list of at most ``max_hotness`` int32 ids)
    or ``numerical`` (float32). ``cardinality`` is the hash-bucket count (one-hot) or the vocabulary cap of
    ``Categorify`` (multi-hot); ``embedding_dim`` is the deep part's default embedding width
    (``embedding_sizes.json``); ``side`` is the README's request/item grouping.
    """
    name: str
    kind: str
    cardinality: Optional[int] = None
    embedding_dim: Optional[int] = None
    max_hotness: int = 1
    side: str = "request"

    @property
    def dtype(self) -> str:
        return "float32" if self.kind == "numerical" else "int32"

    @property
    def channel(self) -> str:
        return {"onehot": ONEHOT_CHANNEL, "multihot": MULTIHOT_CHANNEL, "numerical": NUMERICAL_CHANNEL}[self.kind]


def _onehot(name, buckets, dim, side="request"):
    return Feature(name, "onehot", cardinality=buckets, embedding_dim=dim, side=side)


def _multihot(name, buckets, dim):
    return Feature(name, "multihot", cardinality=buckets, embedding_dim=dim, max_hotness=MAX_HOTNESS)


def _numerical(name):
    return Feature(name, "numerical", side="")


# The reference's table, in its order (B.4 rows 1-29).
FEATURES: List[Feature] = [
    _onehot("ad_id", 250_000, 128, "item"),
    _onehot("document_id", 300_000, 128),
    _onehot("platform", 4, 19),
    _onehot("document_id_promo", 100_000, 128),
    _onehot("campaign_id", 5_000, 128, "item"),
    _onehot("advertiser_id", 2_500, 64, "item"),
    _onehot("source_id", 4_000, 64),
    _onehot("geo_location", 2_500, 64),
    _onehot("geo_location_country", 300, 64),
    _onehot("geo_location_state", 2_000, 64),
    _onehot("publisher_id", 1_000, 64),
    _onehot("source_id_promo", 4_000, 64, "item"),
    _onehot("publisher_id_promo", 1_000, 64, "item"),
    _multihot("topic_id_list", 350, 64),
    _multihot("entity_id_list", 10_000, 64),
    _multihot("category_id_list", 100, 64),
    _numerical("document_id_document_id_promo_sim_categories"),
    _numerical("document_id_document_id_promo_sim_topics"),
    _numerical("document_id_document_id_promo_sim_entities"),
    _numerical("document_id_promo_ctr"),
    _numerical("publisher_id_promo_ctr"),
    _numerical("source_id_promo_ctr"),
    _numerical("document_id_promo_count"),
    _numerical("publish_time_days_since_published"),
    _numerical("ad_id_ctr"),
    _numerical("advertiser_id_ctr"),
    _numerical("campaign_id_ctr"),
    _numerical("ad_id_count"),
    _numerical("publish_time_promo_days_since_published"),
]

FEATURE_BY_NAME: Dict[str, Feature] = {f.name: f for f in FEATURES}
ONEHOT_FEATURES: List[str] = [f.name for f in FEATURES if f.kind == "onehot"]
MULTIHOT_FEATURES: List[str] = [f.name for f in FEATURES if f.kind == "multihot"]
NUMERICAL_FEATURES: List[str] = [f.name for f in FEATURES if f.kind == "numerical"]
CATEGORICAL_FEATURES: List[Feature] = [f for f in FEATURES if f.kind != "numerical"]
HASH_BUCKET_SIZES: Dict[str, int] = {f.name: f.cardinality for f in FEATURES if f.kind == "onehot"}
EMBEDDING_SIZES: Dict[str, int] = {f.name: f.embedding_dim for f in CATEGORICAL_FEATURES}

# Multi-hot list column -> (raw documents_* file, id column in it).
LIST_SOURCES = {"topic_id_list": ("documents_topics", "topic_id"),
                "entity_id_list": ("documents_entities", "entity_id"),
                "category_id_list": ("documents_categories", "category_id")}
# TF-IDF similarity column suffix -> raw documents_* file whose (document, term, confidence) rows form the matrix.
SIMILARITY_SOURCES = {"categories": ("documents_categories", "category_id"),
                      "topics": ("documents_topics", "topic_id"),
                      "entities": ("documents_entities", "entity_id")}

# Column order of every output parquet file: label, MAP key, then the 29 features in the reference's order.
OUTPUT_COLUMNS: List[str] = [LABEL, DISPLAY_ID] + [f.name for f in FEATURES]
