"""Performance plumbing: glibc keeps freed memory, the compiled training step, the peer comparison, the
converter benchmark. Speed itself is measured by the benchmarks (README), not asserted here."""
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from neumf import train as ncf_train
from conftest import NCF_DIR
from recsys_testing import shared_data_path
from recsys_testing import import_script

RECIPE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
benchmark = import_script(os.path.join(RECIPE, "benchmarks", "training.py"), "ncf_benchmark_training")
benchmark_convert = import_script(os.path.join(RECIPE, "benchmarks", "convert.py"), "ncf_benchmark_convert")

ALLOC_PROBE = textwrap.dedent("""
    import resource, sys
    import numpy as np
    sys.path.insert(0, sys.argv[1])
    from neumf import train as ncf_train
    kept = ncf_train.keep_freed_memory() if sys.argv[2] == "1" else False
    def step():  # a 256 MB buffer touched, then freed, as a big training step's activations are
        a = np.ones(256 << 20, dtype=np.uint8); del a
    step()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(4):
        step()
    print(kept, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
""")


def _faults(setting):
    out = subprocess.run([sys.executable, "-c", ALLOC_PROBE, NCF_DIR, setting], capture_output=True, text=True,
                         check=True, env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    kept, faults = out.stdout.split()
    return kept == "True", int(faults)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mallopt is glibc's")
def test_keep_freed_memory_stops_refaulting_big_buffers():
    huge_pages = 4 * (256 << 20) // (2 << 20)  # fewest faults of 4 x 256 MB, even with 2 MB transparent huge pages
    kept, faults_kept = _faults("1")
    _, faults_default = _faults("0")
    assert kept
    assert faults_default >= huge_pages     # glibc's default: every step's buffer is mmap'd and faulted again
    assert faults_kept < 0.05 * huge_pages  # kept: the pages of the first step are reused (measured: 0)


def test_compiled_step_trains_like_the_eager_step_and_keeps_the_eager_state_dict(tiny_data, tmp_path):
    common = ["--data", tiny_data, "-b", "4096", "-l", "0.01", "-b1", "0.9", "-b2", "0.999", "-f", "8", "--layers",
              "16", "8", "--dropout", "0", "--seed", "3", "-e", "1", "--checkpoint_dir"]
    eager = ncf_train.main(common + [str(tmp_path / "eager"), "--log_path", str(tmp_path / "e.json")])
    compiled = ncf_train.main(common + [str(tmp_path / "compiled"), "--log_path", str(tmp_path / "c.json"), "--compile"])
    a = torch.load(tmp_path / "eager" / "model.pth", weights_only=True)["model"]
    b = torch.load(tmp_path / "compiled" / "model.pth", weights_only=True)["model"]
    assert list(a) == list(b)  # the eager module's keys (no "_orig_mod." prefix): exporters load it unchanged
    for name in a:  # same maths; float reassociation in the fused kernels only
        torch.testing.assert_close(b[name], a[name], rtol=1e-3, atol=1e-4)
    assert compiled["best_hr@10"] == pytest.approx(eager["best_hr@10"], abs=0.01)


FAKE_PEER = textwrap.dedent("""
    import json, sys
    args = sys.argv[1:]
    epochs = int(args[args.index("--epochs") + 1])
    print("# log line", file=sys.stderr)
    print(json.dumps({"args": args, "per_epoch": [{"epoch": e + 1, "hr10": 0.30 + 0.1 * e} for e in range(epochs)],
                      "train_samples_per_s": 900.0, "train_samples_per_s_excl_epoch1": 1000.0}))
""")


def test_benchmark_runs_the_peer_with_the_same_settings_and_reports_the_ratio(tmp_path, monkeypatch):
    peer = tmp_path / "peer.py"
    peer.write_text(FAKE_PEER)
    root = os.path.dirname(shared_data_path("ncf-ml-1m"))  # RECSYS_DATA_DIR: the peer's --data
    monkeypatch.setattr(benchmark, "_loop", lambda args, *rest: {  # the recipe's loop is tested elsewhere
        "train_samples_per_s": 2500.0, f"hr@{args.topk}_per_epoch": [0.35, 0.38]})
    result = benchmark.main(["--paper_ml1m", root, "--peer", str(peer), "-e", "2", "-b", "65536", "--no_naive",
                             "-f", "4", "--layers", "8", "4", "--seed", "5"])
    assert (result["users"], result["items"], result["train_positives"]) == (2998, 3706, 484517)
    args = result["peer"]["args"]
    assert args[args.index("--batch") + 1] == "65536" and args[args.index("--seed") + 1] == "5"
    assert args[args.index("--data") + 1] == root and args[args.index("--dropout") + 1] == "0.5"
    assert result["train_speedup_vs_peer"] == pytest.approx(2.5)
    assert result["hr_vs_peer_per_epoch"] == pytest.approx([0.05, -0.02])
    assert result["hr_at_least_peer_every_epoch"] is False


def test_benchmark_refuses_a_peer_without_the_paper_split(tmp_path, capsys):
    with pytest.raises(SystemExit):
        benchmark.main(["--shape", "tiny", "--peer", str(tmp_path / "peer.py")])
    assert "--peer needs --paper_ml1m" in capsys.readouterr().err


def test_benchmark_convert_smoke(tmp_path):
    result = benchmark_convert.main(["--rows", "3000", "--users", "50", "--items", "200", "--workdir",
                                     str(tmp_path), "--output_json", str(tmp_path / "r.json")])
    assert result["rows"] == 3000 and result["input_bytes"] == os.path.getsize(tmp_path / "ratings.csv")
    lines = open(tmp_path / "ratings.csv").read().splitlines()
    assert lines[0] == "userId,movieId,rating,timestamp" and len(lines) == 3001
    c = result["convert"]
    assert c["peak_rss_bytes"] > 10 << 20 and c["peak_rss_over_input"] == c["peak_rss_bytes"] / result["input_bytes"]
    assert "50 users" in c["message"]
    assert json.load(open(tmp_path / "r.json"))["rows"] == 3000
