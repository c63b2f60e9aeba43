# The two commands: `make demo` and `make test`. Both build .venv on first use; `make test`
# also fetches Apache Kafka (`make kafka`: Maven Central, into .cache/kafka, once), Kwok's
# stock Stage files (`make kwok-stages`), Koordinator's CRDs (`make koordinator-crds`) and
# agent-sandbox's CRDs (`make agent-sandbox-crds`) from the Go module proxy, and builds the Kubernetes control plane the bridge's tests run against
# (`make k8s`: kube-apiserver, etcd and Kwok with Go, into .cache/k8s, once).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test e2e lint typecheck clean venv kafka k8s koordinator-crds agent-sandbox-crds kwok-stages

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

# Apache Kafka's broker jars for the tests and `koordstream broker --kafka` (needs mvn; Java 17+ to run).
kafka:
	bash infra/kafka/install.sh

# The real control plane for the bridge's tests and `koordstream cluster up` (needs Go 1.26;
# about 15 minutes on two cores the first time).
k8s:
	bash infra/k8s/install.sh

# Koordinator's own CRD manifests (Reservation, PodGroup, ElasticQuota), from the Go module proxy.
koordinator-crds:
	bash infra/k8s/koordinator-crds.sh

# agent-sandbox's own CRD manifests (SandboxTemplate, SandboxWarmPool, SandboxClaim), from the Go module proxy.
agent-sandbox-crds:
	bash infra/k8s/agent-sandbox-crds.sh

# Kwok's stock Stage files and CRDs (sigs.k8s.io/kwok, infra/k8s/versions.env), which the
# Kwok-compatible lifecycle loads unchanged and its tests check against Kwok's testdata (needs go).
kwok-stages:
	bash infra/k8s/kwok-stages.sh

demo: $(STAMP)
	$(BIN)/koordstream demo --nodes 1000 --pods 10000 --rate 2000 --json out/demo.json

test: $(STAMP) kafka kwok-stages koordinator-crds agent-sandbox-crds k8s
	$(BIN)/python -m pytest -q --durations=15

# The longer end-to-end runs CI adds after `make test`: the quick chaos run (workers and the
# broker killed -9 under load, then the independent check) on Apache Kafka and on Tansu, the
# state retention on both brokers, the quick soak (state stays flat) on Tansu, and the quick
# variants of the shipped perf scenarios (in-process, and one through the real API server and
# Kwok), the rebalancer on Apache Kafka with its leader killed, the longest crash and takeover
# runs (tests/integration/conftest.py, E2E_ONLY: a warm pool's state worker killed mid-burst
# among them), and the bridge's longest runs.
e2e: $(STAMP) kafka kwok-stages koordinator-crds agent-sandbox-crds k8s
	$(BIN)/python -m pytest -q --durations=10 -m e2e tests/e2e tests/integration/test_retention.py tests/integration/test_perf.py \
		tests/integration/test_perf_kwok.py tests/integration/test_rebalancer.py tests/integration/test_restart.py \
		tests/integration/test_transactions.py tests/integration/test_bridge.py tests/integration/test_bridge_adversary.py \
		tests/integration/test_sandbox_crash.py tests/integration/test_cli.py tests/integration/test_shutdown.py \
		tests/integration/test_up.py tests/integration/test_kafka_broker.py tests/integration/test_gangs.py \
		tests/integration/test_bridge_sandbox.py

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy schemas agents streams perf cli
	$(BIN)/lint-imports

clean:
	rm -rf $(VENV) out build *.egg-info
