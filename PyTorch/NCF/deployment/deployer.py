"""NVIDIA's name for the deploy command: ``python deployment/deployer.py ...`` runs ``deployment/deploy.py``."""
import os
import runpy

if __name__ == "__main__":
    runpy.run_path(os.path.join(os.path.dirname(os.path.abspath(__file__)), "deploy.py"), run_name="__main__")
