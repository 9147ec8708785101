# Two commands set everything up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
# numba's cache of the compiled kernels, made at install and whenever a kernel changes, so
# that no command compiles them (numba keys its cache on each source file's time and size).
WARMED := $(VENV)/.warmed-stamp
KERNELS := $(wildcard src/outcore/*/kernels/*.py)
EXTRAS := io,mpi,notebook,dev
# Test processes (pytest-xdist), each running whole test files: on 2 cores the suite takes
# 10.6 min instead of 16.9 with one (it waits on worker and MPI start-up much of the time).
TEST_WORKERS ?= 2

.PHONY: demo test lint bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e ".[$(EXTRAS)]"
	$(BIN)/python -m ipykernel install --sys-prefix --name python3 >/dev/null
	touch $(STAMP)

$(WARMED): $(STAMP) $(KERNELS)
	$(BIN)/outcore warm
	touch $(WARMED)

demo: $(WARMED)
	$(BIN)/outcore demo

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks

test: lint $(WARMED)
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile

bench: $(WARMED)
	$(BIN)/python benchmarks/run_all.py

clean:
	rm -rf $(VENV) runs
