# Entry points of the monorepo. Everything runs with the venv's python explicitly
# (no 'source activate' needed).
#
#   make setup        build/refresh .venv (ci/setup_env.sh; a no-op when up to date): all a recipe needs
#   make setup-horovod      Horovod into .venv (ci/setup_horovod.sh; ~8 min the first time): horovodrun runs
#   make setup-nvtabular    .venv-nvtabular (ci/setup_nvtabular_env.sh): the ETLs' --engine nvtabular
#   make test         the three setups, then every component's tests, each in its own pytest process
#   make test-<c>     one component: test-common test-ci test-ncf test-pytorch-dlrm
#                     test-wide-and-deep test-dlrm-dcnv2
#   make quickstart   setup, then $(QUICKSTART): DLRM, NCF, TF2 DLRM and DCNv2, then Wide & Deep on generated data
#   make quickstart-dlrm / quickstart-ncf / quickstart-dlrm-dcnv2 / quickstart-wide-and-deep   one of them
#
# PYTEST_ARGS="-x -k name" passes extra arguments to pytest.

SHELL := /bin/bash
VENV ?= $(CURDIR)/.venv
PYTHON := $(VENV)/bin/python
export RECSYS_VENV := $(VENV)

# TF recipes use tf-keras (Keras 2): Horovod's Keras integration needs it.
export TF_USE_LEGACY_KERAS := 1
# Spark otherwise binds a non-loopback address.
export SPARK_LOCAL_IP := 127.0.0.1
# MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=1000000000000 help the big-buffer benchmarks on these VMs
# (see the recipes' benchmark scripts); they are not set for tests.

# The main job on built-in defaults (synthetic data, CPU): DLRM, then NCF (PyTorch), then DLRM and DCNv2 (TensorFlow 2),
# each about a minute on 2 idle cores.
QUICKSTART ?= bash PyTorch/DLRM/quickstart.sh /tmp/dlrm_quickstart && bash PyTorch/NCF/quickstart.sh /tmp/ncf_quickstart \
              && bash TensorFlow2/DLRM_DCNv2/quickstart.sh /tmp/dlrm_dcnv2_quickstart \
              && bash TensorFlow2/WideAndDeep/quickstart.sh /tmp/wide_deep_quickstart

.PHONY: setup setup-horovod setup-nvtabular test quickstart quickstart-dlrm quickstart-ncf quickstart-dlrm-dcnv2 quickstart-wide-and-deep test-common test-ci test-ncf test-pytorch-dlrm test-wide-and-deep \
        test-dlrm-dcnv2 help

help:
	@sed -n '1,10p' Makefile | sed 's/^# \{0,1\}//'

setup:
	bash ci/setup_env.sh

setup-horovod: setup
	bash ci/setup_horovod.sh

setup-nvtabular:
	bash ci/setup_nvtabular_env.sh

# The tests that compare our ETL engines with NVTabular's run it in .venv-nvtabular: required, not skipped, once
# make has built it.
test: setup setup-horovod setup-nvtabular
	RECSYS_REQUIRE_NVTABULAR=1 bash ci/run_tests.sh

quickstart: setup
	$(QUICKSTART)

quickstart-dlrm: setup
	bash PyTorch/DLRM/quickstart.sh /tmp/dlrm_quickstart

quickstart-ncf: setup
	bash PyTorch/NCF/quickstart.sh /tmp/ncf_quickstart

quickstart-dlrm-dcnv2: setup
	bash TensorFlow2/DLRM_DCNv2/quickstart.sh /tmp/dlrm_dcnv2_quickstart

quickstart-wide-and-deep: setup
	bash TensorFlow2/WideAndDeep/quickstart.sh /tmp/wide_deep_quickstart

test-common: setup
	bash ci/run_tests.sh common
test-ci: setup setup-horovod
	bash ci/run_tests.sh ci
test-ncf: setup
	bash ci/run_tests.sh PyTorch/NCF
test-pytorch-dlrm: setup
	bash ci/run_tests.sh PyTorch/DLRM
test-wide-and-deep: setup setup-horovod setup-nvtabular
	RECSYS_REQUIRE_NVTABULAR=1 bash ci/run_tests.sh TensorFlow2/WideAndDeep
test-dlrm-dcnv2: setup setup-horovod
	bash ci/run_tests.sh TensorFlow2/DLRM_DCNv2
