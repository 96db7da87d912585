"""``--dataset_type split_tfrecords``: prebatched TFRecords, one directory per feature group, multi-hot capable.

Layout (reference B.2, last bullet; written by ``python -m dlrm_dcnv2.dataloading.transcribe``)::

    <dataset>/feature_spec.yaml            chunks of type split_tfrecords; each chunk's one "file" is a directory
    <dataset>/<split>/numerical/           all numerical features, one float tensor [r, n] per record
    <dataset>/<split>/label/               [r]
    <dataset>/<split>/cat_<i>/             one per categorical feature: int32 [r] (one-hot) or a ragged
                                           int32 [r, None] (multi-hot, serialized as a ragged variant)
        data_<k>.tfrecords                 records_per_file records each, standard TFRecord framing
        length.json                        {"num_rows", "prebatch_size", "records_per_file", "num_records",
                                            "dtype", "ragged", "features"}

Record ``j`` of every directory holds rows ``[j * prebatch_size, (j + 1) * prebatch_size)`` of the split (the last
one fewer), serialized with ``tf.io.serialize_tensor``. Any reader of TFRecords can read the files; this one reads
records by offset (found from the 12-byte record headers once, when opening), so a rank reads only the directories
of its tables, a batch needs no prebatch alignment, and ``skip(n)`` jumps straight to batch ``n``.
Multi-hot features come out padded with -1 to the spec's ``max_hotness``.
"""
from __future__ import annotations

import json
import os
import re
import struct
from typing import Dict, List, Optional, Sequence

import numpy as np

from recsys_common.feature_spec import FeatureSpec

from .pipeline import PAD, DataError, SpecPipeline, label_feature, metadata_from_spec

LENGTH_FILE = "length.json"
CHUNK_TYPE = "split_tfrecords"
_HEADER = struct.Struct("<QI")   # payload length, masked crc of the length


def group_directory_name(feature: str) -> str:
    """Directory name of a categorical feature's group (``cat_0.bin`` -> ``cat_0``)."""
    name = feature[:-4] if feature.endswith(".bin") else feature
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name) or "feature"


def _tf_dtype(name: str):
    import tensorflow as tf
    return tf.as_dtype(np.dtype(name))


# ------------------------------------------------------------------------------------------------------ writing
def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _read_varint(data: bytes, pos: int = 0):
    value = shift = 0
    while True:
        byte = data[pos]
        value |= (byte & 0x7F) << shift
        pos += 1
        shift += 7
        if not byte & 0x80:
            return value, pos


def serialize_rows(values: np.ndarray, ragged: bool) -> bytes:
    """One record: ``values`` ([r], [r, n]; multi-hot: [r, h] padded with -1 and ``ragged``) as serialized bytes.

    Exactly what ``tf.io.serialize_tensor`` writes for the dense tensor, or for the scalar variant of
    ``tf.RaggedTensor.from_row_splits(ids, row_splits)``, so ``tf.io.parse_tensor`` (+ ``RaggedTensorFromVariant``)
    reads every record. One difference from TensorFlow's own ragged encoder: the ragged components are stored as
    raw bytes (``tensor_content``) rather than varints, which parses several times faster (also in TensorFlow).
    """
    from tensorflow.core.framework import tensor_pb2, tensor_shape_pb2, types_pb2
    from tensorflow.python.framework.tensor_util import make_tensor_proto
    if not ragged:
        return make_tensor_proto(np.ascontiguousarray(values)).SerializeToString()
    present = values != PAD
    splits = np.concatenate([[0], np.cumsum(present.sum(1))]).astype(np.int64)
    data = tensor_pb2.VariantTensorDataProto(type_name="RaggedTensorVariant")
    data.tensors.add().CopyFrom(make_tensor_proto(splits))
    data.tensors.add().CopyFrom(make_tensor_proto(np.ascontiguousarray(values[present], dtype=np.int32)))
    body = data.SerializeToString()
    # a variant tensor's content: the length-prefixed VariantTensorDataProto of each element (here one)
    outer = tensor_pb2.TensorProto(dtype=types_pb2.DT_VARIANT, tensor_shape=tensor_shape_pb2.TensorShapeProto(),
                                   tensor_content=_varint(len(body)) + body)
    return outer.SerializeToString()


def _proto_array(proto, dtype: np.dtype) -> Optional[np.ndarray]:
    """The array of a TensorProto holding raw ``tensor_content`` (None for other encodings)."""
    if not proto.tensor_content:
        return None
    shape = [d.size for d in proto.tensor_shape.dim]
    return np.frombuffer(proto.tensor_content, dtype=dtype).reshape(shape)


def parse_rows(payload: bytes, dtype: str, ragged: bool):
    """Inverse of :func:`serialize_rows`: a dense array, or ``(row_splits, ids)`` of a ragged record.

    Reads the protobuf directly with numpy (no TensorFlow op, no copy) when the record stores raw bytes, as ours do;
    records written by TensorFlow's own encoder go through ``tf.io.parse_tensor``.
    """
    from tensorflow.core.framework import tensor_pb2
    outer = tensor_pb2.TensorProto.FromString(payload)
    if not ragged:
        array = _proto_array(outer, np.dtype(dtype))
        if array is not None:
            return array
        import tensorflow as tf
        return np.asarray(tf.io.parse_tensor(payload, _tf_dtype(dtype)))
    if outer.tensor_content:
        size, pos = _read_varint(outer.tensor_content)
        data = tensor_pb2.VariantTensorDataProto.FromString(outer.tensor_content[pos:pos + size])
        if len(data.tensors) == 2:
            splits, ids = _proto_array(data.tensors[0], np.int64), _proto_array(data.tensors[1], np.int32)
            if splits is not None and ids is not None:
                return splits, ids
    import tensorflow as tf
    splits, ids = tf.raw_ops.RaggedTensorFromVariant(
        encoded_ragged=tf.io.parse_tensor(payload, tf.variant), input_ragged_rank=-1, output_ragged_rank=1,
        Tvalues=tf.int32, Tsplits=tf.int64)
    return np.asarray(splits[0]), np.asarray(ids)


class GroupWriter:
    """Writes one group directory; rows arrive in blocks of any size and leave as records of ``prebatch_size``."""

    def __init__(self, directory: str, features: Sequence[str], dtype: str, ragged: bool, prebatch_size: int,
                 records_per_file: int):
        os.makedirs(directory, exist_ok=True)
        self.directory, self.features, self.dtype, self.ragged = directory, list(features), dtype, ragged
        self.prebatch_size, self.records_per_file = prebatch_size, records_per_file
        self._pending: List[np.ndarray] = []
        self._pending_rows = 0
        self.num_rows = self.num_records = 0
        self._writer = None

    def write(self, values: np.ndarray) -> None:
        self._pending.append(np.asarray(values))
        self._pending_rows += len(values)
        while self._pending_rows >= self.prebatch_size:
            self._emit(self.prebatch_size)

    def _emit(self, rows: int) -> None:
        block = np.concatenate(self._pending) if len(self._pending) > 1 else self._pending[0]
        record, rest = block[:rows], block[rows:]
        self._pending, self._pending_rows = ([rest] if len(rest) else []), len(rest)
        import tensorflow as tf
        if self.num_records % self.records_per_file == 0:
            if self._writer is not None:
                self._writer.close()
            name = f"data_{self.num_records // self.records_per_file}.tfrecords"
            self._writer = tf.io.TFRecordWriter(os.path.join(self.directory, name))
        self._writer.write(serialize_rows(record.astype(self.dtype, copy=False), self.ragged))
        self.num_records += 1
        self.num_rows += len(record)

    def close(self) -> None:
        if self._pending_rows:
            self._emit(self._pending_rows)
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        meta = {"num_rows": self.num_rows, "prebatch_size": self.prebatch_size,
                "records_per_file": self.records_per_file, "num_records": self.num_records, "dtype": self.dtype,
                "ragged": self.ragged, "features": self.features}
        with open(os.path.join(self.directory, LENGTH_FILE), "w") as f:
            json.dump(meta, f, indent=1)


def tfrecords_spec(metadata, mapping_names: Sequence[str], label: str = "label"):
    """The FeatureSpec of a split_tfrecords dataset with ``metadata``'s tables and numericals."""
    features = {label: {"dtype": "float32"}}
    for f in metadata.numerical_features:
        features[f] = {"dtype": "float32"}
    for f, card, hot in zip(metadata.categorical_features, metadata.table_sizes, metadata.hotness):
        features[f] = {"dtype": "int32", "cardinality": int(card)}
        if hot > 1:
            features[f]["max_hotness"] = int(hot)
    source = {}
    for m in mapping_names:
        chunks = []
        if metadata.numerical_features:
            chunks.append({"type": CHUNK_TYPE, "features": list(metadata.numerical_features),
                           "files": [f"{m}/numerical"]})
        chunks.append({"type": CHUNK_TYPE, "features": [label], "files": [f"{m}/label"]})
        for f in metadata.categorical_features:
            chunks.append({"type": CHUNK_TYPE, "features": [f], "files": [f"{m}/{group_directory_name(f)}"]})
        source[m] = chunks
    channels = {"categorical": list(metadata.categorical_features),
                "numerical": list(metadata.numerical_features), "label": [label]}
    return FeatureSpec(features, source, channels, {"prebatched_by": "dlrm_dcnv2.dataloading.transcribe"})


class SplitWriter:
    """Writes one split of ``spec`` (from :func:`tfrecords_spec`) under ``root``; feed it pipeline batches."""

    def __init__(self, spec, root: str, mapping: str, prebatch_size: int, records_per_file: int = 64):
        if prebatch_size < 1 or records_per_file < 1:
            raise ValueError(f"--dst_prebatch_size ({prebatch_size}) and records per file ({records_per_file}) "
                             f"must be >= 1")
        self.groups = []
        label = label_feature(spec)
        meta = metadata_from_spec(spec)
        for chunk in spec.source_spec[mapping]:
            feats = chunk["features"]
            ragged = len(feats) == 1 and spec.max_hotness(feats[0]) > 1
            dtype = "int32" if feats[0] in meta.categorical_features else "float32"
            self.groups.append(GroupWriter(os.path.join(root, chunk["files"][0]), feats, dtype, ragged,
                                           prebatch_size, records_per_file))
        self._numerical = [g for g in self.groups if g.features == meta.numerical_features]
        self._label = [g for g in self.groups if g.features == [label]][0]
        self._tables = [g for g in self.groups if g not in self._numerical and g is not self._label]

    def write(self, numerical: np.ndarray, categorical: Sequence[np.ndarray], labels: np.ndarray) -> None:
        for g in self._numerical:
            g.write(numerical)
        self._label.write(labels)
        for g, ids in zip(self._tables, categorical):
            g.write(ids)

    def close(self) -> int:
        for g in self.groups:
            g.close()
        return self._label.num_rows


# ------------------------------------------------------------------------------------------------------ reading
class RecordGroup:
    """Random access to the rows of one group directory (records located by offset, last record cached)."""

    def __init__(self, directory: str, feature_names: Sequence[str], max_hotness: int = 1):
        self.path = directory
        meta_path = os.path.join(directory, LENGTH_FILE)
        if not os.path.isdir(directory):
            raise DataError(f"{directory}: directory of feature(s) {list(feature_names)} not found")
        try:
            with open(meta_path) as f:
                self.meta = json.load(f)
        except FileNotFoundError:
            raise DataError(f"{meta_path}: missing (feature(s) {list(feature_names)}); the directory is not a "
                            f"complete split_tfrecords group") from None
        except ValueError as e:
            raise DataError(f"{meta_path}: not valid JSON: {e}") from None
        for key in ("num_rows", "prebatch_size", "records_per_file", "num_records", "dtype", "ragged"):
            if key not in self.meta:
                raise DataError(f"{meta_path}: lacks key {key!r}")
        if list(self.meta.get("features", feature_names)) != list(feature_names):
            raise DataError(f"{meta_path}: holds features {self.meta.get('features')}, the spec expects "
                            f"{list(feature_names)}")
        self.num_rows = int(self.meta["num_rows"])
        self.prebatch_size = int(self.meta["prebatch_size"])
        self.max_hotness = max_hotness
        self.features = list(feature_names)
        self._index: Optional[List[tuple]] = None
        self._cache: Dict[int, np.ndarray] = {}

    def open(self) -> None:
        """Locate every record (file, offset, length); checks the files hold the records length.json promises."""
        if self._index is not None:
            return
        index = []
        per_file, total = int(self.meta["records_per_file"]), int(self.meta["num_records"])
        for k in range(-(-total // per_file) if total else 0):
            path = os.path.join(self.path, f"data_{k}.tfrecords")
            try:
                with open(path, "rb") as f:
                    data_size = os.fstat(f.fileno()).st_size
                    offset = 0
                    while offset < data_size:
                        header = f.read(_HEADER.size)
                        if len(header) < _HEADER.size:
                            raise DataError(f"{path}: truncated record header at byte {offset}")
                        length = _HEADER.unpack(header)[0]
                        if offset + _HEADER.size + length + 4 > data_size:
                            raise DataError(f"{path}: record {len(index)} at byte {offset} claims {length} bytes, "
                                            f"past the end of the file (truncated)")
                        index.append((path, offset + _HEADER.size, length))
                        offset += _HEADER.size + length + 4
                        f.seek(offset)
            except FileNotFoundError:
                raise DataError(f"{path}: missing; {os.path.join(self.path, LENGTH_FILE)} promises {total} records "
                                f"of {per_file} per file") from None
        if len(index) != total:
            raise DataError(f"{self.path}: holds {len(index)} records, {LENGTH_FILE} says {total} (files truncated "
                            f"or from another run)")
        self._index = index

    def _record(self, j: int) -> np.ndarray:
        if j in self._cache:
            return self._cache[j]
        path, offset, length = self._index[j]
        with open(path, "rb") as f:
            f.seek(offset)
            payload = f.read(length)
        try:
            if self.meta["ragged"]:
                splits, ids = parse_rows(payload, "int32", ragged=True)
                rows = _padded(splits, ids, self.max_hotness, path, self.features[0], j * self.prebatch_size)
            else:
                rows = parse_rows(payload, self.meta["dtype"], ragged=False)
        except DataError:
            raise
        except Exception as e:   # protobuf DecodeError, tf OpError, a reshape of the wrong size
            raise DataError(f"{path}: record {j} of feature(s) {self.features} cannot be parsed as "
                            f"{'ragged ' if self.meta['ragged'] else ''}{self.meta['dtype']}: {e}") from None
        expect = min(self.prebatch_size, self.num_rows - j * self.prebatch_size)
        if len(rows) != expect:
            raise DataError(f"{path}: record {j} of feature(s) {self.features} holds {len(rows)} rows, expected "
                            f"{expect}")
        self._cache = {j: rows}   # batches walk forward: the next batch usually starts in this record
        return rows

    def read(self, start: int, stop: int) -> np.ndarray:
        self.open()
        p = self.prebatch_size
        parts = []
        for j in range(start // p, (stop - 1) // p + 1 if stop > start else start // p):
            rows = self._record(j)
            lo, hi = max(start - j * p, 0), min(stop - j * p, len(rows))
            parts.append(rows[lo:hi])
        return parts[0] if len(parts) == 1 else np.concatenate(parts)


def _padded(splits: np.ndarray, ids: np.ndarray, width: int, path: str, feature: str, first_row: int):
    """Ragged rows -> int32 ``[r, width]`` padded with -1; a row longer than ``width`` is an error."""
    lengths = np.diff(splits)
    if len(lengths) and lengths.max() > width:
        row = int(np.argmax(lengths > width))
        raise DataError(f"{path}: multi-hot feature {feature!r} row {first_row + row} has {lengths[row]} ids, more "
                        f"than max_hotness={width} of the spec")
    if len(lengths) and lengths.min() == width:   # fixed hotness: no padding needed
        return ids.reshape(len(lengths), width)
    out = np.full((len(lengths), width), PAD, dtype=np.int32)
    out[np.arange(width)[None, :] < lengths[:, None]] = ids
    return out


class SplitTFRecordsDataset(SpecPipeline):
    """One split of a split_tfrecords dataset; see the module docstring."""

    def __init__(self, spec, mapping: str, **kwargs):
        super().__init__(spec, mapping, **kwargs)
        groups: Dict[str, RecordGroup] = {}
        owner: Dict[str, tuple] = {}
        for i, chunk in enumerate(spec.source_spec[mapping]):
            if chunk["type"] != CHUNK_TYPE:
                raise DataError(f"{spec.origin}: source_spec.{mapping}[{i}] has type {chunk['type']!r}; "
                                f"--dataset_type split_tfrecords reads {CHUNK_TYPE} chunks only (tf_raw reads "
                                f"split_binary/csv/parquet)")
            directory = spec.resolve_file(chunk["files"][0])
            hot = spec.max_hotness(chunk["features"][0]) if len(chunk["features"]) == 1 else 1
            groups[directory] = RecordGroup(directory, chunk["features"], hot)
            for col, f in enumerate(chunk["features"]):
                owner[f] = (directory, col)
        missing = [f for f in self.metadata.categorical_features + self.metadata.numerical_features + [self.label]
                   if f not in owner]
        if missing:
            raise DataError(f"{spec.origin}: split {mapping!r} stores no directory for feature(s) {missing}")
        rows = {d: g.num_rows for d, g in groups.items()}
        if len(set(rows.values())) > 1:
            listing = "; ".join(f"{os.path.basename(d)}: {n}" for d, n in rows.items())
            raise DataError(f"{self.name}: the feature directories disagree on the number of rows ({listing})")
        self.num_rows = next(iter(rows.values()))
        tables = (range(self.metadata.num_tables) if self._input_tables_arg is None
                  else sorted({int(t) for t, _ in self._input_tables_arg}))
        needed = {owner[self.metadata.categorical_features[t]][0] for t in tables
                  if 0 <= t < self.metadata.num_tables}
        needed |= {owner[f][0] for f in self.metadata.numerical_features + [self.label]}
        for d in needed:
            groups[d].open()
        self._groups = {d: g for d, g in groups.items() if d in needed}
        self._owner = owner
        self._finish_init()

    @property
    def opened_files(self) -> List[str]:
        return sorted(self._groups)

    def _source_of(self, feature: str) -> str:
        return self._owner.get(feature, (self.name,))[0]

    def _read_numerical(self, start, stop):
        parts = {}
        out = np.empty((stop - start, len(self.metadata.numerical_features)), np.float32)
        for j, f in enumerate(self.metadata.numerical_features):
            d, col = self._owner[f]
            if d not in parts:
                block = self._groups[d].read(start, stop)
                parts[d] = block.reshape(len(block), -1)
            out[:, j] = parts[d][:, col]
        return out

    def _read_labels(self, start, stop):
        d, _ = self._owner[self.label]
        return self._groups[d].read(start, stop).reshape(-1)

    def _read_categorical(self, table, start, stop):
        d, _ = self._owner[self.metadata.categorical_features[table]]
        return self._groups[d].read(start, stop)
