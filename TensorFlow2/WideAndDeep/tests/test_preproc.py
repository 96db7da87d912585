"""The Outbrain ETL on its default engine (pandas/numpy, no NVTabular): output schema = feature_spec, reloadable
fitted statistics, and feature values checked against pandas on a tiny hand-made input (CTR with thresholds, days
since published, list slicing). Equality with ``--engine nvtabular``: tests/test_etl_engines.py."""
import os

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from conftest import ETL_OPTIONS
from recsys_common.datasets import open_reader
from recsys_common.feature_spec import FeatureSpec
from wide_deep.data.outbrain import features as F
from wide_deep.data.outbrain import raw
from wide_deep.data.outbrain.generator import write_tables
from wide_deep.data.outbrain.preproc import run_etl


def read_mapping(spec, mapping):
    """All rows of a mapping, files in spec order (= row order)."""
    chunk = spec.source_spec[mapping][0]
    return pd.concat([pd.read_parquet(spec.resolve_file(f)) for f in chunk["files"]], ignore_index=True)


def test_output_schema_is_the_feature_spec(etl_single, raw_outbrain):
    spec = FeatureSpec.from_yaml(os.path.join(etl_single, "feature_spec.yaml"), check_files=True)
    assert set(spec.source_spec) == {"train", "test"}
    assert spec.channel_spec["onehot_categorical"] == F.ONEHOT_FEATURES
    assert spec.channel_spec["multihot_categorical"] == F.MULTIHOT_FEATURES
    assert spec.channel_spec["numerical"] == F.NUMERICAL_FEATURES
    assert spec.channel_spec["label"] == ["clicked"] and spec.channel_spec["map"] == ["display_id"]
    arrow_type = {"int32": "int32", "int64": "int64", "float32": "float"}
    rows = 0
    for mapping in ("train", "test"):
        chunk = spec.source_spec[mapping][0]
        assert chunk["type"] == "parquet" and len(chunk["files"]) == 2
        for f in chunk["files"]:
            schema = pq.read_schema(spec.resolve_file(f))
            assert sorted(schema.names) == sorted(chunk["features"]) == sorted(F.OUTPUT_COLUMNS)
            for name in schema.names:
                want = arrow_type[str(spec.numpy_dtype(name))]
                got = str(schema.field(name).type)
                assert got == (f"list<item: {want}>" if spec.max_hotness(name) > 1 else want), name
        df = read_mapping(spec, mapping)
        assert len(df) == spec.metadata["rows"][mapping]
        rows += len(df)
        for name in F.ONEHOT_FEATURES:
            assert df[name].between(0, spec.cardinality(name) - 1).all(), name
        for name in F.MULTIHOT_FEATURES:
            lengths = df[name].map(len)
            assert lengths.max() <= spec.max_hotness(name) == 3, name
            values = np.concatenate(df[name].to_list())
            assert values.min() >= 0 and values.max() < spec.cardinality(name), name
        assert df["topic_id_list"].map(len).max() == 3   # pages have up to 5 topics: sliced
        assert df[F.NUMERICAL_FEATURES].notna().all().all()
        assert set(df["clicked"]) == {0, 1}
    assert rows == len(raw.read_raw_table(raw_outbrain, "clicks_train"))
    valid = read_mapping(spec, "test")
    assert valid["display_id"].is_monotonic_increasing
    # NVTabular's file list (for HugeCTR) names the final files, not the staging directory they were written in.
    with open(os.path.join(etl_single, "valid", "_file_list.txt")) as f:
        listed = f.read().split()
    assert listed[1:] == [spec.resolve_file(f) for f in spec.source_spec["test"][0]["files"]]
    # Each display lies wholly in train or in valid, and keeps its one click.
    train = read_mapping(spec, "train")
    assert not set(train["display_id"]) & set(valid["display_id"])
    assert (valid.groupby("display_id")["clicked"].sum() == 1).all()
    # The project's FeatureSpec reader reads it, multi-hot padded with -1 to max_hotness.
    batch = next(iter(open_reader(spec, "test", batch_size=64)))
    assert [a.shape for a in batch["multihot_categorical"]] == [(64, 3)] * 3
    assert batch["numerical"].shape == (64, 13) and batch["onehot_categorical"].shape == (64, 13)


def test_output_equals_the_in_memory_etl(etl_single, raw_outbrain, tmp_path):
    """The whole ETL against the in-memory one, rebuilt here: all seven tables read whole, stage 1 on them
    (``join_and_split``), the joined rows cut with ``numpy.array_split``, stage 2 fitted on them and applied
    (:mod:`wide_deep.data.outbrain.engine`). Same rows, values and dtypes, same feature spec."""
    import pyarrow as pa
    from test_preproc_dask import assert_same_rows
    from wide_deep.data.outbrain import engine
    from wide_deep.data.outbrain.tables import document_tables, join_and_split
    tables = raw.read_raw_tables(raw_outbrain)
    train, valid = join_and_split(tables, seed=ETL_OPTIONS["seed"])
    pages = np.concatenate([train["document_id"].to_numpy(), valid["document_id"].to_numpy()])
    lists, matrices = document_tables(tables, pages)
    paths = {}
    for mapping, df in (("train", train), ("test", valid)):
        paths[mapping] = []
        for i, rows in enumerate(np.array_split(np.arange(len(df)), ETL_OPTIONS["num_partitions"])):
            paths[mapping].append(str(tmp_path / f"{mapping}_{i}.parquet"))
            pq.write_table(pa.Table.from_pandas(df.iloc[rows], preserve_index=False), paths[mapping][-1])
    engine.fit(paths["train"], lists, matrices, str(tmp_path / "workflow"))
    spec = FeatureSpec.from_yaml(os.path.join(etl_single, "feature_spec.yaml"))
    for mapping in ("train", "test"):
        out = tmp_path / f"out_{mapping}"
        engine.transform(paths[mapping], str(tmp_path / "workflow"), str(out), ETL_OPTIONS["num_partitions"])
        want = pd.concat([pd.read_parquet(out / f"part_{i}.parquet") for i in range(ETL_OPTIONS["num_partitions"])],
                         ignore_index=True)
        assert_same_rows(read_mapping(spec, mapping), want)
    assert spec.metadata["rows"] == {"train": len(train), "test": len(valid)}


def test_saved_workflow_reloads_and_reproduces(etl_single, raw_outbrain):
    """``workflow/`` holds the fitted statistics (JSON, parquet, npz: no pickle); ``load_fitted(path).transform``
    turns new joined rows into the written rows."""
    from wide_deep.data.outbrain.engine import load_fitted
    from wide_deep.data.outbrain.tables import join_and_split
    names = sorted(os.listdir(os.path.join(etl_single, "workflow")))
    assert not [n for n in names if n.endswith((".pkl", ".pickle"))], names
    fitted = load_fitted(os.path.join(etl_single, "workflow"))
    _, valid = join_and_split(raw.read_raw_tables(raw_outbrain), seed=ETL_OPTIONS["seed"])
    again = fitted.transform(valid.iloc[:200])
    assert set(again.columns) == set(F.OUTPUT_COLUMNS)
    spec = FeatureSpec.from_yaml(os.path.join(etl_single, "feature_spec.yaml"))
    written = read_mapping(spec, "test").iloc[:200]
    for name in F.ONEHOT_FEATURES + ["display_id", "clicked"]:
        np.testing.assert_array_equal(again[name].to_numpy(), written[name].to_numpy(), err_msg=name)
    np.testing.assert_allclose(again[F.NUMERICAL_FEATURES].to_numpy(), written[F.NUMERICAL_FEATURES].to_numpy(),
                               rtol=1e-6)
    for name in F.MULTIHOT_FEATURES:
        assert [list(v) for v in again[name]] == [list(v) for v in written[name]], name


# ------------------------------------------------------------------------------------------ hand-made tiny input
DAY = F.MS_PER_DAY


def hand_made_tables():
    """40 displays of 3 ads over 8 ads; ad 1 in every display (CTR over threshold), ad 8 in 3 (under it)."""
    displays, clicks = [], []
    for d in range(1, 41):
        ads = [1, 2 + d % 6, 8] if d <= 3 else [1, 2 + d % 6, 2 + (d + 3) % 6]
        clicked = ads[d % 3]
        clicks += [(d, a, int(a == clicked)) for a in ads]
        day = d % 13          # days 11 and 12 are validation only
        displays.append((d, f"{d:014x}", 100 + d % 4, day * DAY + 3_600_000 * (d % 20), 1 + d % 3,
                         ["US>CA>803", "US>NY>501", "GB>H9", "--"][d % 4]))
    clicks = pd.DataFrame(clicks, columns=["display_id", "ad_id", "clicked"])
    events = pd.DataFrame(displays, columns=["display_id", "uuid", "document_id", "timestamp", "platform",
                                             "geo_location"])
    promoted = pd.DataFrame({"ad_id": range(1, 9), "document_id": [200 + a % 3 for a in range(1, 9)],
                             "campaign_id": [10 + a % 2 for a in range(1, 9)], "advertiser_id": 7})
    docs = [100, 101, 102, 103, 200, 201, 202]
    publish = {100: "2016-06-01 00:00:00", 101: "\\N", 102: "2030-01-01 00:00:00",   # future: negative -> 0
               103: "1990-01-01 00:00:00", 200: "2016-05-14 12:00:00", 201: "2016-06-13 00:00:00",
               202: "2015-06-14 00:00:00"}
    meta = pd.DataFrame({"document_id": docs, "source_id": [5, 5, 6, 6, 7, 8, 8],
                         "publisher_id": [1, "", 2, 2, 3, 3, 4], "publish_time": [publish[d] for d in docs]})
    topics = pd.DataFrame([(100, t, c) for t, c in [(11, 0.1), (12, 0.9), (13, 0.5), (14, 0.7), (15, 0.3)]]
                          + [(101, 12, 0.4), (101, 16, 0.8)] + [(200, 12, 0.9), (201, 13, 0.2)],
                          columns=["document_id", "topic_id", "confidence_level"])
    categories = pd.DataFrame([(100, 1403, 0.9), (101, 1403, 0.5), (200, 1403, 0.7), (202, 1702, 0.9)],
                              columns=["document_id", "category_id", "confidence_level"])
    entities = pd.DataFrame([(100, "a" * 32, 0.5), (200, "a" * 32, 0.5), (201, "b" * 32, 0.6)],
                            columns=["document_id", "entity_id", "confidence_level"])
    return {"clicks_train": clicks, "events": events, "promoted_content": promoted, "documents_meta": meta,
            "documents_categories": categories, "documents_topics": topics, "documents_entities": entities}


@pytest.fixture(scope="module")
def hand_made(tmp_path_factory):
    raw_dir = str(tmp_path_factory.mktemp("hand_made_raw"))
    write_tables(hand_made_tables(), raw_dir)
    out = str(tmp_path_factory.mktemp("hand_made_etl") / "out")
    run_etl(raw_dir, out, cpu=True, **ETL_OPTIONS)
    from wide_deep.data.outbrain.tables import join_and_split
    train, valid = join_and_split(raw.read_raw_tables(raw_dir), seed=ETL_OPTIONS["seed"])
    spec = FeatureSpec.from_yaml(os.path.join(out, "feature_spec.yaml"))
    outputs = {"train": read_mapping(spec, "train"), "test": read_mapping(spec, "test")}
    # Output rows are the joined rows in order (same display ids and labels): compare row by row.
    for joined, mapping in ((train, "train"), (valid, "test")):
        np.testing.assert_array_equal(outputs[mapping]["display_id"], joined["display_id"])
        np.testing.assert_array_equal(outputs[mapping]["clicked"], joined["clicked"])
    return {"train": train, "test": valid}, outputs


def test_ctr_with_thresholds_matches_pandas(hand_made):
    joined, outputs = hand_made
    assert 0 < len(joined["test"]) < len(joined["train"])
    for column in ("ad_id", "campaign_id", "document_id_promo", "advertiser_id"):
        stats = joined["train"].groupby(column)["clicked"].agg(["sum", "count"])
        ctr = (stats["sum"] / stats["count"]).where(stats["count"] >= F.CTR_THRESHOLDS[column], 0.0)
        for mapping in ("train", "test"):
            want = joined[mapping][column].map(ctr).fillna(0.0).to_numpy()
            np.testing.assert_allclose(outputs[mapping][f"{column}_ctr"], want, rtol=1e-6, err_msg=column)
    # The cases the thresholds make: ad 1 is in every display (a real CTR), ad 8 in 3 (under 5: CTR 0).
    ad = joined["train"]["ad_id"].to_numpy()
    assert (outputs["train"]["ad_id_ctr"][ad == 1] > 0).all()
    assert (outputs["train"]["ad_id_ctr"][ad == 8] == 0).all()
    assert 0 < (ad == 8).sum() < F.CTR_THRESHOLDS["ad_id"] <= (ad == 1).sum()


def test_days_since_published_matches_pandas(hand_made):
    joined, outputs = hand_made
    for suffix in ("", "_promo"):
        column = f"publish_time{suffix}"
        feature = f"{column}_days_since_published"
        train_days = None
        for mapping in ("train", "test"):
            j = joined[mapping]
            days = np.floor((j["timestamp"] + F.TIMESTAMP_DELTA_MS - j[column]) / DAY)
            days = days.where(days.isna() | days.between(0, 3650), 0.0)
            got = outputs[mapping][feature].to_numpy()
            known = days.notna().to_numpy()
            np.testing.assert_allclose(got[known], np.log1p(days[known]), rtol=1e-6, err_msg=feature)
            if mapping == "train":
                train_days = days.dropna()
            if (~known).any():   # missing publish time: the training median (FillMedian), then log
                fill = np.expm1(got[~known])
                assert np.allclose(fill, fill[0]) and train_days.min() <= fill[0] <= train_days.max()
    # The hand-made cases: document 102 is published in the future and 103 over ten years before: both 0.
    for mapping in ("train", "test"):
        doc = joined[mapping]["document_id"].to_numpy()
        assert (outputs[mapping]["publish_time_days_since_published"][np.isin(doc, [102, 103])] == 0).all()


def test_lists_sliced_to_three_by_confidence(hand_made):
    joined, outputs = hand_made
    t = hand_made_tables()
    for list_name, (source, column) in F.LIST_SOURCES.items():
        table = t[source].sort_values(["document_id", "confidence_level"], ascending=[True, False])
        expected_raw = table.groupby("document_id")[column].agg(lambda s: list(s)[:3])
        code_of = {}
        for mapping in ("train", "test"):
            for doc, got in zip(joined[mapping]["document_id"], outputs[mapping][list_name]):
                want = expected_raw.get(doc, [])
                assert len(got) == len(want), (list_name, doc)
                for raw_id, code in zip(want, got):  # one code per raw id, the same everywhere
                    assert code_of.setdefault(raw_id, code) == code, (list_name, raw_id)
        assert len(set(code_of.values())) == len(code_of), list_name
    doc = joined["train"]["document_id"].to_numpy()
    first_100 = outputs["train"]["topic_id_list"][doc == 100].iloc[0]
    assert len(first_100) == 3   # five topics, the three most confident kept (12, 14, 13)


def test_geo_splits_and_platform(hand_made):
    joined, outputs = hand_made
    j, o = joined["train"], outputs["train"]
    # Same country <-> same hashed country id; US>CA>803 and US>NY>501 share the country but not the state.
    by_country = pd.Series(o["geo_location_country"].to_numpy()).groupby(j["geo_location"].str[:2].to_numpy())
    assert (by_country.nunique() == 1).all()
    us = o["geo_location_country"][j["geo_location"].str.startswith("US").to_numpy()]
    gb = o["geo_location_country"][j["geo_location"].str.startswith("GB").to_numpy()]
    assert us.nunique() == 1 and gb.nunique() == 1 and us.iloc[0] != gb.iloc[0]
    assert set(j["platform"]) == {0, 1, 2}
    # Hash buckets are a function of the value: equal raw ids, equal bucket (NVTabular 23.8's CPU HashBucket
    # also hashes the row index; our ValueHashBucket and the default engine do not).
    for column in ("ad_id", "document_id", "geo_location", "platform", "campaign_id"):
        for mapping in ("train", "test"):
            groups = pd.Series(outputs[mapping][column].to_numpy()).groupby(joined[mapping][column].to_numpy())
            assert (groups.nunique() == 1).all(), column


def test_hash_bucket_is_pandas_value_hash_whatever_the_string_dtype():
    """The default engine's HashBucket is ``hash_pandas_object(column, index=False) % buckets`` (what the NVTabular
    engine's ValueHashBucket computes under pandas 1.5 on object strings); pandas 3's ``str`` dtype, object strings
    and missing values (None or NaN) hash alike, and the row position plays no part."""
    from wide_deep.data.outbrain.engine import geo_prefix, hash_bucket
    geo = ["US>CA>803", "GB>H9", "--", None] * 3
    objects = pd.Series(geo, dtype=object)
    want = (pd.util.hash_pandas_object(objects, index=False).to_numpy() % np.uint64(50)).astype(np.int32)
    for values in (objects, objects.to_numpy(), pd.Series(geo, dtype="string"),
                   pd.Series(geo, dtype="string[pyarrow]"), pd.Series(geo).astype(object).fillna(np.nan)):
        got = hash_bucket(values, 50)
        assert got.dtype == np.int32
        np.testing.assert_array_equal(got, want)
    ids = pd.Series([7, 8, 9, -1] * 3, dtype=np.int64)
    np.testing.assert_array_equal(
        hash_bucket(ids.to_numpy(), 1000),
        (pd.util.hash_pandas_object(ids, index=False).to_numpy() % np.uint64(1000)).astype(np.int32))
    assert len(set(hash_bucket(ids.to_numpy(), 1000)[:4])) == 4
    # Pinned values (pandas' hash is stable across versions: pandas 1.5 gives these too).
    assert hash_bucket(np.array(["US", "GB"], dtype=object), 300).tolist() == [246, 95]
    assert list(geo_prefix(np.array(geo[:4], dtype=object), 2)[:3]) == ["US", "GB", "--"]
    assert pd.isna(geo_prefix(np.array(geo[:4], dtype=object), 5)[3])


def test_real_clicks_and_events_through_the_joins_and_split():
    """The project's real Outbrain rows (clicks joined with events, all on 14 June) through stage 1."""
    from recsys_testing import shared_data_path
    from wide_deep.data.outbrain.generator import metadata_for
    from wide_deep.data.outbrain.tables import join_and_split
    tables = raw.read_joined_sample(shared_data_path("outbrain", "clicks-joined-events-sample.csv"))
    tables.update(metadata_for(tables["clicks_train"], tables["events"], seed=0))
    train, valid = join_and_split(tables, seed=0)
    assert len(train) + len(valid) == 9999
    # Day 0 only, so the split is the per-display draw alone: about 20% of the 1,959 displays are validation.
    share = valid["display_id"].nunique() / 1959
    assert 0.16 < share < 0.24, share
    assert not set(train["display_id"]) & set(valid["display_id"])
    for part in (train, valid):
        assert part["display_id"].is_monotonic_increasing
        assert (part.groupby("display_id")["clicked"].sum() == 1).all()
        assert set(part["platform"]) == {0, 1, 2}          # raw 1, 2, 3 minus 1
        assert (part["document_id_promo"] > 0).all() and part["publisher_id"].ge(0).all()


# ------------------------------------------------------------------------------------------ out of core (stage 1)
def test_streamed_joins_equal_the_in_memory_joins(raw_outbrain, tmp_path):
    """Small blocks and buckets (many display ranges, several CSV blocks per file): the same rows, in the same order
    and the same partitions as the whole-table definition."""
    from wide_deep.data.outbrain.joins import stream_join_and_split
    from wide_deep.data.outbrain.tables import join_and_split
    train, valid = join_and_split(raw.read_raw_tables(raw_outbrain), seed=7)
    lines = []
    got = stream_join_and_split(raw_outbrain, str(tmp_path), seed=7, partition_rows=150, num_partitions=3,
                                block_bytes=4096, on_rows=lambda *a: lines.append(a))
    assert got["rows"] == {"train": len(train), "test": len(valid)}
    assert got["clicks_rows"] == len(raw.read_raw_table(raw_outbrain, "clicks_train"))
    assert len({a[2] for a in lines if a[0] == "join and split"}) == 1 and lines[-1][1] == lines[-1][2]
    for want, paths in ((train, got["train"]), (valid, got["test"])):
        parts = [pd.read_parquet(p) for p in paths]
        assert [len(p) for p in parts] == [len(c) for c in np.array_split(np.arange(len(want)), 3)]
        pd.testing.assert_frame_equal(pd.concat(parts, ignore_index=True), want)
    np.testing.assert_array_equal(got["document_ids"],
                                  np.unique(np.concatenate([train["document_id"], valid["document_id"]])))


def test_streamed_reader_types_like_the_text_reader(raw_outbrain):
    for name in raw.RAW_FILES:
        whole = raw.read_raw_table(raw_outbrain, name)
        blocks = list(raw.iter_raw_frames(raw_outbrain, name, block_bytes=2048))
        assert len(blocks) > 1 or len(whole) < 50, name
        pd.testing.assert_frame_equal(pd.concat(blocks, ignore_index=True), whole)


def test_document_lists_equal_categorify_listslice_per_row(raw_outbrain):
    """The default engine's per-page list encoding against the definition, per row in pandas: each training row's
    page lists exploded, a term's count = its occurrences, the vocabulary = the terms by count descending (ties by
    id), cut at ``cap - 3``, codes from 3 (2: out of vocabulary), then the first 3 of each list."""
    from wide_deep.data.outbrain.engine import list_vocabularies
    from wide_deep.data.outbrain.tables import document_tables, join_and_split
    tables = raw.read_raw_tables(raw_outbrain)
    train, valid = join_and_split(tables, seed=0)
    pages = np.unique(np.concatenate([train["document_id"], valid["document_id"]]))
    lists, _ = document_tables(tables, pages)
    caps = {"topic_id_list": 40, "entity_id_list": 60, "category_id_list": 100}
    page_ids, page_rows = np.unique(train["document_id"].to_numpy(), return_counts=True)
    fitted = list_vocabularies(lists, page_ids, page_rows.astype(np.int64), caps)
    cut_somewhere = False
    for name, (documents, index, terms) in lists.items():
        starts = np.searchsorted(index, np.arange(len(documents) + 1))
        page_list = {int(d): terms[starts[i]:starts[i + 1]].tolist() for i, d in enumerate(documents)}
        counts = pd.Series([t for d in train["document_id"] for t in page_list.get(int(d), [])]).value_counts()
        vocabulary = sorted(counts.index, key=lambda t: (-counts[t], t))[: caps[name] - 3]
        code = {t: 3 + i for i, t in enumerate(vocabulary)}
        got = fitted[name]
        for frame in (train, valid):
            for d in frame["document_id"].to_numpy()[::7]:
                want = [code.get(t, 2) for t in page_list.get(int(d), [])][:3]
                i = np.searchsorted(got["documents"], d)
                have = got["codes"][got["offsets"][i]:got["offsets"][i + 1]].tolist() \
                    if i < len(got["documents"]) and got["documents"][i] == d else []
                assert have == want, (name, d)
        cut_somewhere |= len(counts) > caps[name] - 3
    assert cut_somewhere
