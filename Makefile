# The two commands: `make demo` and `make test`. Both build .venv on first use and fetch Kwok's
# stock Stage files (`make kwok-stages`: the Go module proxy, into .cache/kwok, once); `make test`
# also fetches Apache Kafka (`make kafka`: Maven Central, into .cache/kafka, once).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test e2e lint typecheck clean venv kafka kwok-stages

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

# Apache Kafka's broker jars for the tests and `koordstream broker --kafka` (needs mvn; Java 17+ to run).
kafka:
	bash infra/kafka/install.sh

# Kwok's stock Stage files and CRDs (sigs.k8s.io/kwok, infra/k8s/versions.env), which the
# Kwok-compatible lifecycle loads unchanged and its tests check against Kwok's testdata (needs go).
kwok-stages:
	bash infra/k8s/kwok-stages.sh

demo: $(STAMP) kwok-stages
	$(BIN)/koordstream demo --nodes 1000 --pods 10000 --rate 2000 --json out/demo.json

test: $(STAMP) kafka kwok-stages
	$(BIN)/python -m pytest -q --durations=15

# The longer end-to-end runs CI adds after `make test`: the quick chaos run (workers and the
# broker killed -9 under load, then the independent check) on Apache Kafka and on Tansu, the
# state retention on both brokers, the quick soak (state stays flat) on Tansu, and the quick
# variants of the shipped perf scenarios, the rebalancer on Apache Kafka with its leader killed,
# and the longest crash and takeover runs (tests/integration/conftest.py, E2E_ONLY).
e2e: $(STAMP) kafka kwok-stages
	$(BIN)/python -m pytest -q --durations=10 -m e2e tests/e2e tests/integration/test_retention.py tests/integration/test_perf.py \
		tests/integration/test_rebalancer.py tests/integration/test_restart.py tests/integration/test_transactions.py

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy schemas agents streams perf cli
	$(BIN)/lint-imports

clean:
	rm -rf $(VENV) out build *.egg-info
