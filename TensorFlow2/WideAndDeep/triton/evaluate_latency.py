"""`python triton/evaluate_latency.py -h`: NVIDIA's command name for ``deployment/evaluate_latency.py`` (runs that file)."""
import os
import runpy

if __name__ == "__main__":
    runpy.run_path(os.path.join(os.path.dirname(__file__), "..", "deployment", "evaluate_latency.py"), run_name="__main__")
