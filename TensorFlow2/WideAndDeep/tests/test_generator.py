"""The raw Outbrain generator and reader: formats of reference B.3, determinism, keys, skew, the planted signal, and
the real clicks/events rows through the same reader."""
import json
import os
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from conftest import RECIPE_DIR, subprocess_env
from recsys_testing import shared_data_path
from wide_deep.data.outbrain import features as F
from wide_deep.data.outbrain import generator, raw


def _files(path):
    return {n: open(os.path.join(path, n), "rb").read() for n in sorted(os.listdir(path)) if n.endswith(".csv")}


def test_features_table_matches_reference():
    assert len(F.FEATURES) == 29 and len(F.ONEHOT_FEATURES) == 13 and len(F.MULTIHOT_FEATURES) == 3
    assert sum(F.EMBEDDING_SIZES.values()) == 1235
    assert F.HASH_BUCKET_SIZES["ad_id"] == 250_000 and F.FEATURE_BY_NAME["entity_id_list"].cardinality == 10_000
    with open(os.path.join(RECIPE_DIR, "wide_deep", "data", "outbrain", "embedding_sizes.json")) as f:
        assert json.load(f) == F.EMBEDDING_SIZES


def test_generator_is_deterministic_and_atomic(tmp_path, raw_outbrain):
    a, b, c = (str(tmp_path / n) for n in "abc")
    generator.generate(a, 300, seed=5)
    generator.generate(b, 300, seed=5)
    generator.generate(c, 300, seed=6)
    assert _files(a) == _files(b)
    assert _files(a)["clicks_train.csv"] != _files(c)["clicks_train.csv"]
    assert sorted(_files(a)) == sorted(f"{n}.csv" for n in raw.RAW_FILES)
    # A non-empty directory needs --overwrite, which replaces the generator's files and keeps the user's.
    with pytest.raises(FileExistsError, match="--overwrite"):
        generator.generate(a, 200, seed=5)
    open(os.path.join(a, "notes.txt"), "w").write("mine")
    generator.generate(a, 200, seed=5, overwrite=True)
    assert open(os.path.join(a, "notes.txt")).read() == "mine"
    assert pd.read_csv(os.path.join(a, "events.csv")).shape[0] == 200


def test_fixed_catalogue_does_not_grow_with_the_displays():
    """--num_documents/--num_ads (--catalogue real): the catalogue stays at its size while clicks and events grow,
    keys stay consistent; without them it scales with the displays (the default, unchanged)."""
    small, large = (generator.generate_tables(n, seed=2, num_documents=700, num_ads=250) for n in (300, 1200))
    for t in (small, large):
        assert len(t["documents_meta"]) == 700 and len(t["promoted_content"]) == 250
        assert set(t["clicks_train"]["ad_id"]) <= set(t["promoted_content"]["ad_id"])
        assert set(t["events"]["document_id"]) <= set(t["documents_meta"]["document_id"])
        assert set(t["promoted_content"]["document_id"]) <= set(t["documents_meta"]["document_id"])
    assert len(large["events"]) == 4 * len(small["events"]) == 1200
    assert generator.catalogue_sizes(1200) == {"documents": 600, "ads": 400}
    args = generator.parse_args(["--output_dir", "x", "--catalogue", "real"])
    assert (args.num_documents, args.num_ads) == (generator.REAL_NUM_DOCUMENTS, generator.REAL_NUM_ADS)
    with pytest.raises(ValueError, match="--num_ads"):
        generator.generate_tables(10, seed=0, num_ads=0)


def test_document_terms_read_by_arrow_equal_the_frame_path(raw_outbrain):
    """The ETL's Arrow reader of documents_* gives the codes the pandas path gives (entity ids: rank of the hex
    string among the sorted distinct ones)."""
    for source, column in set(F.LIST_SOURCES.values()):
        fast = raw.read_document_terms(raw_outbrain, source, column)
        exact = raw.frame_terms(raw.read_raw_table(raw_outbrain, source), column)
        for a, b in zip(fast, exact):
            np.testing.assert_array_equal(a, b)


def test_cli(tmp_path):
    out = tmp_path / "cli"
    run = subprocess.run([sys.executable, "-m", "wide_deep.data.outbrain.generator", "--output_dir", str(out),
                          "--num_displays", "50", "--seed", "1"], env=subprocess_env(), cwd=RECIPE_DIR,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "events=50" in run.stdout
    run = subprocess.run([sys.executable, "-m", "wide_deep.data.outbrain.generator", "--output_dir", str(out),
                          "--num_displays", "50"], env=subprocess_env(), cwd=RECIPE_DIR,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and "not empty" in run.stderr


def test_formats_keys_and_one_click_per_display(raw_outbrain):
    # Header rows are exactly the Kaggle columns, in Kaggle's order.
    for name, schema in raw.RAW_SCHEMAS.items():
        with open(raw.raw_path(raw_outbrain, name)) as f:
            assert f.readline().strip().split(",") == list(schema)
    t = raw.read_raw_tables(raw_outbrain)
    clicks, events, promoted, meta = t["clicks_train"], t["events"], t["promoted_content"], t["documents_meta"]
    assert (clicks.groupby("display_id")["clicked"].sum() == 1).all()
    sizes = clicks.groupby("display_id").size()
    assert sizes.min() >= 2 and sizes.max() <= 12
    assert set(clicks["display_id"]) == set(events["display_id"]) and events["display_id"].is_unique
    assert set(clicks["ad_id"]) <= set(promoted["ad_id"]) and promoted["ad_id"].is_unique
    docs = set(meta["document_id"])
    assert set(events["document_id"]) <= docs and set(promoted["document_id"]) <= docs
    for name in ("documents_topics", "documents_categories", "documents_entities"):
        assert set(t[name]["document_id"]) <= docs
    assert t["documents_entities"]["entity_id"].str.fullmatch("[0-9a-f]{32}").all()
    assert events["uuid"].str.fullmatch("[0-9a-f]{14}").all()
    assert set(events["platform"].dropna()) <= {1.0, 2.0, 3.0}
    assert events["geo_location"].str.fullmatch(r"--|[A-Z]{2}>[A-Z0-9]{2}(>\d{3})?").all()
    day = events["timestamp"] // F.MS_PER_DAY
    assert day.min() == 0 and day.max() == 12 and events["timestamp"].is_monotonic_increasing
    assert meta["publish_time"].isna().any() and meta["publisher_id"].isna().any()
    text = open(raw.raw_path(raw_outbrain, "documents_meta")).read()
    assert "\\N" in text and pd.to_datetime(meta["publish_time"].dropna(), format="%Y-%m-%d %H:%M:%S").notna().all()


def test_skew_and_planted_signal(raw_outbrain):
    t = raw.read_raw_tables(raw_outbrain)
    clicks = t["clicks_train"]
    counts = clicks["ad_id"].value_counts()
    # Power law: the top 5% of ads fill far more than 5% of the impressions; the most shown ad far above the median ad.
    top = counts.iloc[: max(1, len(counts) // 20)].sum() / counts.sum()
    assert top > 0.25 and counts.iloc[0] > 10 * counts.median()
    # Planted signal: on later displays, ads ranked by their CTR on earlier displays beat random ranking
    # (expected MAP of a random ranking = mean over displays of H(n)/n).
    first = clicks[clicks["display_id"] <= 400]
    later = clicks[clicks["display_id"] > 400].copy()
    ctr = first.groupby("ad_id")["clicked"].agg(["sum", "count"])
    later["score"] = later["ad_id"].map((ctr["sum"] + 0.2) / (ctr["count"] + 1)).fillna(0.2)
    later["rank"] = later.groupby("display_id")["score"].rank(ascending=False, method="first")
    ap = (1.0 / later.loc[later["clicked"] == 1, "rank"]).mean()
    n = later.groupby("display_id").size()
    random_ap = np.mean([np.sum(1.0 / np.arange(1, k + 1)) / k for k in n])
    assert ap > random_ap + 0.05, (ap, random_ap)


def test_real_clicks_and_events_parse_through_the_reader():
    path = shared_data_path("outbrain", "clicks-joined-events-sample.csv")
    t = raw.read_joined_sample(path)
    clicks, events = t["clicks_train"], t["events"]
    assert list(clicks.columns) == list(raw.RAW_SCHEMAS["clicks_train"])
    assert list(events.columns) == list(raw.RAW_SCHEMAS["events"])
    assert len(clicks) == 9999 and events["display_id"].nunique() == 1959 == len(events)
    assert (clicks.groupby("display_id")["clicked"].sum() == 1).all()
    # 2016-06-14 04:06:19.061 is 379,063 ms after the Outbrain timestamp origin.
    first = events.set_index("display_id").loc[1]
    assert first["timestamp"] == 379063 and first["platform"] == 3.0 and first["geo_location"] == "US>SC>519"
    assert events["timestamp"].dtype == np.int64 and (events["timestamp"] // F.MS_PER_DAY == 0).all()
    # The generated metadata for the real ids joins completely.
    meta = generator.metadata_for(clicks, events, seed=0)
    assert set(clicks["ad_id"]) == set(meta["promoted_content"]["ad_id"])
    assert set(events["document_id"]) <= set(meta["documents_meta"]["document_id"])


def test_reader_errors_name_file_column_and_row(tmp_path, raw_outbrain):
    import shutil
    bad = tmp_path / "bad"
    shutil.copytree(raw_outbrain, bad)
    df = pd.read_csv(bad / "promoted_content.csv", dtype=str)
    df.loc[3, "campaign_id"] = "x7"
    df.to_csv(bad / "promoted_content.csv", index=False)
    with pytest.raises(raw.RawInputError, match=r"promoted_content.csv: row 4, column 'campaign_id': cannot read 'x7'"):
        raw.read_raw_table(str(bad), "promoted_content")
    df.drop(columns=["advertiser_id"]).to_csv(bad / "promoted_content.csv", index=False)
    with pytest.raises(raw.RawInputError, match=r"promoted_content.csv: promoted_content is missing column "
                                                r"'advertiser_id'"):
        raw.check_raw_files(str(bad))
    os.remove(bad / "events.csv")
    with pytest.raises(raw.RawInputError, match=r"events.csv: missing raw Outbrain file events.csv"):
        raw.check_raw_files(str(bad))


def test_distinct_ads_equal_the_display_by_display_loop():
    """The vectorised choice of each display's ads (generator._distinct_ads) against the loop it replaced, with
    few ads so that displays run short of distinct candidates and take the random fill (same draws, same order)."""
    candidates = np.random.default_rng(2).integers(0, 4, size=(200, 6))
    sizes = np.random.default_rng(3).integers(2, 7, size=200)
    loop_rng, rng = np.random.default_rng(1), np.random.default_rng(1)
    expected = []
    for d in range(len(candidates)):
        _, first = np.unique(candidates[d], return_index=True)
        ads = candidates[d][np.sort(first)][:sizes[d]]
        while len(ads) < sizes[d]:
            extra = int(loop_rng.integers(0, 10))
            if extra not in ads:
                ads = np.append(ads, extra)
        expected.append(ads)
    got = generator._distinct_ads(rng, candidates, sizes, 10, chunk=37)
    np.testing.assert_array_equal(got, np.concatenate(expected))
    assert loop_rng.random() == rng.random()   # the same number of draws
