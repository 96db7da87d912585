"""Raw feature values -> the ids and numbers a served model takes, exactly as preprocessing mapped them in training.

A request to a served model normally carries what our preprocessing produced (categorical ids, transformed
numericals). These mappers take the raw values instead, and map them with what the preprocessing saved beside its
dataset, so a served prediction on a raw row equals the framework's on the preprocessed row:

======================  =========================================  ====================================================
dataset (saved by)      raw inputs (per row)                       mapping
======================  =========================================  ====================================================
Criteo (``criteo``      ``raw_integer`` BYTES [13]: I1..I13 as      integers by the engines' text rules (``260``,
engines:                text, ``""`` missing;                       ``260.0``, ``2.6e2``), ``log(double(x) + 3)`` ->
``dictionaries/``)      ``raw_categorical`` BYTES [26]: C1..C26,    float32 -> float16 for x > -3, else 0; missing -> 0.
                        ``""`` missing                              Categoricals through ``dictionaries/<i>.parquet``:
                                                                    missing -> 0, rare or unseen -> 1.
a click log             ``raw_categorical`` BYTES [n_cat],          ``prepare_clicks.ClickEncoder`` (the dataset's
(``prepare_clicks``)    ``raw_numerical`` BYTES [n_num], in the     dictionaries and numerical transform/statistics)
                        order of ``prepare_clicks.json``
NCF / MovieLens ids     ``user``, ``item`` INT64 [1] (BYTES when    ``user_ids.parquet`` / ``item_ids.parquet``; an id
(``convert.py``)        the input's ids were text)                  the training data never had is an error naming
                                                                    the row (NeuMF has no embedding for it, and
                                                                    training had no rule for one)
MovieLens-1M CTR        ``UserID``, ``MovieID``, ``Timestamp``      the user's and movie's features by raw id
(``movielens_ctr``:     INT64 [1]                                   (``raw_features/``), the movie's age at the
``raw_features/``)                                                  rating's time, as ``build_columns`` computed them
Wide & Deep MovieLens   ``userId``, ``movieId`` INT64 [1]           the ETL's fitted workflow (``workflow/``): ids by
(its ETL: ``workflow/``)                                            its vocabularies (2 unseen), the movie's genres
                                                                    joined and encoded, -1 padded
======================  =========================================  ====================================================

Why integers travel as text: a raw row's fields are text (the engines parse them), a missing integer is an empty
field, and JSON (curl) has no NaN; text is also exact for every integer the engines accept. A value the engines
would have refused (``2.5``, ``abc``) is a ``RawFeatureError`` naming the row, the column and the value, as training
excluded such a row.

    mapper = load_raw_mapper("/data/criteo_binary")          # or the copy inside a served model's directory
    ids = mapper.map({"raw_integer": [["1", "", "5", ...]], "raw_categorical": [["68fd1e64", "", ...]]})
    ids["numerical"], ids["categorical"]                      # float32 [1, 13], int64 [1, 26]

``mapper.files()`` are the dataset files a mapper needs (copied into the Triton model's directory by
``raw_ensemble``); ``load_raw_mapper`` reads them back from that copy alone.
"""
from __future__ import annotations

import json
import os
import shutil
from typing import Any, Dict, List, Mapping, Optional, Sequence

import numpy as np

from recsys_common.cli import InputError
from ..criteo import MISSING_ID, NUM_CATEGORICAL, NUM_NUMERICAL
from ..criteo.dictionaries import (CRITEO_RULE_FILE, DICTIONARY_DIRECTORY, DictionaryLookup, load_criteo_rule,
                                   load_dictionaries)
from .model_config import TensorSpec

RAW_INTEGER, RAW_CATEGORICAL, RAW_NUMERICAL = "raw_integer", "raw_categorical", "raw_numerical"
NCF_ID_FILES = {"user": "user_ids.parquet", "item": "item_ids.parquet"}   # written by PyTorch/NCF convert.py
RAW_FILES_DIRECTORY = "raw_features"   # where a served preprocessing model keeps its copy of the mapping's files


class RawFeatureError(InputError):
    """A raw value that cannot be mapped (malformed, of an unknown id) or a dataset without what mapping needs; the
    message names the row, the input and column, and the value (or the file)."""


def _as_text(values: Any, name: str, width: int) -> np.ndarray:
    """A request's BYTES / string input -> an object array of ``str`` [B, width] (UTF-8, invalid bytes replaced, as
    the engines read the raw files)."""
    array = np.asarray(values, dtype=object)
    if array.ndim == 1 and width == 1:
        array = array[:, None]
    if array.ndim != 2 or array.shape[1] != width:
        raise RawFeatureError(f"input {name!r}: expected shape [batch, {width}], got {list(array.shape)}")
    out = np.empty(array.shape, dtype=object)
    for index, value in np.ndenumerate(array):
        if isinstance(value, (bytes, bytearray, np.bytes_)):
            out[index] = bytes(value).decode("utf-8", "replace")
        elif isinstance(value, str):
            out[index] = value
        else:
            raise RawFeatureError(f"input {name!r}: row {index[0]}, column {index[1]}: expected text (BYTES), got "
                                  f"{type(value).__name__} {value!r}")
    return out


def _required(inputs: Mapping[str, Any], names: Sequence[str]) -> None:
    missing = [n for n in names if n not in inputs]
    if missing:
        raise RawFeatureError(f"raw request: missing input(s) {missing}; expected {list(names)}")


class CriteoRawMapper:
    """Criteo's 13 integer and 26 categorical raw fields -> ``numerical`` float32 [B, 13], ``categorical`` int64
    [B, 26], through a dataset's ``dictionaries/`` (both Criteo engines save them)."""

    kind = "criteo"

    def __init__(self, directory: str):
        self.rule = load_criteo_rule(directory)
        self.directory = directory
        self.lookups = [DictionaryLookup(d) for d in load_dictionaries(directory, NUM_CATEGORICAL)]
        self.integer_columns = self.rule["numerical"]["raw_columns"]
        self.categorical_columns = self.rule["categorical"]["raw_columns"]

    def raw_inputs(self) -> List[TensorSpec]:
        return [TensorSpec(RAW_INTEGER, "object", [NUM_NUMERICAL]),
                TensorSpec(RAW_CATEGORICAL, "object", [NUM_CATEGORICAL])]

    def files(self) -> List[str]:
        return [os.path.join(DICTIONARY_DIRECTORY, CRITEO_RULE_FILE)] + [
            os.path.join(DICTIONARY_DIRECTORY, f"{i}.parquet") for i in range(NUM_CATEGORICAL)]

    def map(self, inputs: Mapping[str, Any]) -> Dict[str, np.ndarray]:
        _required(inputs, [RAW_INTEGER, RAW_CATEGORICAL])
        integers = _as_text(inputs[RAW_INTEGER], RAW_INTEGER, NUM_NUMERICAL)
        categorical = _as_text(inputs[RAW_CATEGORICAL], RAW_CATEGORICAL, NUM_CATEGORICAL)
        if len(integers) != len(categorical):
            raise RawFeatureError(f"raw request: {RAW_INTEGER} has {len(integers)} rows, {RAW_CATEGORICAL} "
                                  f"{len(categorical)}")
        return {"numerical": self._numerical(integers), "categorical": self._categorical(categorical)}

    def _numerical(self, text: np.ndarray) -> np.ndarray:
        """The engines' rules: ``polars_preprocess.integral_value`` parses, ``log_numerical`` transforms."""
        import polars as pl
        from ..criteo.polars_preprocess import integral_value, log_numerical
        rows = len(text)
        frame = pl.DataFrame({c: pl.Series(c, text[:, j].tolist(), dtype=pl.Utf8)
                              for j, c in enumerate(self.integer_columns)})
        present = frame.select(pl.all() != "").to_numpy().reshape(rows, NUM_NUMERICAL)
        parsed = frame.select([integral_value(pl.col(c)).alias(c) for c in self.integer_columns])
        numbers = parsed.fill_null(0).to_numpy().astype(np.int64).reshape(rows, NUM_NUMERICAL)
        bad = present & parsed.select(pl.all().is_null()).to_numpy().reshape(rows, NUM_NUMERICAL)
        if bad.any():
            row, column = (int(i) for i in np.argwhere(bad)[0])
            raise RawFeatureError(f"{RAW_INTEGER}: row {row}, column {self.integer_columns[column]}: "
                                  f"{text[row, column]!r} is not an integer (training excluded such rows; "
                                  f"{int(bad.sum())} value(s) in this request)")
        return log_numerical(numbers, present).astype(np.float32)

    def _categorical(self, text: np.ndarray) -> np.ndarray:
        import polars as pl
        ids = np.full(text.shape, MISSING_ID, dtype=np.int64)
        for c, lookup in enumerate(self.lookups):
            present = np.flatnonzero(text[:, c] != "")
            if len(present):
                ids[present, c] = lookup.ids(pl.Series(text[present, c].tolist(), dtype=pl.Utf8))
        return ids


class ClickLogRawMapper:
    """A ``prepare_clicks`` dataset's raw columns -> ``numerical`` float32 [B, n_num], ``categorical`` int64
    [B, n_cat], by its ``ClickEncoder`` (the saved dictionaries, numerical transform and statistics)."""

    kind = "clicks"

    def __init__(self, directory: str):
        from ..prepare_clicks import ClickEncoder
        self.directory = directory
        self.encoder = ClickEncoder.load(directory)
        self.categorical_columns = list(self.encoder.config["categorical"])
        self.numerical_columns = list(self.encoder.config["numerical"])
        # The dtype the dataset stores the numericals in (float16 for the log transform, as NVIDIA's numerical.bin):
        # ClickEncoder.encode gives float32 before that rounding, and the model trained on the rounded values.
        from ..feature_spec import FeatureSpec
        spec = FeatureSpec.from_yaml(os.path.join(directory, "feature_spec.yaml"))
        names = self.encoder.config["features"]["numerical"]
        self.numerical_dtype = spec.numpy_dtype(names[0]) if names else np.float32

    def raw_inputs(self) -> List[TensorSpec]:
        return [TensorSpec(RAW_CATEGORICAL, "object", [len(self.categorical_columns)]),
                TensorSpec(RAW_NUMERICAL, "object", [len(self.numerical_columns)])]

    def files(self) -> List[str]:
        from ..prepare_clicks import REPORT_NAME
        return [REPORT_NAME, "feature_spec.yaml"] + [os.path.join(DICTIONARY_DIRECTORY, f"{i}.parquet")
                                for i in range(len(self.categorical_columns))]

    def map(self, inputs: Mapping[str, Any]) -> Dict[str, np.ndarray]:
        from ..prepare_clicks import ClickLogError
        _required(inputs, [RAW_CATEGORICAL, RAW_NUMERICAL])
        categorical = _as_text(inputs[RAW_CATEGORICAL], RAW_CATEGORICAL, len(self.categorical_columns))
        numerical = _as_text(inputs[RAW_NUMERICAL], RAW_NUMERICAL, len(self.numerical_columns))
        if len(categorical) != len(numerical):
            raise RawFeatureError(f"raw request: {RAW_CATEGORICAL} has {len(categorical)} rows, {RAW_NUMERICAL} "
                                  f"{len(numerical)}")
        columns = {c: categorical[:, j].tolist() for j, c in enumerate(self.categorical_columns)}
        columns.update({c: numerical[:, j].tolist() for j, c in enumerate(self.numerical_columns)})
        try:
            encoded = self.encoder.encode(columns)
        except ClickLogError as e:
            raise RawFeatureError(str(e)) from None
        numerical = encoded["numerical"].astype(self.numerical_dtype).astype(np.float32)
        return {"numerical": numerical, "categorical": encoded["categorical"]}


class IdRawMapper:
    """Raw user and item ids -> the codes NCF trained on, through ``user_ids.parquet`` / ``item_ids.parquet``
    (``raw, id``). An id not in a mapping is an error naming the row and the id."""

    kind = "ids"

    def __init__(self, directory: str):
        # Polars, not pyarrow: Triton's Python stub runs numpy 1.x, which this pyarrow refuses.
        import polars as pl
        self.directory = directory
        self.tables: Dict[str, Dict[str, np.ndarray]] = {}
        for name, file in NCF_ID_FILES.items():
            path = os.path.join(directory, file)
            try:
                table = pl.read_parquet(path, columns=["raw", "id"])
            except (OSError, pl.exceptions.PolarsError) as e:
                raise RawFeatureError(f"{path}: cannot read the raw {name} id mapping ({e}); write the dataset with "
                                      f"PyTorch/NCF convert.py of this version") from None
            raw = table["raw"].to_numpy()
            raw = raw if raw.dtype.kind in "iu" else raw.astype(str)
            order = np.argsort(raw, kind="stable")
            self.tables[name] = {"raw": raw[order], "id": table["id"].to_numpy()[order].astype(np.int64)}

    def raw_inputs(self) -> List[TensorSpec]:
        return [TensorSpec(name, "int64" if t["raw"].dtype.kind in "iu" else "object", [1])
                for name, t in self.tables.items()]

    def files(self) -> List[str]:
        return list(NCF_ID_FILES.values())

    def map(self, inputs: Mapping[str, Any]) -> Dict[str, np.ndarray]:
        _required(inputs, list(self.tables))
        out = {}
        for name, table in self.tables.items():
            numeric = table["raw"].dtype.kind in "iu"
            raw = np.asarray(inputs[name]) if numeric else _as_text(inputs[name], name, 1)
            raw = raw.reshape(len(raw), -1) if raw.ndim else raw.reshape(1, 1)
            if raw.shape[1:] != (1,):
                raise RawFeatureError(f"input {name!r}: expected shape [batch, 1], got {list(raw.shape)}")
            if numeric and raw.dtype.kind not in "iu":
                raise RawFeatureError(f"input {name!r}: expected integer ids (INT64), got {raw.dtype}")
            keys = raw[:, 0].astype(np.int64) if numeric else raw[:, 0].astype(str)
            known = table["raw"] if numeric else table["raw"].astype(str)
            at = np.minimum(np.searchsorted(known, keys), max(len(known) - 1, 0))
            found = (known[at] == keys) if len(known) else np.zeros(len(keys), bool)
            if not found.all():
                row = int(np.flatnonzero(~found)[0])
                raise RawFeatureError(f"input {name!r}: row {row}: {name} id {keys[row].item()!r} is not in the "
                                      f"training data's mapping ({NCF_ID_FILES[name]}; {int((~found).sum())} unknown "
                                      f"in this request)")
            out[name] = table["id"][at][:, None]
        return out


class MovieLensWorkflowRawMapper:
    """Raw MovieLens ratings (``userId``, ``movieId`` INT64 [1]) -> the Wide & Deep MovieLens model's inputs,
    through the fitted workflow its ETL saved (``workflow/``: ``workflow.json``, ``vocab.<column>.parquet``,
    ``movies.parquet``; format ``wide_deep.movielens.workflow`` version 1): ids by the vocabularies (index 3 + k;
    2 for a value training never saw), ``genres`` the movie's genres joined from the movies table, encoded the same
    way and padded with -1 to the widest movie (``max_hotness``). Read here from the files (Polars and numpy): the
    recipe's own ``MovieLensWorkflow`` needs pyarrow, which Triton's numpy-1.x stub cannot import."""

    kind = "movielens_workflow"
    FORMAT, VERSION, DIRECTORY = "wide_deep.movielens.workflow", 1, "workflow"
    COLUMNS = ("userId", "movieId", "genres")

    def __init__(self, directory: str):
        import polars as pl
        self.directory = directory
        base = os.path.join(directory, self.DIRECTORY)
        path = os.path.join(base, "workflow.json")
        with open(path, encoding="utf-8") as f:
            spec = json.load(f)
        if spec.get("format") != self.FORMAT or spec.get("version") != self.VERSION:
            raise RawFeatureError(f"{path}: format {spec.get('format')!r} version {spec.get('version')!r}, expected "
                                  f"{self.FORMAT!r} version {self.VERSION}")
        self.oov, self.first = int(spec["indices"]["oov"]), int(spec["indices"]["first"])
        self.vocabularies = {}
        for name in self.COLUMNS:
            values = pl.read_parquet(os.path.join(base, f"vocab.{name}.parquet"), columns=[name])[name]
            self.vocabularies[name] = {v: self.first + k for k, v in enumerate(values.to_list())}
        movies = pl.read_parquet(os.path.join(base, "movies.parquet"), columns=["movieId", "genres"])
        self.movie_genres = dict(zip(movies["movieId"].to_list(), movies["genres"].to_list()))
        self.max_hotness = max([len(g or []) for g in self.movie_genres.values()] + [1])

    def raw_inputs(self) -> List[TensorSpec]:
        return [TensorSpec("userId", "int64", [1]), TensorSpec("movieId", "int64", [1])]

    def files(self) -> List[str]:
        return [os.path.join(self.DIRECTORY, name) for name in
                ["workflow.json", "movies.parquet"] + [f"vocab.{c}.parquet" for c in self.COLUMNS]]

    def map(self, inputs: Mapping[str, Any]) -> Dict[str, np.ndarray]:
        _required(inputs, ["userId", "movieId"])
        ids = {}
        for name in ("userId", "movieId"):
            raw = np.asarray(inputs[name])
            if raw.dtype.kind not in "iu" or raw.ndim != 2 or raw.shape[1] != 1:
                raise RawFeatureError(f"input {name!r}: expected integer ids (INT64) of shape [batch, 1], got "
                                      f"{raw.dtype} {list(raw.shape)}")
            vocabulary = self.vocabularies[name]
            ids[name] = np.array([[vocabulary.get(int(v), self.oov)] for v in raw[:, 0]], dtype=np.int64)
        genres = np.full((len(ids["movieId"]), self.max_hotness), -1, dtype=np.int64)
        vocabulary = self.vocabularies["genres"]
        for row, movie in enumerate(np.asarray(inputs["movieId"])[:, 0].tolist()):
            names = self.movie_genres.get(movie) or []
            genres[row, :len(names)] = [vocabulary.get(g, self.oov) for g in names]
        return {"userId": ids["userId"], "movieId": ids["movieId"], "genres": genres}


class MovieLensCtrRawMapper:
    """A raw MovieLens-1M rating (``UserID``, ``MovieID``, ``Timestamp`` INT64 [1]) -> the ``categorical`` and
    ``numerical`` inputs of a ``recsys_common.movielens_ctr`` dataset's model, computed as ``build_columns`` did from
    the dataset's ``raw_features/`` tables (a user's and a movie's features by raw id; the movie's age at the rating's
    time), numericals rounded to the dataset's dtype. A UserID or MovieID the users / movies files lacked is an error
    naming the row (the dataset has no id for it)."""

    kind = "movielens_ctr"
    DIRECTORY = "raw_features"
    FORMAT = "recsys_common.movielens_ctr/1"
    _SECONDS_PER_YEAR = 365.2425 * 86400.0

    def __init__(self, directory: str):
        import polars as pl
        from ..feature_spec import FeatureSpec
        self.directory = directory
        base = os.path.join(directory, self.DIRECTORY)
        with open(os.path.join(base, "movielens_ctr.json"), encoding="utf-8") as f:
            self.config = json.load(f)
        if self.config.get("format") != self.FORMAT:
            raise RawFeatureError(f"{base}/movielens_ctr.json: format {self.config.get('format')!r}, expected "
                                  f"{self.FORMAT!r}")
        self.users = pl.read_parquet(os.path.join(base, "users.parquet")).sort("UserID")
        self.movies = pl.read_parquet(os.path.join(base, "movies.parquet")).sort("MovieID")
        spec = FeatureSpec.from_yaml(os.path.join(directory, "feature_spec.yaml"))
        self.numerical_dtype = spec.numpy_dtype(self.config["numerical"][0])

    def raw_inputs(self) -> List[TensorSpec]:
        return [TensorSpec(name, "int64", [1]) for name in ("UserID", "MovieID", "Timestamp")]

    def files(self) -> List[str]:
        return ["feature_spec.yaml"] + [os.path.join(self.DIRECTORY, name) for name in
                                        ("movielens_ctr.json", "users.parquet", "movies.parquet")]

    def _rows(self, table, key: str, raw: np.ndarray) -> np.ndarray:
        ids = table[key].to_numpy()
        at = np.minimum(np.searchsorted(ids, raw), max(len(ids) - 1, 0))
        missing = np.flatnonzero(ids[at] != raw) if len(ids) else np.arange(len(raw))
        if len(missing):
            raise RawFeatureError(f"input {key!r}: row {int(missing[0])}: {key} {int(raw[missing[0]])} is not in the "
                                  f"dataset's {key.replace('ID', '').lower()}s file ({len(missing)} in this request)")
        return at

    def map(self, inputs: Mapping[str, Any]) -> Dict[str, np.ndarray]:
        _required(inputs, ["UserID", "MovieID", "Timestamp"])
        raw = {}
        for name in ("UserID", "MovieID", "Timestamp"):
            array = np.asarray(inputs[name])
            if array.dtype.kind not in "iu" or array.ndim != 2 or array.shape[1] != 1:
                raise RawFeatureError(f"input {name!r}: expected integers (INT64) of shape [batch, 1], got "
                                      f"{array.dtype} {list(array.shape)}")
            raw[name] = array[:, 0].astype(np.int64)
        users = self.users[self._rows(self.users, "UserID", raw["UserID"])]
        movies = self.movies[self._rows(self.movies, "MovieID", raw["MovieID"])]
        release = movies["year"].to_numpy()
        rating_year = 1970.0 + raw["Timestamp"] / self._SECONDS_PER_YEAR
        movie_age = np.where(np.isnan(release), 0.0, np.clip(rating_year - release, 0.0, None) / 10.0)
        values = {"movie_year": movies["year_z"].to_numpy(), "movie_age": movie_age,
                  "genre_count": movies["genre_count"].to_numpy() / 6.0}
        numerical = np.stack([values[n].astype(self.numerical_dtype) for n in self.config["numerical"]], axis=1)
        features = {n: users[n].to_numpy() for n in users.columns} | {n: movies[n] for n in movies.columns}
        if self.config["genres"] == "slots":
            categorical = np.stack([np.asarray(features[n], np.int64) for n in self.config["categorical"]], axis=1)
            return {"numerical": numerical.astype(np.float32), "categorical": categorical}
        out = {n: np.asarray(features[n], np.int64)[:, None] for n in self.config["categorical"] if n != "genres"}
        out["genres"] = np.array(features["genres"].to_list(), dtype=np.int64)
        out["numerical"] = numerical.astype(np.float32)
        return out


def load_raw_mapper(directory: str):
    """The mapper for the dataset (or the copy of its files) in ``directory``: Criteo when it has
    ``dictionaries/criteo.json``, a click log when it has ``prepare_clicks.json``, NCF ids when it has
    ``user_ids.parquet``. ``RawFeatureError`` naming the directory otherwise."""
    from ..prepare_clicks import REPORT_NAME
    if os.path.isfile(os.path.join(directory, DICTIONARY_DIRECTORY, CRITEO_RULE_FILE)):
        return CriteoRawMapper(directory)
    if os.path.isfile(os.path.join(directory, REPORT_NAME)):
        return ClickLogRawMapper(directory)
    if os.path.isfile(os.path.join(directory, NCF_ID_FILES["user"])):
        return IdRawMapper(directory)
    if os.path.isfile(os.path.join(directory, MovieLensWorkflowRawMapper.DIRECTORY, "workflow.json")):
        return MovieLensWorkflowRawMapper(directory)
    if os.path.isfile(os.path.join(directory, MovieLensCtrRawMapper.DIRECTORY, "movielens_ctr.json")):
        return MovieLensCtrRawMapper(directory)
    raise RawFeatureError(f"{directory}: no saved raw-value mapping (dictionaries/{CRITEO_RULE_FILE} of the Criteo "
                          f"engines, {REPORT_NAME} of prepare_clicks, {NCF_ID_FILES['user']} of NCF's convert.py, "
                          f"workflow/workflow.json of Wide & Deep's MovieLens ETL, or raw_features/movielens_ctr.json "
                          f"of recsys_common.movielens_ctr)")


def copy_mapping_files(mapper, target: str) -> None:
    """Copy ``mapper.files()`` from its dataset into ``target`` (the same relative paths), for ``load_raw_mapper``
    to read there."""
    for relative in mapper.files():
        destination = os.path.join(target, relative)
        os.makedirs(os.path.dirname(destination), exist_ok=True)
        shutil.copyfile(os.path.join(mapper.directory, relative), destination)


def model_inputs(mapped: Mapping[str, np.ndarray], targets: Sequence[TensorSpec]) -> Dict[str, np.ndarray]:
    """A mapper's output arranged as a served model's inputs ``targets``: a name the mapper gives is taken whole,
    ``cat_<t>`` (TensorFlow2 DLRM/DCNv2's one input per feature) is column ``t`` of ``categorical``; each is cast to
    the target's dtype. ``RawFeatureError`` when a target input cannot be made."""
    out = {}
    for spec in targets:
        if spec.name in mapped:
            value = mapped[spec.name]
        elif spec.name.startswith("cat_") and spec.name[4:].isdigit() and "categorical" in mapped:
            value = mapped["categorical"][:, int(spec.name[4:])][:, None]
        else:
            raise RawFeatureError(f"served input {spec.name!r}: the raw mapping gives {sorted(mapped)}, not this")
        out[spec.name] = np.ascontiguousarray(value, dtype=np.dtype(spec.dtype))
    return out


def describe(mapper) -> Dict[str, Optional[Any]]:
    """What a raw ensemble's preprocessing model records about its mapping (in its ``recsys_serving.json``)."""
    return {"kind": mapper.kind, "files": mapper.files(),
            "raw_inputs": [{"name": s.name, "dtype": "bytes" if s.dtype == "object" else s.dtype, "dims": list(s.dims)}
                           for s in mapper.raw_inputs()]}

