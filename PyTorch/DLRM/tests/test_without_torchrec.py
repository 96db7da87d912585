"""The plain EmbeddingBag path must run where TorchRec and FBGEMM are not installed at all."""
import subprocess
import sys
import textwrap

from conftest import RECIPE_DIR, subprocess_env

BLOCK_IMPORTS = textwrap.dedent("""
    import sys
    class _Blocker:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("torchrec", "fbgemm_gpu"):
                raise ImportError(f"No module named {name!r} (blocked by the test)")
            return None
    sys.meta_path.insert(0, _Blocker())
""")


def run_python(code, tmp_path):
    proc = subprocess.run([sys.executable, "-c", BLOCK_IMPORTS + textwrap.dedent(code)], cwd=RECIPE_DIR,
                          env=subprocess_env(), capture_output=True, text=True, timeout=300)
    return proc


def test_auto_falls_back_to_embedding_bag_and_trains(small_dataset, tmp_path):
    proc = run_python(f"""
        from dlrm.model import torchrec_available
        assert not torchrec_available()
        from dlrm.train import main
        r = main(["--dataset", {small_dataset!r}, "--batch_size", "256", "--lr", "0.5", "--warmup_steps", "5",
                  "--max_steps", "16", "--embedding_dim", "16", "--bottom_mlp_sizes", "32,16",
                  "--top_mlp_sizes", "32,1", "--print_freq", "0", "--log_path", {str(tmp_path / 'log.json')!r}])
        assert r["embedding_type"] == "multi_table", r
        assert r["auc"] > 0.55, r
        import sys
        assert "torchrec" not in sys.modules and "fbgemm_gpu" not in sys.modules
        print("AUC", r["auc"])
    """, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "AUC" in proc.stdout


def test_requesting_torchrec_without_it_says_what_to_install(small_dataset, tmp_path):
    proc = subprocess.run([sys.executable, "-c", BLOCK_IMPORTS + "import sys, runpy; sys.argv = ['main', "
                           f"'--dataset', {small_dataset!r}, '--embedding_type', 'torchrec_fused', '--log_path', "
                           f"{str(tmp_path / 'log.json')!r}]; "
                           "from dlrm.train import command_line; sys.exit(command_line())"],
                          cwd=RECIPE_DIR, env=subprocess_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1
    assert "needs torchrec and fbgemm-gpu" in proc.stderr and "--embedding_type multi_table" in proc.stderr
