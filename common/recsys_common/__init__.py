"""recsys_common: the one shared, framework-free library of the recommender recipes.

Modules:
    feature_spec  FeatureSpec (NVIDIA-compatible YAML dataset description) and its validation.
    datasets      Readers and writers for csv, parquet and NVIDIA's split_binary, driven by a FeatureSpec.
    synthetic     Seeded synthetic datasets from a FeatureSpec (``python -m recsys_common.synthetic``).
    transcode     Headerless CSV + spec -> parquet / split_binary (``python -m recsys_common.transcode``).
    logger        DLLogger-compatible JSON log stream plus readable stdout lines.
    plot_log      Log -> PNG plots (``python -m recsys_common.plot_log``).
    testing       Locating the shared real datasets from tests (skip, or fail in CI); free ports; multi-node
                  torchrun launches on loopback.
    torch_distributed  The one process-group teardown of every multi-process entry point (imports torch
                  only when called).
    io            Atomic file and directory writes.
    metrics       Exact tie-aware ROC AUC and log loss (numpy), the one AUC every recipe reports.
    movielens_ctr MovieLens-1M as a CTR dataset (``python -m recsys_common.movielens_ctr``; genres in slots or
                  one multi-hot feature).
    logistic_baseline  One-hot logistic regression floor on any FeatureSpec dataset (needs scikit-learn).
"""

__version__ = "0.1.0"

# Every tool of this library reads users' parquet with pyarrow. pyarrow 0.14.0 to 14.0.0 runs code from a crafted
# Parquet / Arrow IPC file (CVE-2023-47248): where such a pyarrow is installed (an older image; the separate
# NVTabular environment, which keeps pyarrow 12), pyarrow-hotfix turns that deserialization off before anything is
# read, and without it nothing runs. Read from the package metadata: pyarrow itself is not imported here.
PYARROW_FIXED = (14, 0, 1)


def _guard_pyarrow() -> None:
    import re
    from importlib import metadata
    try:
        version = metadata.version("pyarrow")
    except metadata.PackageNotFoundError:
        return
    release = tuple(int(part) for part in re.findall(r"\d+", version)[:3])
    if release >= PYARROW_FIXED:
        return
    try:
        import pyarrow_hotfix  # noqa: F401  (unregisters the pickled extension type on import)
    except ImportError:
        raise ImportError(f"pyarrow {version} runs code from crafted parquet files (CVE-2023-47248): install "
                          f"pyarrow>=14.0.1, or pyarrow-hotfix where pyarrow cannot change") from None


_guard_pyarrow()
