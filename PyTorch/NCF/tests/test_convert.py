import os

import io

import numpy as np
import pandas as pd
import pytest

from neumf.data import convert
from recsys_common import movielens_ctr
from neumf.data.convert import ConversionError
from neumf.data import load_dataset
from recsys_common.cli import exit_status


def cli(argv):
    """``python convert.py ARGV``'s exit status (the command line's error line goes to stderr)."""
    return exit_status(convert.main, argv, prog="convert.py", input_errors=convert.INPUT_ERRORS)

ML100K_LINES = [  # user item rating timestamp, tab-separated like u.data
    (10, 5, 3, 100), (10, 6, 4, 300), (10, 7, 5, 200), (10, 6, 1, 50),  # (10, 6) twice: earliest kept
    (20, 5, 2, 10), (20, 8, 3, 20),
    (30, 9, 4, 5), (30, 5, 4, 7), (30, 6, 4, 6),
]


def write(path, text):
    with open(path, "w") as f:
        f.write(text)
    return str(path)


@pytest.fixture
def udata(tmp_path):
    d = tmp_path / "ml-100k"
    d.mkdir()
    return write(d / "u.data", "".join("\t".join(map(str, r)) + "\n" for r in ML100K_LINES))


def test_leave_one_out_protocol(udata):
    split = convert.convert_ratings(udata, valid_negative=3, seed=1)
    # ids factorised in order of first appearance: users 10,20,30 -> 0,1,2; items 5,6,7,8,9 -> 0..4
    assert (split.num_users, split.num_items) == (3, 5)
    # user 10: (6) at t=50, (5) t=100, (7) t=200, latest is (6, t=300) but (10,6) was already seen at t=50 -> dropped;
    # so the latest distinct interaction is item 7 (t=200)
    test = dict(zip(split.test_users.tolist(), split.test_candidates[:, 0].tolist()))
    assert test == {0: 2, 1: 3, 2: 0}
    train = sorted(zip(split.train_users.tolist(), split.train_items.tolist()))
    assert train == [(0, 0), (0, 1), (1, 0), (2, 1), (2, 4)]
    # negatives never among the user's training items; seeded
    train_set = set(train)
    for u, row in zip(split.test_users, split.test_candidates):
        assert all((int(u), int(i)) not in train_set for i in row[1:])
    again = convert.convert_ratings(udata, valid_negative=3, seed=1)
    np.testing.assert_array_equal(split.test_candidates, again.test_candidates)


def test_written_dataset_round_trips_through_the_feature_spec(udata, tmp_path):
    split = convert.convert_ratings(udata, valid_negative=4, seed=1)
    out = str(tmp_path / "out")
    convert.write_split(split, out)
    data = load_dataset(out)
    assert data.samples_per_series == 5 and data.num_items == 5
    np.testing.assert_array_equal(data.test_items.reshape(-1, 5), split.test_candidates)
    assert data.test_labels.reshape(-1, 5)[:, 0].tolist() == [1, 1, 1]
    visible = sorted(f for f in os.listdir(out) if not f.startswith("."))  # .recsys_outputs.json: who wrote what
    assert visible == ["feature_spec.yaml", "item_ids.parquet", "test.parquet", "train.parquet", "user_ids.parquet"]
    # the raw -> code mappings serving maps requests with: users 10,20,30 -> 0,1,2; items 5,6,7,8,9 -> 0..4
    users = pd.read_parquet(os.path.join(out, "user_ids.parquet"))
    items = pd.read_parquet(os.path.join(out, "item_ids.parquet"))
    assert dict(zip(users["raw"], users["id"])) == {10: 0, 20: 1, 30: 2}
    assert dict(zip(items["raw"], items["id"])) == {5: 0, 6: 1, 7: 2, 8: 3, 9: 4}


def test_byo_csv_and_ml20m_layouts(tmp_path):
    byo = write(tmp_path / "mine.csv", "user_id,item_id,timestamp\n1,2,3\n1,3,4\n2,2,1\n2,4,2\n")
    assert convert.convert_ratings(byo, valid_negative=1).num_items == 3
    d = tmp_path / "ml-20m"
    d.mkdir()
    ml20 = write(d / "ratings.csv", "userId,movieId,rating,timestamp\n1,2,3.5,3\n1,3,4.0,4\n2,2,1.0,1\n2,4,5,2\n")
    assert convert.detect_format(ml20) == "ml-20m"
    assert convert.convert_ratings(ml20, valid_negative=1).num_users == 2


def test_ml1m_double_colon_layout(tmp_path):
    path = write(tmp_path / "ratings.dat", "1::1193::5::978300760\n1::661::3::978302109\n2::1193::4::978300000\n"
                                           "2::3408::4::978300001\n")
    split = convert.convert_ratings(path, valid_negative=0)
    assert split.test_candidates.shape == (2, 1)


@pytest.mark.parametrize("text, message", [
    ("1\t2\t3\t4\n5\t6\t7\n", r"line 2: expected 4 '\\t'-separated fields .* found 3"),
    ("1\t2\t3\t4\n5\t6\t7\t8\t9\n", r"line 2: expected 4 .* found 5"),
    ("1\t2\t3\t4\nabc\t6\t7\t8\n", r"line 2: column 'user_id' must be an integer, got 'abc'"),
    ("1\t2\t3\t4\n1\t2.5\t3\t4\n", r"line 2: column 'item_id' must be an integer, got '2.5'"),
    ("", r"empty file"),
    ("1\t2\t3\t4\n1\t3\t3\t5\n2\t2\t3\t4\n", r"1 user\(s\) have a single distinct interaction \(user id\(s\) 2\)"),
])
def test_bad_input_names_file_and_line_and_writes_nothing(tmp_path, text, message):
    d = tmp_path / "ml-100k"
    d.mkdir()
    path = write(d / "u.data", text)
    out = tmp_path / "out"
    with pytest.raises(ConversionError, match=message) as err:
        split = convert.convert_ratings(path, valid_negative=1)
        convert.write_split(split, str(out))
    assert str(path) in str(err.value)
    assert not out.exists() and os.listdir(tmp_path) == ["ml-100k"]


@pytest.mark.parametrize("name, text, message", [
    # a rating outside the layout's range: half stars 0.5..5 (ML-20m/25m/latest), whole stars 1..5 (ML-1m)
    ("ratings.csv", "userId,movieId,rating,timestamp\n1,2,3.5,4\n1,3,5.5,5\n",
     r"line 3: column 'rating': rating 5.5 is outside the ml-20m range \(0.5 to 5"),
    ("ratings.csv", "userId,movieId,rating,timestamp\n1,2,3.5,4\n1,3,3.7,5\n", r"line 3: column 'rating': rating 3.7"),
    ("ratings.dat", "1::2::3::4\n1::3::0::5\n", r"line 2: column 'Rating': rating 0 is outside the ml-1m range"),
    # a truncated file: the last line cut short
    ("ratings.csv", "userId,movieId,rating,timestamp\n1,2,3.5,4\n1,3,4", r"line 3: expected 4 ','-separated fields"),
    ("ratings.dat", "1::2::3::4\n1::3::4::5\n2::1::3", r"line 3: expected 4 '::'-separated fields"),
    ("ratings.dat", "1::2::3::4\n1::x::4::5\n", r"line 2: column 'MovieID' must be an integer, got 'x'"),
    ("ratings.csv", "userId,movieId,rating\n1,2,3.5\n", r"line 1: header .* lacks column\(s\) \['timestamp'\]"),
])
def test_bad_movielens_files_name_file_line_and_column(tmp_path, name, text, message):
    d = tmp_path / "ml-20m"
    d.mkdir()
    path = write(d / name, text)
    before = sorted(os.listdir(d))
    assert cli(["--path", path, "--output", str(tmp_path / "out")]) == 2
    with pytest.raises(ConversionError, match=message) as err:
        convert.read_ratings_columns(path)
    assert str(err.value).startswith(path)
    assert not (tmp_path / "out").exists() and sorted(os.listdir(d)) == before


def test_a_truncated_gzip_is_refused(tmp_path):
    import gzip
    d = tmp_path / "ml-20m"
    d.mkdir()
    body = "userId,movieId,rating,timestamp\n" + "".join(f"{u},{i},4.0,{u * 1000 + i}\n" for u in range(1, 300)
                                                         for i in range(1, 40))
    data = gzip.compress(body.encode())
    path = str(d / "ratings.csv.gz")
    with open(path, "wb") as f:
        f.write(data[: len(data) // 2])
    with pytest.raises(ConversionError, match=r"ratings.csv.gz: (cannot read|line \d+: expected 4)"):
        convert.read_ratings_columns(path, "ml-20m")


def test_cli_exits_non_zero_with_the_message(tmp_path, capsys):
    bad = write(tmp_path / "mine.csv", "user_id,item_id,timestamp\n1,2\n")
    assert cli(["--path", bad, "--output", str(tmp_path / "out")]) == 2
    assert "mine.csv: line 2: expected 3" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_paper_split_files(tmp_path):
    prefix = str(tmp_path / "toy")
    write(prefix + ".train.rating", "0\t1\t5\t10\n0\t2\t4\t11\n1\t0\t3\t12\n")
    write(prefix + ".test.rating", "0\t3\t5\t20\n1\t2\t4\t21\n")
    write(prefix + ".test.negative", "(0,3)\t0\t4\n(1,2)\t1\t3\n")
    split = convert.convert_paper_split(prefix)
    assert split.test_candidates.tolist() == [[3, 0, 4], [2, 1, 3]]
    assert (split.num_users, split.num_items) == (2, 5)
    write(prefix + ".test.negative", "(0,3)\t0\t4\n(1,2)\t1\n")
    with pytest.raises(ConversionError, match=r"toy.test.negative: line 2: expected 2 negatives"):
        convert.convert_paper_split(prefix)


def test_paper_split_three_field_files_in_file_order(tmp_path):
    """DeepCF's / DMF's files: user item rating, no timestamp; file order is time order, ids checked as before."""
    prefix = str(tmp_path / "deepcf")
    write(prefix + ".train.rating", "0\t4\t1\n1\t0\t1\n0\t1\t1\n0\t2\t1\n")
    write(prefix + ".test.rating", "0\t3\t1\n1\t2\t1\n")
    write(prefix + ".test.negative", "(0,3)\t0\t4\n(1,2)\t1\t3\n")
    split = convert.convert_paper_split(prefix)
    assert list(zip(split.train_users.tolist(), split.train_items.tolist())) == [(0, 4), (1, 0), (0, 1), (0, 2)]
    assert split.test_candidates.tolist() == [[3, 0, 4], [2, 1, 3]]
    out = tmp_path / "out"
    assert cli(["--paper_split", prefix, "--output", str(out)]) == 0
    assert load_dataset(str(out)).num_items == 5


def test_paper_split_four_field_train_rows_come_in_time_order(tmp_path):
    prefix = str(tmp_path / "toy")
    write(prefix + ".train.rating", "0\t1\t5\t30\n0\t2\t4\t11\n1\t0\t3\t12\n")
    write(prefix + ".test.rating", "0\t3\t5\t40\n1\t2\t4\t41\n")
    write(prefix + ".test.negative", "(0,3)\t0\t4\n(1,2)\t1\t3\n")
    split = convert.convert_paper_split(prefix)
    assert split.train_items.tolist() == [2, 0, 1]   # user 0's latest training item (time 30) comes last


@pytest.mark.parametrize("train, message", [
    ("0\t1\t1\n0\t2\n", r"deepcf.train.rating: line 2: expected 3 '\\t'-separated fields .* found 2"),
    ("0\t1\n", r"deepcf.train.rating: line 1: expected 3 or 4 '\\t'-separated fields .* found 2"),
    ("0\t1\t1\t5\n0\t2\t1\n", r"deepcf.train.rating: line 2: expected 4 '\\t'-separated fields"),
    ("0\tx\t1\n", r"deepcf.train.rating: line 1: column 'item' must be an integer, got 'x'"),
])
def test_paper_split_bad_rating_files_name_the_line(tmp_path, train, message):
    prefix = str(tmp_path / "deepcf")
    write(prefix + ".train.rating", train)
    write(prefix + ".test.rating", "0\t3\t1\n")
    write(prefix + ".test.negative", "(0,3)\t0\t4\n")
    with pytest.raises(ConversionError, match=message):
        convert.convert_paper_split(prefix)
    assert cli(["--paper_split", prefix, "--output", str(tmp_path / "out")]) == 2
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------ the output directory holds the user's files
def _user_dir(tmp_path):
    """NVIDIA's documented layout: the raw ratings and the converted dataset in one directory (`--output /data`)."""
    d = tmp_path / "ml-20m"
    d.mkdir()
    lines = "".join(f"{u},{i},4.0,{u * 100 + i}\n" for u in range(1, 6) for i in range(1, 5))
    write(d / "ratings.csv", "userId,movieId,rating,timestamp\n" + lines)
    write(d / "notes.txt", "my notes\n")
    return d


def test_a_non_empty_output_directory_is_refused_without_overwrite(tmp_path, capsys):
    d = _user_dir(tmp_path)
    argv = ["--path", str(d / "ratings.csv"), "--format", "ml-20m", "--output", str(d), "--valid_negative", "2"]
    assert cli(argv) == 2
    err = capsys.readouterr().err
    assert "output directory is not empty" in err and "--overwrite" in err
    assert sorted(os.listdir(d)) == ["notes.txt", "ratings.csv"]
    assert (d / "notes.txt").read_text() == "my notes\n"


def test_overwrite_replaces_only_the_tools_own_outputs(tmp_path, capsys):
    d = _user_dir(tmp_path)
    ratings_before = (d / "ratings.csv").read_bytes()
    argv = ["--path", str(d / "ratings.csv"), "--format", "ml-20m", "--output", str(d), "--valid_negative", "2",
            "--overwrite"]
    assert cli(argv) == 0, capsys.readouterr().err
    assert (d / "ratings.csv").read_bytes() == ratings_before and (d / "notes.txt").read_text() == "my notes\n"
    first = load_dataset(str(d))
    assert (first.num_users, first.samples_per_series) == (5, 3)
    # again, with another seed: the dataset is replaced, the user's files still stay
    assert cli(argv + ["--seed", "7"]) == 0
    visible = sorted(f for f in os.listdir(d) if not f.startswith("."))
    assert visible == ["feature_spec.yaml", "item_ids.parquet", "notes.txt", "ratings.csv", "test.parquet",
                       "train.parquet", "user_ids.parquet"]
    assert (d / "ratings.csv").read_bytes() == ratings_before and (d / "notes.txt").read_text() == "my notes\n"
    assert load_dataset(str(d)).num_users == 5


def test_an_output_file_named_like_the_input_is_refused(tmp_path, capsys):
    d = tmp_path / "data"
    d.mkdir()
    write(d / "test.parquet", "a user's file with one of our output names")
    with pytest.raises(ConversionError, match=r"would replace the input .*test.parquet"):
        convert.check_output(str(d), [str(d / "test.parquet")], overwrite=True)
    # not an input, but not ours either: --overwrite still refuses to replace it, and nothing is written
    raw = write(tmp_path / "mine.csv", "user_id,item_id,timestamp\n1,2,3\n1,3,4\n2,2,1\n2,4,2\n")
    assert cli(["--path", raw, "--output", str(d), "--valid_negative", "1", "--overwrite"]) == 2
    assert "test.parquet: exists and was not written by this tool" in capsys.readouterr().err
    assert sorted(os.listdir(d)) == ["test.parquet"]


# ------------------------------------------------------------------ --min_interactions
def test_min_interactions_drops_sparse_users_and_reports_them(tmp_path, capsys):
    d = tmp_path / "ml-100k"
    d.mkdir()
    # user 4 has one rating, user 5 two ratings of the same item (one distinct interaction): both are dropped;
    # item 9 is rated only by user 4, so it disappears from the item ids too
    rows = [(1, 1, 5, 1), (1, 2, 5, 2), (1, 3, 5, 3), (2, 1, 5, 4), (2, 3, 5, 5), (3, 2, 5, 6), (3, 3, 5, 7),
            (4, 9, 5, 8), (5, 1, 5, 9), (5, 1, 4, 10)]
    path = write(d / "u.data", "".join("\t".join(map(str, r)) + "\n" for r in rows))
    with pytest.raises(ConversionError, match=r"2 user\(s\) have a single distinct interaction .*--min_interactions"):
        convert.convert_ratings(path, valid_negative=1)  # the default keeps NVIDIA's behaviour: no filter
    out = tmp_path / "out"
    assert cli(["--path", path, "--output", str(out), "--valid_negative", "1", "--min_interactions", "2"]) == 0
    assert "--min_interactions 2: dropped 2 user(s) and 3 row(s)" in capsys.readouterr().out
    data = load_dataset(str(out))
    assert (data.num_users, data.num_items, len(data.train_users)) == (3, 3, 4)
    # every kept user has a training row and a test row
    assert sorted(set(data.train_users.tolist())) == [0, 1, 2]
    split = convert.convert_ratings(path, valid_negative=1, min_interactions=3)
    assert (split.num_users, split.dropped.users, split.dropped.rows) == (1, 4, 7)


def test_min_interactions_makes_a_random_movielens_sample_convertible(tmp_path, capsys):
    from recsys_testing import shared_data_path
    u_data = os.path.join(shared_data_path("movielens", "ml-100k"), "u.data")
    rng = np.random.default_rng(0)
    lines = open(u_data).read().splitlines()
    sample = [lines[i] for i in np.sort(rng.choice(len(lines), size=3000, replace=False))]
    d = tmp_path / "ml-100k"
    d.mkdir()
    path = write(d / "u.data", "\n".join(sample) + "\n")
    users = pd.Series([int(line.split("\t")[0]) for line in sample]).value_counts()
    lonely = int((users < 2).sum())
    assert lonely > 10  # the sample really has single-interaction users (else this test proves nothing)
    with pytest.raises(ConversionError, match="single distinct interaction"):
        convert.convert_ratings(path, valid_negative=100)
    out = tmp_path / "out"
    assert cli(["--path", path, "--output", str(out), "--min_interactions", "2"]) == 0
    assert f"dropped {lonely} user(s) and {lonely} row(s)" in capsys.readouterr().out
    data = load_dataset(str(out))
    assert data.num_users == len(users) - lonely and data.samples_per_series == 101


# ------------------------------------------------------------------ streaming reader vs the previous implementation
def _reference_read(path: str, spec) -> dict:
    """Read the whole file as text and check every line; int64 columns ``user, item, timestamp``.

    Slow and memory-hungry (about 14x the file), but it names the first bad line; used for ``::`` files and
    whenever the streaming parser refuses a file.
    """
    text = convert._read_text(path)
    if spec.separator == "::":
        text = text.replace("::", "\t")  # lets the fast C parser read ML-1m
        sep = "\t"
    else:
        sep = spec.separator
    lines = text.splitlines()
    first_data_line = 2 if spec.has_header else 1
    if spec.has_header:
        if not lines or not lines[0].strip():
            raise convert.ConversionError(f"{path}: empty file (expected a header line {','.join(spec.columns)})")
        header = [h.strip() for h in lines[0].split(sep)]
        missing = [c for c in (spec.user, spec.item, spec.timestamp) if c not in header]
        if missing:
            raise convert.ConversionError(f"{path}: line 1: header {lines[0]!r} lacks column(s) {missing}; "
                                  f"expected {sep.join(spec.columns)}")
        columns = header
        body = lines[1:]
    else:
        columns = list(spec.columns)
        body = lines
    # a trailing newline is fine; any other blank line is an error below
    while body and not body[-1].strip():
        body.pop()
    if not body:
        raise convert.ConversionError(f"{path}: empty file: no interactions")
    # column count, checked on every line (vectorised: count separators)
    counts = np.fromiter((line.count(sep) for line in body), dtype=np.int64, count=len(body)) + 1
    bad = np.flatnonzero(counts != len(columns))
    if bad.size:
        i = int(bad[0])
        raise convert.ConversionError(f"{path}: line {i + first_data_line}: expected {len(columns)} "
                              f"{sep!r}-separated fields ({', '.join(columns)}), found {counts[i]}: {body[i]!r}")
    frame = pd.read_csv(io.StringIO("\n".join(body)), sep=sep, header=None, names=columns, dtype=str,
                        usecols=[spec.user, spec.item, spec.timestamp], skip_blank_lines=False,
                        keep_default_na=False, engine="c")
    out = {}
    for target, source in (("user", spec.user), ("item", spec.item), ("timestamp", spec.timestamp)):
        values = pd.to_numeric(frame[source].str.strip(), errors="coerce")
        bad_rows = np.flatnonzero(values.isna().to_numpy() | (values.to_numpy() % 1 != 0))
        if bad_rows.size:
            i = int(bad_rows[0])
            raise convert.ConversionError(f"{path}: line {i + first_data_line}: column {source!r} must be an integer, "
                                  f"got {frame[source].iloc[i]!r}")
        out[target] = values.to_numpy().astype(np.int64)
    return out



def _reference_convert(path, fmt, valid_negative, seed, min_interactions):
    """The converter before it streamed (whole-file text parse + pandas leave-one-out), kept as the reference."""
    raw = pd.DataFrame(_reference_read(path, convert.FORMATS[fmt]))
    if min_interactions > 1:
        distinct = raw[["user", "item"]].drop_duplicates()
        per_user = distinct["user"].value_counts()
        sparse = per_user.index[per_user.to_numpy() < min_interactions]
        raw = raw[~np.isin(raw["user"].to_numpy(), sparse.to_numpy())].reset_index(drop=True)
    users, raw_users = pd.factorize(raw["user"])
    items, _ = pd.factorize(raw["item"])
    frame = pd.DataFrame({"user": users.astype(np.int64), "item": items.astype(np.int64),
                          "timestamp": raw["timestamp"].to_numpy()})
    frame = frame.sort_values("timestamp", kind="mergesort").drop_duplicates(subset=["user", "item"], keep="first")
    is_test = ~frame.duplicated(subset=["user"], keep="last")
    test = frame[is_test.to_numpy()].sort_values("user", kind="mergesort")
    train = frame[~is_test.to_numpy()]
    num_items = int(items.max()) + 1
    negatives = convert.sample_test_negatives(train["user"].to_numpy(), train["item"].to_numpy(),
                                              test["user"].to_numpy(), num_items, valid_negative, seed)
    candidates = np.concatenate([test["item"].to_numpy()[:, None], negatives], axis=1)
    return convert.Split(train["user"].to_numpy(), train["item"].to_numpy(), test["user"].to_numpy(), candidates,
                         len(raw_users), num_items)


def _ml20m_text(rng, rows, extra="", whole_stars=False):
    users = np.sort(rng.integers(1, 60, rows))
    items = rng.zipf(1.3, rows) % 400 + 1                       # popular items repeat: duplicate pairs
    stamps = rng.integers(1_000_000_000, 1_000_000_050, rows)    # few distinct times: many ties
    stars = (lambda: rng.integers(1, 6)) if whole_stars else (lambda: rng.integers(1, 11) / 2)
    return "".join(f"{u},{i},{stars()},{t}{extra}\n" for u, i, t in zip(users, items, stamps))


@pytest.mark.parametrize("case", ["ml-20m", "ml-20m-gz", "ml-20m-small-chunks", "ml-100k", "byo-extra-column",
                                  "checked-path-float-ids", "min-interactions", "ml-1m", "argsort-path",
                                  "wide-ids"])
def test_output_is_byte_identical_to_the_previous_converter(tmp_path, monkeypatch, case):
    rng = np.random.default_rng(7)
    d = tmp_path / "ml-20m"
    d.mkdir()
    fmt, min_interactions = "ml-20m", 0
    if case.startswith("ml-20m"):
        path = write(d / "ratings.csv", "userId,movieId,rating,timestamp\n" + _ml20m_text(rng, 3000))
        if case == "ml-20m-gz":
            import gzip
            with open(path, "rb") as f, gzip.open(path + ".gz", "wb") as g:
                g.write(f.read())
            os.remove(path)
            path += ".gz"
        if case == "ml-20m-small-chunks":  # chunks mixing int32 and int64 columns are joined in order
            monkeypatch.setattr(movielens_ctr, "RATINGS_BLOCK_BYTES", 256)
            text = open(path).read().replace("1000000001\n", "99000000001\n", 3)
            path = write(d / "ratings.csv", text)
    elif case == "ml-100k":
        fmt, path = "ml-100k", write(d / "u.data", _ml20m_text(rng, 2000, whole_stars=True).replace(",", "\t"))
    elif case == "byo-extra-column":
        body = "".join(f"{t},note {k},{i},{u}\n" for k, (u, i, _r, t) in
                       enumerate(line.split(",") for line in _ml20m_text(rng, 2000).splitlines()))
        fmt, path = "csv", write(d / "mine.csv", "timestamp,note,item_id,user_id\n" + body)
    elif case == "checked-path-float-ids":  # ids the C parser refuses as integers: the checked path reads them
        text = _ml20m_text(rng, 2000)
        path = write(d / "ratings.csv", "userId,movieId,rating,timestamp\n" + text.replace(",7,", ",7.0,") + "\n\n")
    elif case == "ml-1m":
        fmt, path = "ml-1m", write(d / "ratings.dat", _ml20m_text(rng, 2000, whole_stars=True).replace(",", "::"))
    elif case == "argsort-path":   # keys too wide to pack into 63 bits take the argsort path: the same output
        monkeypatch.setattr(convert, "_time_packs", lambda timestamps: False)
        path = write(d / "ratings.csv", "userId,movieId,rating,timestamp\n" + _ml20m_text(rng, 2000))
    elif case == "wide-ids":   # ids beyond int32 and far above the row count: pandas' factorize, int64 columns
        text = "".join(f"{int(u) * 10**12},{i},{r},{t}\n" for u, i, r, t in
                       (line.split(",") for line in _ml20m_text(rng, 2000).splitlines()))
        path = write(d / "ratings.csv", "userId,movieId,rating,timestamp\n" + text)
    else:
        path = write(d / "ratings.csv", "userId,movieId,rating,timestamp\n" + _ml20m_text(rng, 400) + "999,1,3,5\n")
        min_interactions = 2
    out_new, out_ref = tmp_path / "new", tmp_path / "ref"
    scans = []   # the line-by-line reader takes over only where pyarrow refuses a block (ids written as 7.0)
    real_scan = movielens_ctr._scan_lines
    monkeypatch.setattr(movielens_ctr, "_scan_lines", lambda *a: scans.append(a) or real_scan(*a))
    assert cli(["--path", path, "--output", str(out_new), "--format", fmt, "--valid_negative", "20",
                         "--min_interactions", str(min_interactions)]) == 0
    assert len(scans) == (1 if case == "checked-path-float-ids" else 0), scans
    monkeypatch.setattr(movielens_ctr, "_scan_lines", real_scan)
    convert.write_split(_reference_convert(path, fmt, 20, 1, min_interactions), str(out_ref))
    for name in ("feature_spec.yaml", "train.parquet", "test.parquet"):
        assert (out_new / name).read_bytes() == (out_ref / name).read_bytes(), name
    assert len(pd.read_parquet(out_new / "train.parquet")) > 200  # the cases are not trivially small
