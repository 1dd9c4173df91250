# The two commands a newcomer needs: `make demo` (the main job) and `make test`.
# Everything else is plumbing around `python -m stack`, which installs and runs the local stack.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-$(shell cksum pyproject.toml | cut -d' ' -f1)

.PHONY: help demo test test-unit lint format up down status logs psql footprint bench clean

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-10s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	@rm -f $(VENV)/.installed-* && touch $@

demo: up ## the main job: stream likes and follows through Kafka, then read counts and friends
	set -a && . .state/stack.env && set +a && PGUSER=sv_reader $(PY) -m loadgen.demo

test: $(STAMP) ## start the stack if needed, then run every test (unit and integration)
	$(PY) -m stack up
	$(PY) -m pytest --durations=15 tests

test-unit: $(STAMP) ## only the tests that need no services
	$(PY) -m pytest tests/unit

lint: $(STAMP) ## ruff lint and format check, then the import layers (pyproject.toml [tool.importlinter])
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports

format: $(STAMP) ## apply ruff's formatting and safe fixes
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

up: $(STAMP) ## install what is missing and start Kafka, Connect, PostgreSQL, Elasticsearch
	$(PY) -m stack up

down: $(STAMP) ## stop every service (data stays in .state/)
	$(PY) -m stack down

status: $(STAMP) ## state, readiness, port and memory of each service
	$(PY) -m stack status

logs: $(STAMP) ## follow every service's log (make logs S=kafka for one)
	$(PY) -m stack logs -f $(S)

psql: $(STAMP) ## psql as the read-only role (ROLE=sv_owner for another)
	set -a && . .state/stack.env && psql -U $${ROLE:-sv_reader}

footprint: $(STAMP) ## measure cold and warm `up` times and each service's memory
	$(PY) -m loadgen.footprint

bench: $(STAMP) ## every benchmark, then BENCHMARKS.md and docs/bench/*.png (BENCH_ARGS=--quick: a short check)
	$(PY) -m stack up
	set -a && . .state/stack.env && set +a && $(PY) -m loadgen.suite $(BENCH_ARGS)

clean: down ## stop the stack and delete its state (data, logs, secrets)
	rm -rf .state
