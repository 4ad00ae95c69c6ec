# Packrat operator: every setup step lives here, so a fresh machine needs only `make demo` / `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PY := $(BIN)/python
STAMP := $(VENV)/.installed
PIP := $(PY) -m pip --disable-pip-version-check -q

.PHONY: venv demo test unit integration lint typecheck layers bench bench-optimizer e2e-kind images clean crds-sync docs

venv: $(STAMP)

# torch first and explicitly: the CPU build 2.13.0 (a looser spec may pull a multi-GB CUDA build).
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade pip
	$(PIP) install torch==2.13.0 numpy==2.4.6
	$(PIP) install -e '.[serve,operator,dev]'
	touch $(STAMP)

demo: venv
	$(BIN)/packrat demo

lint: venv
	$(BIN)/ruff check operator tests benchmarks
	$(BIN)/ruff format --check operator tests benchmarks

typecheck: venv
	$(BIN)/mypy

layers: venv
	$(BIN)/lint-imports

unit: venv
	$(BIN)/pytest tests/unit -q

integration: venv
	$(BIN)/pytest tests/integration -q

# The README's test command: lint, types, layering, then the whole suite.
test: lint typecheck layers
	$(BIN)/pytest tests -q

bench-optimizer: venv
	$(BIN)/python benchmarks/optimizer_bench.py

bench: venv
	$(BIN)/packrat bench --model resnet50 --cpus 2 --batch 4,8,16,32

e2e-kind: venv
	$(BIN)/pytest tests/e2e_kind -q -m e2e_kind

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache
