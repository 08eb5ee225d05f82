# Everyday targets: `make demo`, `make test`, `make lint`, `make figures`.
# Every target creates and fills the virtual environment first when it is missing.

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.qbench-installed
NVCC   ?= $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
CUDA_ARCHS ?= 80 90
DEMO_OUT ?= results/smoke

# Python may cache compiled modules (in __pycache__/, ignored by git) whatever the caller's
# environment says: with PYTHONDONTWRITEBYTECODE set, every process the tests and sweeps start
# (ranks, rank servers, drivers, test workers) compiled qbench and the tests again; collecting
# the suite took 26 s of CPU per worker instead of 11 (docs/results/timings.md).
unexport PYTHONDONTWRITEBYTECODE

.PHONY: venv demo test test-fast test-slow lint kernels cuda-coverage figures clean mutation

venv: $(STAMP)

# tests/plugin_example: a third-party plug-in (compressor + scheme by entry points) the tests use.
$(STAMP): setup.cfg pyproject.toml tests/plugin_example/pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --progress-bar off -e '.[dev]' -e tests/plugin_example
	touch $@

# The main job on the embedded default scenario: CPU ranks, synthetic data.
demo: venv
	$(BIN)/qbench sweep --out $(DEMO_OUT)
	$(BIN)/qbench report $(DEMO_OUT)

# One pytest session, two workers (TEST_WORKERS): the multi-process tests, which launch ranks of
# their own, go out first, whole files per worker (an xdist_group per file, tests/conftest.py:
# the tests of one file share the machine's network namespaces or Slurm, never two at once), the
# longest first; the single-process tests then fill both workers to the end, so neither waits.
# One session collects the suite once per worker, not twice. More workers than two would run
# more multi-process files at once than their timeouts allow for (TEST_WORKERS=0: one process).
TEST_WORKERS ?= 2
TESTS = $(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadgroup --no-loadscope-reorder

test: venv
	$(TESTS)

test-fast: venv
	$(TESTS) -m "not slow"

test-slow: venv
	$(TESTS) -m slow

lint: venv kernels
	$(BIN)/ruff check qbench tests
	$(BIN)/ruff format --check qbench tests
	$(BIN)/mypy

# Mutation testing of the pure core (not part of `make test`; docs/results/mutation.md): mutmut,
# pinned, goes into the venv; each group of setup.cfg's [mutmut:NAME] sections runs its own fast
# tests against its modules' mutants in build/mutation/NAME/, one worker at low priority.
# MUTATION='costmodel bitpack' runs some groups; the table of scores is printed at the end, and
# the target fails when a module scores under 85 %.
MUTMUT_VERSION ?= 3.8.1
MUTATION ?=
MUTATION_CHILDREN ?= 1
mutation: venv
	test -f $(VENV)/.mutmut-$(MUTMUT_VERSION) || { $(BIN)/python -m pip install --quiet \
	  --progress-bar off mutmut==$(MUTMUT_VERSION) && touch $(VENV)/.mutmut-$(MUTMUT_VERSION); }
	nice -n 10 $(BIN)/python tests/mutation.py --max-children $(MUTATION_CHILDREN) $(MUTATION)

# Compile every CUDA source for the GPUs we target, so kernel errors never wait for a GPU.
kernels:
	@if [ -z "$(NVCC)" ]; then echo "kernels: nvcc not found, CUDA sources not compiled"; \
	elif ls kernels/*.cu >/dev/null 2>&1; then \
	  mkdir -p kernels/build && for f in kernels/*.cu; do for a in $(CUDA_ARCHS); do \
	    echo "nvcc sm_$$a $$f"; \
	    $(NVCC) -std=c++17 -arch=sm_$$a -Ikernels -cubin -o kernels/build/$$(basename $$f .cu).sm_$$a.cubin $$f || exit 1; \
	  done; done; \
	else echo "kernels: no CUDA sources"; fi

# Line coverage of kernels/*.cu run on CPU threads by the CUDA emulator (gcov on an -O0
# --coverage build; docs/cuda-emulation.md). Exits non-zero unless every kernel line ran; gcov's
# annotated sources stay in kernels/build/coverage.
cuda-coverage: venv
	$(BIN)/python -m qbench.compress.kernels.cuda.coverage --out kernels/build/coverage

# Every figure of the paper scenarios: each scenarios/paper/*.yaml is swept into results/<name>
# (resuming: finished runs are kept) and reported; figures and the report page go to
# figures/<name>/. Before any run starts, every scenario's pre-flight (`qbench sweep --check`):
# what `make data` can install is installed (where apt-get works as root), and whatever is still
# missing stops the target with one line per prerequisite and its fix (exit 2), nothing run.
# A scenario with failed runs is still reported; the target then exits 1, naming them.
# By default each scenario runs at seed 0 only (FIGURES_SET); `make figures FULL=1` runs every
# seed the scenarios list (3 for the accuracy scenarios: mean +/- std), FIGURES_SET='--set
# backend=nccl ...' moves the same scenarios to GPUs, and QUICK=1 runs every axis value at
# a tiny scale (`qbench sweep --quick`) into results/quick/ and figures/quick/.
PAPER ?= $(sort $(wildcard scenarios/paper/*.yaml))
FIGURES_SET ?= $(if $(FULL),,--set seed=0) $(if $(QUICK),--quick)
FIGURES_RESULTS ?= results$(if $(QUICK),/quick)
FIGURES_DIR ?= figures$(if $(QUICK),/quick)
FIGURES_CHECK = for s in $(PAPER); do $(BIN)/qbench sweep $$s $(FIGURES_SET) \
	  --out $(FIGURES_RESULTS)/$$(basename $$s .yaml) --check 2>&1 >/dev/null; done | sort -u
figures: venv
	@missing=$$($(FIGURES_CHECK)); \
	if echo "$$missing" | grep -q "make data"; then \
	  $(MAKE) --no-print-directory data && missing=$$($(FIGURES_CHECK)); fi; \
	if [ -n "$$missing" ]; then \
	  echo "figures: nothing was run; this machine lacks what the scenarios need:" >&2; \
	  echo "$$missing" | sed 's/^/  /' >&2; exit 2; fi
	@failed=""; for s in $(PAPER); do n=$$(basename $$s .yaml); r=$(FIGURES_RESULTS)/$$n; \
	  $(BIN)/qbench sweep $$s --out $$r $(FIGURES_SET) || failed="$$failed $$n"; \
	  $(BIN)/qbench report $$r --format md > /dev/null && \
	  mkdir -p $(FIGURES_DIR)/$$n && cp $$r/report/*.png $$r/report/*.pdf \
	    $$r/report/index.* $$r/report/summary.md $(FIGURES_DIR)/$$n/; \
	done; echo "figures: written to $(FIGURES_DIR)/"; \
	if [ -n "$$failed" ]; then \
	  echo "figures: runs failed in:$$failed (see $(FIGURES_RESULTS)/<name>/report/summary.md)" >&2; \
	  exit 1; fi

clean:
	rm -rf kernels/build .mypy_cache .ruff_cache .pytest_cache

# Slurm for the slurm launcher and its tests (tests/slurm_cluster.py starts a single-node cluster
# on localhost from these): Debian's slurm-wlm and munge. libpmix-dev is for `slurm: {mpi: pmix}`
# only: Debian 12's Slurm PMIx plugin loads the unversioned libpmix.so, which only it ships.
SLURM_PACKAGES ?= slurm-wlm munge libpmix-dev
.PHONY: slurm
slurm:
	@if ! command -v apt-get >/dev/null 2>&1; then \
	  echo "slurm: no apt-get here; install Slurm (slurmctld, slurmd, sbatch, srun) and munge" \
	    "with your package manager, or run the slurm tests on Debian/Ubuntu" >&2; exit 1; \
	elif [ "$$(id -u)" != 0 ]; then \
	  echo "slurm: installing packages needs root; run: sudo apt-get install -y $(SLURM_PACKAGES)" >&2; \
	  exit 1; \
	else \
	  export DEBIAN_FRONTEND=noninteractive; \
	  apt-get install -y $(SLURM_PACKAGES) || { apt-get update && apt-get install -y $(SLURM_PACKAGES); }; \
	fi

# Real data for accuracy mode: Debian's dataset-fashion-mnist installs the real Fashion-MNIST IDX
# files in /usr/share/datasets/fashion-mnist, and fortunes the text corpus of the GPT workload in
# /usr/share/games/fortunes (nothing is downloaded at run time; scikit-learn ships the digits
# set). Where apt-get is missing, set QBENCH_DATA to a directory with fashion-mnist/ and fortunes/.
DATA_PACKAGES ?= dataset-fashion-mnist fortunes
.PHONY: data
data:
	@if ls /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte* >/dev/null 2>&1 && \
	    [ -f /usr/share/games/fortunes/computers ]; then \
	  echo "data: Fashion-MNIST and fortunes present in /usr/share/datasets, /usr/share/games"; \
	elif ! command -v apt-get >/dev/null 2>&1 || [ "$$(id -u)" != 0 ]; then \
	  echo "data: cannot install $(DATA_PACKAGES) here (needs apt-get as root); set QBENCH_DATA" \
	    "to a directory holding fashion-mnist/ (the four IDX files) and fortunes/" >&2; exit 1; \
	else \
	  export DEBIAN_FRONTEND=noninteractive; \
	  apt-get install -y $(DATA_PACKAGES) || { apt-get update && apt-get install -y $(DATA_PACKAGES); }; \
	fi

# A real browser for the report page's test (tests/report/page/test_page_browser.py loads
# index.html in headless Chromium, checks images and the console, and saves a screenshot):
# Debian's chromium.
BROWSER_PACKAGES ?= chromium
.PHONY: browser
browser:
	@if command -v chromium >/dev/null 2>&1; then \
	  echo "browser: $$(command -v chromium) present"; \
	elif ! command -v apt-get >/dev/null 2>&1; then \
	  echo "browser: no apt-get here; install Chromium (or set QBENCH_BROWSER to a Chrome or" \
	    "Chromium binary) for the report page's browser test" >&2; exit 1; \
	elif [ "$$(id -u)" != 0 ]; then \
	  echo "browser: installing packages needs root; run: sudo apt-get install -y $(BROWSER_PACKAGES)" >&2; \
	  exit 1; \
	else \
	  export DEBIAN_FRONTEND=noninteractive; \
	  apt-get install -y --no-install-recommends $(BROWSER_PACKAGES) || \
	    { apt-get update && apt-get install -y --no-install-recommends $(BROWSER_PACKAGES); }; \
	fi
