"""Synthetic Outbrain Click Prediction data: the seven raw CSVs of reference B.3, so the ETL and training run offline.

    python -m wide_deep.data.outbrain.generator --output_dir /tmp/outbrain/orig --num_displays 20000 --seed 0

writes ``clicks_train.csv events.csv promoted_content.csv documents_meta.csv documents_categories.csv
documents_topics.csv documents_entities.csv`` (columns and formats of :mod:`wide_deep.data.outbrain.raw`) into
``--output_dir`` atomically (a non-empty directory needs ``--overwrite``, which replaces only this tool's files).
The output depends only on ``--num_displays``, ``--seed`` and the catalogue sizes.

Catalogue: by default the numbers of documents and ads scale with the displays (``num_displays // 2`` pages,
``num_displays // 3`` ads), so a small run is self-consistent. The real data's catalogue does not grow with its
click log (87M clicks_train rows come with 3.0M documents and 0.56M ads): ``--catalogue real`` fixes it at those
sizes (``--num_documents``/``--num_ads`` set other fixed sizes), so that runs of different sizes differ only in
clicks and events, as parts of one real log do; the ETL benchmark measures memory flatness on such data.

    python -m wide_deep.data.outbrain.generator --output_dir /tmp/ob20m --num_displays 4750000 --catalogue real

What it looks like (the properties the ETL and the model rely on):
- keys are consistent: every ``clicks_train.display_id`` has one ``events`` row, every ``ad_id`` one
  ``promoted_content`` row, every document (event page and ad landing page) one ``documents_meta`` row; some
  documents have no topics, entities or categories, a few have no publisher or publish time (``\\N``);
- skew: users, pages, ads, campaigns and sources are drawn from Zipf-like laws, so a few ads fill many displays and
  most ads appear a handful of times; displays hold 2 to 12 ads and span 13 days (14 to 26 June 2016);
- exactly one clicked ad per display, drawn from a softmax over a planted score:

      score(ad, display) = quality[ad] + quality[campaign] + quality[advertiser]
                           + affinity[theme(landing page), platform] + affinity[theme(landing page), country]
                           + MATCH_BONUS * [theme(landing page) == theme(event page)]

  Each document has a theme that its topics and categories are drawn around. The quality terms are what a
  training-CTR baseline can see; the context terms (platform, country, page/landing-page match) are learnable only
  from the features, so a model beats that baseline on MAP@12.
"""
from __future__ import annotations

import argparse
import os
from typing import Dict, List, Optional, Sequence

import numpy as np
import pandas as pd

from recsys_common.cli import run_main
from recsys_common.io import OutputDirectoryError, atomic_directory

from . import features as F
from .raw import RAW_SCHEMAS, coerce_raw_frame

TOOL = "wide_deep.data.outbrain.generator"
NUM_DAYS = 13
NUM_THEMES = 16
NUM_TOPICS = 300
NUM_CATEGORIES = 97
MATCH_BONUS = 2.0
COUNTRIES = ["US", "CA", "GB", "AU", "IN", "DE", "FR", "SG", "PH", "ZA"]


def _zipf_weights(n: int, exponent: float) -> np.ndarray:
    w = 1.0 / np.arange(1, n + 1) ** exponent
    return w / w.sum()


def _draw(rng: np.random.Generator, n: int, size, exponent: float, permutation: np.ndarray) -> np.ndarray:
    """Zipf-like draw of indices in [0, n); ``permutation`` decides which index is the popular one."""
    return permutation[rng.choice(n, size=size, p=_zipf_weights(n, exponent))]


def _hex_ids(rng: np.random.Generator, n: int, length: int) -> List[str]:
    digits = np.frombuffer(b"0123456789abcdef", dtype="S1")[rng.integers(0, 16, size=(n, length))]
    return [row.decode() for row in digits.view(f"S{length}").ravel()]


def _geo_pool(rng: np.random.Generator) -> List[str]:
    """Kaggle-style geo strings: ``US>CA>803`` for the US, ``GB>H9`` elsewhere, ``--`` unknown."""
    geos = ["--"]
    for country in COUNTRIES:
        for s in range(8 if country == "US" else 3):
            state = f"{chr(65 + (s * 7 + len(country)) % 26)}{chr(65 + (s * 3) % 26)}"
            if country == "US":
                geos += [f"US>{state}>{500 + int(rng.integers(0, 380))}" for _ in range(3)]
            geos.append(f"{country}>{state}")
    return geos


def _document_tables(rng: np.random.Generator, num_docs: int, doc_ids: np.ndarray, doc_theme: np.ndarray,
                     publish_ms: np.ndarray) -> Dict[str, pd.DataFrame]:
    num_sources = max(10, num_docs // 20)
    num_publishers = max(5, num_sources // 3)
    source_of_doc = _draw(rng, num_sources, num_docs, 1.0, rng.permutation(num_sources)) + 1
    publisher_of_source = rng.integers(1, num_publishers + 1, size=num_sources + 1)
    publisher = publisher_of_source[source_of_doc].astype(object)
    publisher[rng.random(num_docs) < 0.03] = ""
    publish = pd.to_datetime(publish_ms, unit="ms").strftime("%Y-%m-%d %H:%M:%S").to_numpy(dtype=object)
    publish[rng.random(num_docs) < 0.05] = "\\N"
    meta = pd.DataFrame({"document_id": doc_ids, "source_id": source_of_doc, "publisher_id": publisher,
                         "publish_time": publish})

    def term_table(column: str, max_terms: int, empty_share: float, draw_terms) -> pd.DataFrame:
        """Up to ``max_terms`` distinct terms per document (none for ``empty_share`` of them), drawn at once."""
        counts = rng.integers(1, max_terms + 1, size=num_docs)
        counts[rng.random(num_docs) < empty_share] = 0
        doc_index = np.repeat(np.arange(num_docs), counts)
        df = pd.DataFrame({"document_id": doc_ids[doc_index], column: draw_terms(doc_index)}).drop_duplicates()
        df["confidence_level"] = np.round(rng.uniform(0.05, 0.95, size=len(df)), 6)
        return df.reset_index(drop=True)

    topics_per_theme = NUM_TOPICS // NUM_THEMES
    cats_per_theme = NUM_CATEGORIES // NUM_THEMES

    def topics(doc_index):  # mostly from the document's theme block, sometimes any topic
        n = len(doc_index)
        own = doc_theme[doc_index] * topics_per_theme + rng.integers(0, topics_per_theme, size=n)
        return np.where(rng.random(n) < 0.9, own, rng.integers(0, NUM_TOPICS, size=n))

    def categories(doc_index):  # Kaggle category ids look like 1403, 2100: 1000 + 100 * block + offset
        block = doc_theme[doc_index] * cats_per_theme + rng.integers(0, cats_per_theme, size=len(doc_index))
        return 1000 + 100 * (block // 10) + block % 10

    num_entities = max(100, num_docs // 2)
    entity_names = np.array(_hex_ids(rng, num_entities, 32), dtype=object)
    entity_perm = rng.permutation(num_entities)

    def entities(doc_index):
        return entity_names[_draw(rng, num_entities, len(doc_index), 0.8, entity_perm)]

    tables = {"documents_meta": meta,
              "documents_topics": term_table("topic_id", 5, 0.05, topics),
              "documents_categories": term_table("category_id", 2, 0.03, categories),
              "documents_entities": term_table("entity_id", 4, 0.15, entities)}
    return tables


def _distinct_ads(rng: np.random.Generator, candidates: np.ndarray, sizes: np.ndarray, num_ads: int,
                  chunk: int = 1 << 18) -> np.ndarray:
    """Per display (row of ``candidates``), its first ``sizes[d]`` distinct candidates in candidate order, the
    displays one after the other. Where the candidates hold too few distinct ads (rare), random distinct ads are
    appended, drawn display by display in order. Vectorised by blocks of ``chunk`` displays (at 20M clicks rows a
    loop over displays took minutes)."""
    pieces, counts = [], []
    for lo in range(0, len(candidates), chunk):
        block, want = candidates[lo:lo + chunk], sizes[lo:lo + chunk]
        order = np.argsort(block, axis=1, kind="stable")
        ordered = np.take_along_axis(block, order, axis=1)
        first_sorted = np.ones(block.shape, dtype=bool)
        first_sorted[:, 1:] = ordered[:, 1:] != ordered[:, :-1]   # first of each run of equal ads: earliest index
        first = np.zeros(block.shape, dtype=bool)
        np.put_along_axis(first, order, first_sorted, axis=1)
        keep = first & (np.cumsum(first, axis=1) <= want[:, None])
        pieces.append(block[keep])   # row by row, candidate order
        counts.append(keep.sum(axis=1))
    flat = np.concatenate(pieces) if pieces else np.zeros(0, dtype=candidates.dtype)
    have = np.concatenate(counts) if counts else np.zeros(0, dtype=np.int64)
    short = np.flatnonzero(have < sizes)
    if not len(short):
        return flat
    # The rare short displays, in display order (the same draws as a display-by-display loop).
    ends = np.cumsum(have)
    out, previous = [], 0
    for d in short:
        end = int(ends[d])
        ads = flat[end - have[d]:end]
        while len(ads) < sizes[d]:
            extra = int(rng.integers(0, num_ads))
            if extra not in ads:
                ads = np.append(ads, extra)
        out += [flat[previous:end], ads[have[d]:]]
        previous = end
    out.append(flat[previous:])
    return np.concatenate(out)


# The Kaggle Outbrain catalogue: documents_meta.csv rows and promoted_content.csv rows (reference B.3).
REAL_NUM_DOCUMENTS = 2_999_334
REAL_NUM_ADS = 559_583


def catalogue_sizes(num_displays: int, num_documents: Optional[int] = None, num_ads: Optional[int] = None
                    ) -> Dict[str, int]:
    """Documents and ads of the generated catalogue: given sizes, else scaled with the displays (the default)."""
    for flag, value in (("--num_documents", num_documents), ("--num_ads", num_ads)):
        if value is not None and value < 1:
            raise ValueError(f"{flag} must be at least 1, got {value}")
    return {"documents": max(100, num_displays // 2) if num_documents is None else max(100, num_documents),
            "ads": max(50, num_displays // 3) if num_ads is None else max(50, num_ads)}


def generate_tables(num_displays: int, seed: int, num_documents: Optional[int] = None,
                    num_ads: Optional[int] = None) -> Dict[str, pd.DataFrame]:
    """The seven raw tables as DataFrames (columns of ``RAW_SCHEMAS``), deterministic in ``(num_displays, seed)``
    and the catalogue sizes (:func:`catalogue_sizes`: ``None`` scales them with the displays)."""
    if num_displays < 1:
        raise ValueError(f"--num_displays must be at least 1, got {num_displays}")
    sizes = catalogue_sizes(num_displays, num_documents, num_ads)
    rng = np.random.default_rng(seed)
    num_docs = sizes["documents"]
    num_ads = sizes["ads"]
    num_campaigns = max(10, num_ads // 8)
    num_advertisers = max(5, num_campaigns // 3)
    num_users = max(20, num_displays // 3)

    # Documents: ids are sparse like Kaggle's (1 .. ~3M), each with a theme and a publish time before the event.
    doc_ids = np.sort(rng.choice(np.arange(1, 30 * num_docs + 1), size=num_docs, replace=False))
    doc_theme = rng.integers(0, NUM_THEMES, size=num_docs)
    start_ms = F.TIMESTAMP_DELTA_MS
    publish_days = rng.exponential(120.0, size=num_docs) - 5.0  # some pages published during the 13 days
    publish_ms = (start_ms - publish_days * F.MS_PER_DAY).astype(np.int64) // 1000 * 1000
    tables = _document_tables(rng, num_docs, doc_ids, doc_theme, publish_ms)

    # Ads: a landing page, a campaign, an advertiser (fixed per campaign), with planted qualities.
    ad_ids = np.sort(rng.choice(np.arange(1, 6 * num_ads + 1), size=num_ads, replace=False))
    ad_landing = _draw(rng, num_docs, num_ads, 0.7, rng.permutation(num_docs))
    ad_campaign = _draw(rng, num_campaigns, num_ads, 0.9, rng.permutation(num_campaigns))
    campaign_advertiser = rng.integers(0, num_advertisers, size=num_campaigns)
    ad_advertiser = campaign_advertiser[ad_campaign]
    tables["promoted_content"] = pd.DataFrame({"ad_id": ad_ids, "document_id": doc_ids[ad_landing],
                                               "campaign_id": ad_campaign + 1, "advertiser_id": ad_advertiser + 1})
    quality = (rng.normal(0, 0.8, num_ads) + rng.normal(0, 0.6, num_campaigns)[ad_campaign]
               + rng.normal(0, 0.5, num_advertisers)[ad_advertiser])

    # Users: a fixed platform (1 desktop, 2 mobile, 3 tablet) and geo; displays: user, page, time, 2-12 ads.
    geos = _geo_pool(rng)
    user_geo = np.array(geos, dtype=object)[_draw(rng, len(geos), num_users, 1.0, np.arange(len(geos)))]
    user_platform = rng.choice([1, 2, 3], size=num_users, p=[0.45, 0.4, 0.15])
    uuids = np.array(_hex_ids(rng, num_users, 14), dtype=object)
    display_user = _draw(rng, num_users, num_displays, 0.6, rng.permutation(num_users))
    display_doc = _draw(rng, num_docs, num_displays, 0.9, rng.permutation(num_docs))
    timestamps = np.sort(rng.integers(0, NUM_DAYS * F.MS_PER_DAY, size=num_displays))
    platform = user_platform[display_user].astype(object)
    platform[rng.random(num_displays) < 0.002] = "\\N"  # Kaggle has a few events without a platform
    tables["events"] = pd.DataFrame({"display_id": np.arange(1, num_displays + 1), "uuid": uuids[display_user],
                                     "document_id": doc_ids[display_doc], "timestamp": timestamps,
                                     "platform": platform, "geo_location": user_geo[display_user]})

    affinity_platform = rng.normal(0, 1.5, size=(NUM_THEMES, 4))
    country_index = {c: i for i, c in enumerate(["--"] + COUNTRIES)}
    affinity_country = rng.normal(0, 1.2, size=(NUM_THEMES, len(country_index)))
    display_country = np.array([country_index.get(g[:2], 0) for g in user_geo[display_user]])

    # Ads of each display: Zipf-popular, distinct within the display (candidates drawn in one go, then deduplicated).
    ad_cdf = np.cumsum(_zipf_weights(num_ads, 0.9)[np.argsort(rng.permutation(num_ads))])
    sizes = rng.choice(np.arange(2, 13), size=num_displays, p=_zipf_weights(11, 1.2))
    candidates = np.minimum(np.searchsorted(ad_cdf, rng.random((num_displays, 24))), num_ads - 1)
    row_ad = _distinct_ads(rng, candidates, sizes, num_ads)
    row_display = np.repeat(np.arange(num_displays), sizes)
    theme = doc_theme[ad_landing[row_ad]]
    score = (quality[row_ad] + affinity_platform[theme, user_platform[display_user[row_display]]]
             + affinity_country[theme, display_country[row_display]]
             + MATCH_BONUS * (theme == doc_theme[display_doc[row_display]]))
    # One click per display, drawn from softmax(score) over its ads (Gumbel-max: argmax of score + Gumbel noise).
    noisy = score + rng.gumbel(size=len(score))
    clicked_row = pd.Series(noisy).groupby(row_display).idxmax().to_numpy()
    clicked = np.zeros(len(score), dtype=np.int64)
    clicked[clicked_row] = 1
    tables["clicks_train"] = pd.DataFrame({"display_id": row_display + 1, "ad_id": ad_ids[row_ad],
                                           "clicked": clicked})
    return {name: tables[name][list(RAW_SCHEMAS[name])] for name in RAW_SCHEMAS}


def write_tables(tables: Dict[str, pd.DataFrame], directory: str) -> None:
    """Write raw tables as ``<name>.csv`` (header, no index), floats with 6 significant digits."""
    for name, df in tables.items():
        df.to_csv(os.path.join(directory, f"{name}.csv"), index=False, float_format="%.6g")


def metadata_for(clicks: pd.DataFrame, events: pd.DataFrame, seed: int = 0) -> Dict[str, pd.DataFrame]:
    """Synthetic ``promoted_content`` and ``documents_*`` tables for given (e.g. real) clicks and events.

    The project's real Outbrain rows hold only clicks and events; this gives their ad and document ids the metadata
    the ETL joins, so the ETL runs on real clicks and events. Returns typed frames, as ``raw.read_raw_table`` does. Ads map onto landing pages among the event pages.
    """
    rng = np.random.default_rng(seed)
    ad_ids = np.sort(clicks["ad_id"].unique())
    page_ids = np.sort(events["document_id"].unique())
    landing_ids = np.sort(rng.choice(np.arange(1, 10 * len(ad_ids) + 1), size=len(ad_ids), replace=False)
                          + int(page_ids.max()))
    doc_ids = np.concatenate([page_ids, landing_ids])
    num_campaigns = max(10, len(ad_ids) // 8)
    campaign = rng.integers(1, num_campaigns + 1, size=len(ad_ids))
    advertiser = rng.integers(1, max(5, num_campaigns // 3) + 1, size=num_campaigns + 1)[campaign]
    promoted = pd.DataFrame({"ad_id": ad_ids, "document_id": landing_ids, "campaign_id": campaign,
                             "advertiser_id": advertiser})
    publish_ms = (F.TIMESTAMP_DELTA_MS - rng.exponential(120.0, len(doc_ids)) * F.MS_PER_DAY).astype(np.int64)
    tables = _document_tables(rng, len(doc_ids), doc_ids, rng.integers(0, NUM_THEMES, len(doc_ids)),
                              publish_ms // 1000 * 1000)
    tables["promoted_content"] = promoted
    # Typed like read_raw_table's output (the CSV spellings of missing, "" and \\N, become NaN/None).
    return {name: coerce_raw_frame(name, df.replace({"": None, "\\N": None}), f"<metadata_for: {name}>")
            for name, df in tables.items()}


def generate(output_dir: str, num_displays: int, seed: int = 0, overwrite: bool = False,
             num_documents: Optional[int] = None, num_ads: Optional[int] = None) -> Dict[str, int]:
    """Generate and write the seven CSVs into ``output_dir`` atomically; returns rows per file."""
    tables = generate_tables(num_displays, seed, num_documents, num_ads)
    # clicks_train.csv is the marker: moved in last, so its presence means all seven files are complete.
    with atomic_directory(output_dir, overwrite=overwrite, tool=TOOL, marker="clicks_train.csv") as staging:
        write_tables(tables, staging)
    return {name: len(df) for name, df in tables.items()}


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--output_dir", required=True, help="directory for the seven raw CSVs")
    p.add_argument("--num_displays", type=int, default=20000, help="number of displays (each has 2-12 ads)")
    p.add_argument("--seed", type=int, default=0, help="random seed; the output depends only on it and the size")
    p.add_argument("--catalogue", choices=["scaled", "real"], default="scaled",
                   help="scaled: documents and ads grow with --num_displays (1/2 and 1/3 of it); real: fixed at the "
                        f"Kaggle data's {REAL_NUM_DOCUMENTS:,} documents and {REAL_NUM_ADS:,} ads")
    p.add_argument("--num_documents", type=int, default=None,
                   help="fixed number of documents (overrides --catalogue)")
    p.add_argument("--num_ads", type=int, default=None, help="fixed number of ads (overrides --catalogue)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace this tool's earlier files in a non-empty --output_dir (other files are kept)")
    args = p.parse_args(argv)
    if args.catalogue == "real":
        args.num_documents = REAL_NUM_DOCUMENTS if args.num_documents is None else args.num_documents
        args.num_ads = REAL_NUM_ADS if args.num_ads is None else args.num_ads
    return args


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, int]:
    """Writes the seven raw CSVs; returns the rows written per file."""
    args = parse_args(argv)
    counts = generate(args.output_dir, args.num_displays, args.seed, args.overwrite, args.num_documents, args.num_ads)
    print(" ".join(f"{name}={n}" for name, n in counts.items()) + f" -> {os.path.abspath(args.output_dir)}")
    return counts


if __name__ == "__main__":
    run_main(main, input_errors=(OutputDirectoryError, ValueError))
