"""`python triton/export_model.py -h`: NVIDIA's command name for ``deployment/deploy.py`` (runs that file)."""
import os
import runpy

if __name__ == "__main__":
    runpy.run_path(os.path.join(os.path.dirname(__file__), "..", "deployment", "deploy.py"), run_name="__main__")
