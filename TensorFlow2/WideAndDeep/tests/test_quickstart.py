"""quickstart.sh on tiny data, twice: it prints MAP@12 each time, and the rerun keeps the earlier outputs aside."""
import os
import re
import subprocess

from conftest import RECIPE_DIR, subprocess_env
from recsys_common.logger import read_log


def test_quickstart_prints_map_and_reruns(tmp_path):
    env = dict(subprocess_env(), QUICKSTART_DISPLAYS="600", QUICKSTART_MOVIELENS="0")
    out = tmp_path / "qs"
    for run in (1, 2):
        proc = subprocess.run(["bash", os.path.join(RECIPE_DIR, "quickstart.sh"), str(out)], env=env,
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        found = re.search(r"quickstart: Outbrain-format validation MAP@12 (\d\.\d{4}) AUC", proc.stdout)
        assert found, proc.stdout[-3000:]
        final = [r["data"] for r in read_log(str(out / "results" / "log.json")) if r["step"] == []][-1]
        assert float(found.group(1)) == round(final["eval_map12"], 4)   # the printed figure is this run's
    # the log keeps the final evaluation's click sums and buckets: plot_log draws the reliability diagram from it
    from recsys_common import plot_log
    buckets, sums = plot_log.reliability_from_log(str(out / "results" / "log.json"))
    assert sum(b[0] for b in buckets) == sums[0] > 0
    drawn = plot_log.main([str(out / "results" / "log.json"), "--output", str(tmp_path / "plots")])
    assert any(p.endswith("reliability.png") for p in drawn)
    assert (out / "model.previous").is_dir() and (out / "model").is_dir()
    assert (out / "results" / "log.json.1").exists()
