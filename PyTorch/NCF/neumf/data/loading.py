"""Loading the NCF dataset into device memory, and the per-epoch training data made there.

The whole dataset lives on the training device (GPU memory, or host memory on CPU) for the whole run:

* :func:`load_dataset` reads the FeatureSpec (channels ``user_ch``, ``item_ch``, ``label_ch``; metadata
  ``test_samples_per_series``) and its chunks: ``parquet`` (what ``convert.py`` writes) or NVIDIA's
  ``torch_tensor`` (``train_data_0.pt``... from NVIDIA's own ``convert.py``; loaded with ``weights_only=True``).
* :class:`TrainEpochs` keeps this rank's shard of the training positives and, each epoch, appends
  ``negative_samples`` random items per positive *on the device* (NVIDIA's "approximate train negative sampling":
  uniform over all items, so a negative may collide with a positive; or, with ``exclude_positives``, the NCF
  paper's sampling: uniform over the items the user has no training interaction with, drawn by vectorised
  rejection) and shuffles, seeded by ``(seed, epoch, rank)`` so that an interrupted run resumes bit-exactly.
* :class:`EvalSet` holds this rank's users' candidate lists ``[U, S]`` (positive in column 0) and the duplicate
  mask: a candidate equal to an earlier candidate of the same list is ignored at ranking (NVIDIA's and MLPerf's
  rule; it also makes sampled negatives that equal the held-out item harmless).
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Dict, Iterator, Tuple

import numpy as np
import torch

from recsys_common import datasets as common_datasets
from recsys_common.feature_spec import FeatureSpec, FeatureSpecError

USER_CHANNEL, ITEM_CHANNEL, LABEL_CHANNEL = "user_ch", "item_ch", "label_ch"
SAMPLES_PER_SERIES = "test_samples_per_series"


# One error type for bad datasets across the project: recsys_common's readers raise it too.
DatasetError = common_datasets.DatasetError


@dataclass
class NCFData:
    """The dataset as host arrays (int64 ids)."""
    train_users: np.ndarray
    train_items: np.ndarray
    test_users: np.ndarray        # [U * S], S consecutive rows per user
    test_items: np.ndarray
    test_labels: np.ndarray
    num_users: int
    num_items: int
    samples_per_series: int


def _channel_feature(spec: FeatureSpec, channel: str) -> str:
    names = spec.channel_spec.get(channel)
    if not names or len(names) != 1:
        raise FeatureSpecError(f"{spec.origin}: channel_spec.{channel} must name exactly one feature, got {names!r}")
    return names[0]


def _read_torch_tensor_chunk(spec: FeatureSpec, mapping: str, chunk: dict, wanted: list) -> Dict[str, list]:
    """NVIDIA's NCF ``torch_tensor`` chunks (one 2-D tensor per file); recsys_common reads every other type."""
    parts: Dict[str, list] = {name: [] for name in wanted}
    for rel in chunk["files"]:
        path = spec.resolve_file(rel)
        if not os.path.isfile(path):
            raise DatasetError(f"{path}: file of source_spec.{mapping} not found")
        tensor = torch.load(path, map_location="cpu", weights_only=True)
        if not isinstance(tensor, torch.Tensor):
            raise DatasetError(f"{path}: expected a tensor, got {type(tensor).__name__}")
        tensor = tensor.reshape(tensor.shape[0], -1)
        if tensor.shape[1] != len(chunk["features"]):
            raise DatasetError(f"{path}: tensor has {tensor.shape[1]} columns, the chunk lists "
                               f"{len(chunk['features'])} features {chunk['features']}")
        for name in wanted:
            parts[name].append(tensor[:, chunk["features"].index(name)].numpy())
    return parts


def _read_mapping(spec: FeatureSpec, mapping: str, features: Tuple[str, ...]) -> Dict[str, np.ndarray]:
    """Columns ``features`` of ``mapping``, concatenated over each chunk's files in order.

    parquet / csv / split_binary chunks go through ``recsys_common.datasets.read_columns`` (cardinality checks
    included); only NVIDIA's ``torch_tensor`` chunks are read here.
    """
    columns: Dict[str, list] = {name: [] for name in features}
    native = [c for c in spec.source_spec[mapping] if c["type"] != "torch_tensor"]
    for chunk in spec.source_spec[mapping]:
        wanted = [name for name in chunk["features"] if name in columns]
        if wanted and chunk["type"] == "torch_tensor":
            for name, parts in _read_torch_tensor_chunk(spec, mapping, chunk, wanted).items():
                columns[name].extend(parts)
    if native:
        view = spec.copy()
        view.source_spec = {mapping: native}
        try:
            for name, values in common_datasets.read_columns(view, mapping, features=features).items():
                columns[name].append(values)
        except Exception as err:  # pyarrow raises several types for broken files
            if isinstance(err, (DatasetError, FeatureSpecError)):
                raise
            raise DatasetError(f"{spec.origin}: cannot read source_spec.{mapping}: {err}") from err
    out = {}
    for name, parts in columns.items():
        if not parts:
            raise DatasetError(f"{spec.origin}: source_spec.{mapping} stores no feature {name!r}")
        out[name] = np.concatenate(parts)
    lengths = {name: len(a) for name, a in out.items()}
    if len(set(lengths.values())) != 1:
        raise DatasetError(f"{spec.origin}: source_spec.{mapping}: features have different row counts {lengths}")
    return out


def load_dataset(data_dir: str, feature_spec_file: str = "feature_spec.yaml") -> NCFData:
    """Read and check the dataset described by ``data_dir/feature_spec_file``."""
    spec_path = feature_spec_file if os.path.isabs(feature_spec_file) else os.path.join(data_dir, feature_spec_file)
    if not os.path.isfile(spec_path):
        raise DatasetError(f"{spec_path}: feature spec not found (run prepare_dataset.sh or convert.py first)")
    spec = FeatureSpec.from_yaml(spec_path)
    spec.validate(check_files=True, mappings=("train", "test"))
    user, item, label = (_channel_feature(spec, c) for c in (USER_CHANNEL, ITEM_CHANNEL, LABEL_CHANNEL))
    if SAMPLES_PER_SERIES not in spec.metadata:
        raise FeatureSpecError(f"{spec_path}: metadata.{SAMPLES_PER_SERIES} is missing")
    samples = int(spec.metadata[SAMPLES_PER_SERIES])
    num_users, num_items = spec.cardinality(user), spec.cardinality(item)
    train = _read_mapping(spec, "train", (user, item))
    test = _read_mapping(spec, "test", (user, item, label))
    for mapping, cols in (("train", train), ("test", test)):
        for name, card in ((user, num_users), (item, num_items)):
            values = cols[name]
            if len(values) and (values.min() < 0 or values.max() >= card):
                bad = int(np.flatnonzero((values < 0) | (values >= card))[0])
                raise DatasetError(f"{spec_path}: source_spec.{mapping}: feature {name!r} row {bad} = "
                                   f"{int(values[bad])} is outside [0, cardinality {card})")
    if len(train[user]) == 0:
        raise DatasetError(f"{spec_path}: the train mapping has no rows")
    n_test = len(test[user])
    if n_test == 0 or n_test % samples:
        raise DatasetError(f"{spec_path}: the test mapping has {n_test} rows, not a positive multiple of "
                           f"{SAMPLES_PER_SERIES}={samples}")
    series_users = test[user].reshape(-1, samples)
    if not (series_users == series_users[:, :1]).all():
        row = int(np.flatnonzero((series_users != series_users[:, :1]).any(axis=1))[0])
        raise DatasetError(f"{spec_path}: test series {row} (rows {row * samples}..{(row + 1) * samples - 1}) "
                           f"mixes users: each series must be one user's candidates")
    return NCFData(train[user].astype(np.int64), train[item].astype(np.int64), test[user].astype(np.int64),
                   test[item].astype(np.int64), test[label].astype(np.float32), num_users, num_items, samples)


VALIDATION_SEED = 20170403   # fixed: the validation split is a property of the dataset, the same for every run


def hold_out_validation(data: NCFData, seed: int = VALIDATION_SEED) -> Tuple[NCFData, NCFData]:
    """The NCF paper's protocol on any converted dataset: ``(training view, validation view)``.

    Each user's last training row (file order: ``convert.py`` writes the training rows in time order, so it is the
    user's latest training interaction when the raw data had timestamps; for files without them, such as three-field
    paper splits, file order stands for time) leaves the training rows and becomes the user's validation positive,
    with ``samples_per_series - 1`` negatives drawn uniformly, with replacement, among the items the user has
    neither a training interaction with nor as its test positive (the same shape as the test series). Users with a
    single training row keep it for training and have no validation series. The split depends on ``seed`` only (a
    constant by default), so every run, and every rank, sees the same one. Both views share the item and user
    counts; the validation view holds the validation series in its ``test_*`` arrays.
    """
    users, items = data.train_users, data.train_items
    n = len(users)
    last_seen, reversed_first = np.unique(users[::-1], return_index=True)
    last_row = n - 1 - reversed_first                        # each user's last training row, by user
    counts = np.bincount(users, minlength=data.num_users)[last_seen]
    known = np.unique(np.concatenate([users * data.num_items + items,
                                      data.test_users[data.test_labels == 1] * data.num_items
                                      + data.test_items[data.test_labels == 1]]))
    per_user_known = np.bincount(known // data.num_items, minlength=data.num_users)[last_seen]
    negatives = data.samples_per_series - 1
    eligible = (counts >= 2) & (per_user_known < data.num_items)   # something left to train on and to draw
    held_rows, valid_users = last_row[eligible], last_seen[eligible]
    keep = np.ones(n, dtype=bool)
    keep[held_rows] = False
    rng = np.random.default_rng(seed)
    drawn = rng.integers(0, data.num_items, size=(len(valid_users), negatives), dtype=np.int64)
    todo = np.isin(valid_users[:, None] * data.num_items + drawn, known)
    while todo.any():   # rejection: redraw the draws that hit a known positive (rare on sparse data)
        drawn[todo] = rng.integers(0, data.num_items, size=int(todo.sum()), dtype=np.int64)
        todo[todo] = np.isin(valid_users[np.nonzero(todo)[0]] * data.num_items + drawn[todo], known)
    candidates = np.concatenate([items[held_rows][:, None], drawn], axis=1)
    labels = np.zeros(candidates.shape, dtype=np.float32)
    labels[:, 0] = 1.0
    training = dataclasses.replace(data, train_users=users[keep], train_items=items[keep])
    validation = dataclasses.replace(training, test_users=np.repeat(valid_users, data.samples_per_series),
                                     test_items=candidates.reshape(-1), test_labels=labels.reshape(-1))
    return training, validation


def shard_bounds(total: int, rank: int, world_size: int) -> Tuple[int, int]:
    """Contiguous ``[start, end)`` of ``total`` rows owned by ``rank`` (sizes differ by at most one)."""
    base, extra = divmod(total, world_size)
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)


def epoch_generator(seed: int, epoch: int, rank: int, device: torch.device) -> torch.Generator:
    """The random stream of one (epoch, rank): independent of everything that happened before (exact resume)."""
    g = torch.Generator(device=device)
    g.manual_seed((seed * 1_000_003 + epoch) * 1_009 + rank)
    return g


class PositiveSet:
    """Membership test for (user, item) training pairs on the device: sorted keys ``user * num_items + item`` and a
    binary search (``torch.searchsorted``), so its memory is 8 bytes per positive at any number of users and items
    (a dense user x item bitmap of ML-20m would be 3.7 GB).

    >>> s = PositiveSet(np.array([0, 1]), np.array([2, 0]), num_items=3, device=torch.device("cpu"))
    >>> s.contains(torch.tensor([0, 0, 1]), torch.tensor([2, 1, 0])).tolist()
    [True, False, True]
    """

    def __init__(self, users: np.ndarray, items: np.ndarray, num_items: int, device: torch.device):
        keys = np.unique(users.astype(np.int64) * num_items + items.astype(np.int64))
        self.keys = torch.as_tensor(keys).to(device)
        self.num_items = num_items

    def contains(self, users: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        query = users * self.num_items + items
        where = torch.searchsorted(self.keys, query).clamp_(max=len(self.keys) - 1)
        return self.keys[where] == query


MAX_REJECTION_ROUNDS = 10_000


def sample_excluding(users: torch.Tensor, positives: PositiveSet, generator: torch.Generator) -> torch.Tensor:
    """One item per entry of ``users``, uniform over the items that user has no training interaction with.

    Vectorised rejection: draw all, redraw only the entries that hit a positive, until none does. With a fraction
    ``p`` of a user's items positive, an entry needs ``1 / (1 - p)`` draws on average (ML-1m: p is 4.5% on average,
    so the second round redraws ~5% of the entries and the fourth almost none). Users must have at least one
    non-positive item (checked by :class:`TrainEpochs`).
    """
    items = torch.randint(0, positives.num_items, users.shape, generator=generator, device=users.device)
    todo = torch.nonzero(positives.contains(users, items)).squeeze(1)
    for _ in range(MAX_REJECTION_ROUNDS):
        if todo.numel() == 0:
            return items
        redraw = torch.randint(0, positives.num_items, todo.shape, generator=generator, device=users.device)
        items[todo] = redraw
        todo = todo[positives.contains(users[todo], redraw)]
    raise RuntimeError(f"negative sampling: {todo.numel()} draws still hit a training positive after "
                       f"{MAX_REJECTION_ROUNDS} rounds")


class TrainEpochs:
    """This rank's training positives on ``device``, and the shuffled positives + negatives of each epoch.

    All ranks run the same number of steps per epoch: every rank draws ``steps * local_batch`` rows per epoch,
    where ``steps`` comes from the largest shard; a smaller shard tops its epoch up with extra randomly chosen
    positives (and their negatives), as DistributedSampler pads by repeating samples.

    Args:
        users, items: int64 host arrays of *all* training positives (each rank keeps its shard).
        num_items: items to draw negatives from.
        negative_samples: negatives per positive.
        global_batch_size: rows per optimizer step over all ranks (``-b``).
        exclude_positives: draw each negative among the items the user has no training interaction with (over
            *all* ranks' positives), as the NCF paper does; False: NVIDIA's approximate uniform sampling.
    """

    def __init__(self, users: np.ndarray, items: np.ndarray, num_items: int, negative_samples: int,
                 global_batch_size: int, rank: int, world_size: int, device: torch.device,
                 exclude_positives: bool = False):
        if global_batch_size % world_size:
            raise ValueError(f"--batch_size {global_batch_size} must be divisible by the number of processes "
                             f"({world_size})")
        self.positives = None
        if exclude_positives and negative_samples:
            self.positives = PositiveSet(users, items, num_items, device)
            per_user = np.bincount(self.positives.keys.cpu().numpy() // num_items)
            if per_user.max(initial=0) >= num_items:
                full = int(np.flatnonzero(per_user >= num_items)[0])
                raise DatasetError(f"user {full} interacted with all {num_items} items in training: it has no "
                                   f"negative to sample (drop the user, or train without --exclude_positives)")
        start, end = shard_bounds(len(users), rank, world_size)
        self.users = torch.as_tensor(users[start:end], dtype=torch.int64).to(device)
        self.items = torch.as_tensor(items[start:end], dtype=torch.int64).to(device)
        self.num_items = num_items
        self.negative_samples = negative_samples
        self.local_batch = global_batch_size // world_size
        self.positives_per_epoch = shard_bounds(len(users), 0, world_size)[1]  # rank 0's shard is the largest
        rows = self.positives_per_epoch * (1 + negative_samples)
        self.steps_per_epoch = -(-rows // self.local_batch)
        self.rows_per_epoch = rows * world_size  # over all ranks
        self.rank, self.device = rank, device

    def epoch(self, seed: int, epoch: int) -> Iterator[Tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """Yield ``steps_per_epoch`` batches ``(users, items, labels)`` of at most ``local_batch`` rows."""
        g = epoch_generator(seed, epoch, self.rank, self.device)
        n_pos = len(self.users)
        index = torch.arange(n_pos, device=self.device)
        if n_pos < self.positives_per_epoch:  # top up a smaller shard so that every rank runs the same steps
            extra = torch.randint(0, n_pos, (self.positives_per_epoch - n_pos,), generator=g, device=self.device)
            index = torch.cat([index, extra])
        users = self.users[index]
        items = self.items[index]
        neg_users = users.repeat(self.negative_samples)
        if self.positives is None:
            neg_items = torch.randint(0, self.num_items, (len(neg_users),), generator=g, device=self.device)
        else:
            neg_items = sample_excluding(neg_users, self.positives, g)
        all_users = torch.cat([users, neg_users])
        all_items = torch.cat([items, neg_items])
        labels = torch.zeros(len(all_users), dtype=torch.float32, device=self.device)
        labels[: len(users)] = 1.0
        perm = torch.randperm(len(all_users), generator=g, device=self.device)
        all_users, all_items, labels = all_users[perm], all_items[perm], labels[perm]
        for step in range(self.steps_per_epoch):
            lo = step * self.local_batch
            yield all_users[lo: lo + self.local_batch], all_items[lo: lo + self.local_batch], \
                labels[lo: lo + self.local_batch]


def duplicate_mask(candidates: torch.Tensor) -> torch.Tensor:
    """True where a candidate repeats an earlier candidate of the same row (those are not ranked).

    >>> duplicate_mask(torch.tensor([[5, 1, 5, 1, 2]])).tolist()
    [[False, False, True, True, False]]
    """
    sorted_items, order = torch.sort(candidates, dim=1, stable=True)
    repeat_sorted = torch.zeros_like(sorted_items, dtype=torch.bool)
    repeat_sorted[:, 1:] = sorted_items[:, 1:] == sorted_items[:, :-1]
    mask = torch.zeros_like(repeat_sorted)
    mask.scatter_(1, order, repeat_sorted)
    return mask


class EvalSet:
    """This rank's evaluation users: ``users [U]``, ``candidates [U, S]`` (positive first) and their mask."""

    def __init__(self, data: NCFData, rank: int, world_size: int, device: torch.device):
        samples = data.samples_per_series
        all_users = data.test_users.reshape(-1, samples)[:, 0]
        candidates = data.test_items.reshape(-1, samples)
        labels = data.test_labels.reshape(-1, samples)
        if not ((labels[:, 0] == 1).all() and (labels[:, 1:] == 0).all()):
            raise DatasetError("test mapping: each series must hold its positive (label 1) first, then negatives "
                               "(label 0)")
        start, end = shard_bounds(len(all_users), rank, world_size)
        self.num_users_total = len(all_users)
        self.users = torch.as_tensor(all_users[start:end]).to(device)
        self.candidates = torch.as_tensor(candidates[start:end]).to(device)
        self.mask = duplicate_mask(self.candidates)
        self.samples_per_series = samples
