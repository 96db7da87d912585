"""``--dataset_type synthetic``: batches generated on the fly, deterministic by seed, learnable.

Batch ``i`` of a split is a pure function of ``(seed, split, i)``: every rank generates the same global batch (ids
power-law distributed over ``[0, cardinality)`` via ``recsys_common.synthetic.power_law_ids``, numericals standard
normal, labels Bernoulli from ``recsys_common.synthetic.HiddenModel`` so the task is learnable), then keeps what it
needs. So the data does not depend on the world size, and ``skip(n)`` costs nothing. Tables with hotness ``h > 1``
are multi-hot with exactly ``h`` ids per row (NVIDIA's synthetic multi-hot has a fixed hotness too).

Only one batch is in memory at a time. Generating costs about as much as a step of a small model on CPU;
``cached_batches > 0`` cycles through that many distinct batches instead, for throughput benchmarks.
"""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from recsys_common.feature_spec import FeatureSpec
from recsys_common.synthetic import HiddenModel, power_law_ids

from .pipeline import BatchPipeline, DatasetMetadata, metadata_from_spec

NVIDIA_DEFAULT_CARDINALITIES = [1000] * 26
NVIDIA_DEFAULT_HOTNESS = [20] * 26


class SyntheticDataset(BatchPipeline):
    """``num_batches`` generated global batches of one split (``stream`` 0 = train, 1 = valid)."""

    def __init__(self, num_batches: int, cardinalities: Optional[Sequence[int]] = None,
                 hotness: Optional[Sequence[int]] = None, num_numerical: int = 13, spec=None, seed: int = 12345,
                 stream: int = 0, cached_batches: int = 0, alpha: float = 1.05, **kwargs):
        super().__init__(name=f"synthetic dataset (split {'train' if stream == 0 else 'valid'}, seed {seed})",
                         **kwargs)
        if spec is not None:
            self.metadata = metadata_from_spec(spec)
        else:
            cards = list(NVIDIA_DEFAULT_CARDINALITIES if cardinalities is None else cardinalities)
            hot = list(NVIDIA_DEFAULT_HOTNESS[:len(cards)] if hotness is None else hotness)
            if len(hot) == 1 and len(cards) > 1:
                hot = hot * len(cards)
            if len(hot) != len(cards):
                raise ValueError(f"--synthetic_dataset_hotness has {len(hot)} entries but "
                                 f"--synthetic_dataset_cardinalities has {len(cards)}")
            for flag, values in (("--synthetic_dataset_cardinalities", cards), ("--synthetic_dataset_hotness", hot)):
                if any(int(v) < 1 for v in values):
                    raise ValueError(f"{flag}: every value must be >= 1, got {values}")
            if num_numerical < 0:
                raise ValueError(f"--synthetic_dataset_num_numerical_features must be >= 0, got {num_numerical}")
            self.metadata = DatasetMetadata(table_sizes=[int(c) for c in cards], hotness=[int(h) for h in hot],
                                            num_numerical=int(num_numerical),
                                            categorical_features=[f"cat_{i}.bin" for i in range(len(cards))],
                                            numerical_features=[f"num_{i}" for i in range(num_numerical)])
        if num_batches < 1:
            raise ValueError(f"synthetic dataset needs >= 1 batch, got {num_batches} "
                             f"(--synthetic_dataset_train_batches / --synthetic_dataset_valid_batches)")
        self.seed, self.stream, self.alpha = int(seed), int(stream), float(alpha)
        self.cached_batches = int(cached_batches)
        self._cache = {}
        self.num_rows = num_batches * self.global_batch_size
        self._hidden = self._hidden_model()
        self._finish_init()

    def _hidden_model(self):
        m = self.metadata
        spec = FeatureSpec.get_default_feature_spec(m.num_numerical, m.table_sizes)
        for name, h in zip(m.categorical_features, m.hotness):
            if name in spec.feature_spec and h > 1:
                spec.feature_spec[name]["max_hotness"] = h
        self._model_features = list(spec.channel_spec["categorical"]), list(spec.channel_spec["numerical"])
        return HiddenModel(spec, self.seed)

    def _global_batch(self, index: int):
        """(numerical [B, n] float32, list of ids per table [B] or [B, h] int32, labels [B] float32)."""
        key = index % self.cached_batches if self.cached_batches > 0 else index
        if key in self._cache:
            return self._cache[key]
        m, rows = self.metadata, self._layout[index][1] if self._layout else self.global_batch_size
        # one generator per batch (creating one costs ~0.1 ms, a third of a small batch's generation); every rank
        # draws all tables in the same order, as the labels need them all anyway
        rng = np.random.default_rng([self.seed, self.stream, key])
        ids = [power_law_ids(rng, card, rows if hot == 1 else (rows, hot), self.alpha).astype(np.int32)
               for card, hot in zip(m.table_sizes, m.hotness)]
        numerical = rng.standard_normal((rows, m.num_numerical), dtype=np.float32)
        cats, nums = self._model_features
        columns = {name: ids[t] for t, name in enumerate(cats)}
        columns.update({name: numerical[:, j] for j, name in enumerate(nums)})
        p = 1.0 / (1.0 + np.exp(-self._hidden.logit(columns)))
        labels = (rng.random(rows) < p).astype(np.float32)
        batch = (numerical, ids, labels)
        if self.cached_batches > 0:
            self._cache[key] = batch
        return batch

    def _numpy_batch(self, index: int) -> tuple:
        numerical, ids, labels = self._global_batch(index)
        rows = len(labels)
        b = rows // self.world_size
        lo, hi = self.rank * b, (self.rank + 1) * b
        groups = []
        for is_global, positions in self._one_hot_groups:
            tables = [self.input_tables[p][0] for p in positions]
            groups.append((positions, np.stack([ids[t] if is_global else ids[t][lo:hi] for t in tables]), True))
        for pos in self._multi_hot_positions:
            table, is_global = self.input_tables[pos]
            groups.append(([pos], ids[table] if is_global else ids[table][lo:hi], False))
        return numerical[lo:hi], groups, labels[lo:hi]
