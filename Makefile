# Every target creates the virtualenv first if it is missing.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin

.PHONY: help venv demo demo-shop test test-unit lint services clean drill

help:
	@echo "make demo      run the demo against the local RabbitMQ and PostgreSQL"
	@echo "make demo-shop the outbox and exactly-once points"
	@echo "make test      the whole test suite (unit, integration, acceptance, drills)"
	@echo "make test-unit only the tests that need no services"
	@echo "make drill     the full fault drill (restarts RabbitMQ's application; DRILL_ARGS=--help)"
	@echo "make lint      ruff and mypy --strict"
	@echo "make services  start RabbitMQ and PostgreSQL with Docker (docker-compose.yml)"

$(BIN)/rabbitretry: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $@

venv: $(BIN)/rabbitretry

demo: venv
	$(BIN)/python -m examples.demo

demo-shop: venv
	$(BIN)/python -m examples.shop_demo

test: venv
	$(BIN)/python -m pytest

test-unit: venv
	$(BIN)/python -m pytest tests/unit

drill: venv
	$(BIN)/python -m drills $(DRILL_ARGS)

lint: venv
	$(BIN)/ruff check rabbitretry tests examples drills
	$(BIN)/ruff format --check rabbitretry tests examples drills
	$(BIN)/mypy

services:
	docker compose up -d --wait

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache *.egg-info
