# Every target creates the virtualenv first if it is missing.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin

.PHONY: help venv demo demo-shop demo-payments test test-unit fuzz lint services clean drill bench \
	bench-quick cluster cluster-stop drill-cluster drill-downstream

help:
	@echo "make demo      run the demo against the local RabbitMQ and PostgreSQL (installs only the package)"
	@echo "make demo-shop the outbox and exactly-once points"
	@echo "make demo-payments"
	@echo "               payment gateway callbacks: receiver, state machine, reconciliation"
	@echo "make test      the whole test suite (unit, integration, acceptance, drills; the cluster tier"
	@echo "               and the short cluster drill when make cluster is up)"
	@echo "make test-unit only the tests that need no services"
	@echo "make fuzz      the generated hostile-input tier with thousands of cases (Hypothesis)"
	@echo "make drill     the full fault drill (restarts RabbitMQ's application, crashes a private"
	@echo "               PostgreSQL of its own; DRILL_ARGS=--help)"
	@echo "make lint      ruff, mypy --strict and the layer contracts (import-linter)"
	@echo "make bench     benchmarks against the anchors (20,000 messages a run; bench-quick: 3,000)"
	@echo "make cluster   a 3-node RabbitMQ cluster on this machine (rr1..rr3@localhost, AMQP ports"
	@echo "               5701-5703; scripts/cluster.sh); make cluster-stop stops it, removes its data"
	@echo "make drill-cluster  the fault drill on that cluster: 3 workers, a node and a worker lost"
	@echo "make drill-downstream  the WMS outage drill: a stub WMS down 60 s under 1,500 orders, the"
	@echo "               breaker's goal checked (DRILL_ARGS=\"--mode plain\": plain retries; --help)"
	@echo "make services  bring RabbitMQ and PostgreSQL up: Docker, else the installed services"
	@echo "               (scripts/services.sh; demo, test, fuzz, drill and bench do it themselves)"
	@echo "make venv      the development environment: the package with the dev extras"

# The package alone (what the demos need); the dev extras come on top, for tests and lint.
$(BIN)/rabbitretry: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e .
	touch $@

$(VENV)/.dev-extras: $(BIN)/rabbitretry
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $@

venv: $(VENV)/.dev-extras

demo: $(BIN)/rabbitretry services
	$(BIN)/python -m examples.demo

demo-shop: $(BIN)/rabbitretry services
	$(BIN)/python -m examples.shop_demo

demo-payments: $(BIN)/rabbitretry services
	$(BIN)/python -m examples.payments

test: venv services
	$(BIN)/python -m pytest

test-unit: venv
	$(BIN)/python -m pytest tests/unit

fuzz: venv services
	HYPOTHESIS_PROFILE=fuzz $(BIN)/python -m pytest -m generated tests/generated --hypothesis-show-statistics

drill: venv services
	$(BIN)/python -m drills $(DRILL_ARGS)

# Needs the cluster (make cluster); never touches the broker on 5672.
drill-cluster: venv services
	$(BIN)/python -m drills --cluster $(DRILL_ARGS)

# A downstream outage (docs/drills.md); leaves the broker and PostgreSQL as they are.
drill-downstream: venv services
	$(BIN)/python -m drills --downstream $(DRILL_ARGS)

lint: venv
	$(BIN)/ruff check rabbitretry tests examples drills bench
	$(BIN)/ruff format --check rabbitretry tests examples drills bench
	$(BIN)/mypy
	$(BIN)/lint-imports --no-cache

bench: venv services
	$(BIN)/python -m pip install --quiet -e '.[dev,bench]'
	$(BIN)/python -m bench

bench-quick: venv services
	$(BIN)/python -m pip install --quiet -e '.[dev,bench]'
	$(BIN)/python -m bench --quick

services:
	scripts/services.sh up

cluster:
	scripts/cluster.sh up

cluster-stop:
	scripts/cluster.sh down

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache *.egg-info
