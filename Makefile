# Conveyor — `make help` lists the targets.
VENV   ?= .venv
PY     := $(VENV)/bin/python
PYTEST_ARGS ?=
# test processes (pytest-xdist): the suite mostly waits on servers, subprocesses and
# browsers, so two processes on two cores take about 60% of the serial time
TEST_WORKERS ?= 2

.DEFAULT_GOAL := help
.PHONY: help install demo test test-django test-versions bench lint types docs check clean

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN{FS=":.*## "}{printf "  make %-13s %s\n", $$1, $$2}'

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

# An editable install leaves src/ uncompiled, and where PYTHONDONTWRITEBYTECODE is set
# every process (each `conveyor worker`) compiles it again: about 80 ms of start-up.
install: $(VENV)/.installed ## create .venv and install Conveyor with its dev tools
	@$(PY) -m compileall -q src

demo: install ## run the demo on embedded SQLite (no server needed)
	$(VENV)/bin/conveyor demo

test: install ## run the whole suite on SQLite, PostgreSQL and MariaDB (finds or starts both servers), the backend suite again through mysqlclient, and the Django tests
	@bash scripts/ensure-chromium.sh || exit 1
	@bash scripts/ensure-pgbouncer.sh || exit 1
	@url=$$(PYTHON=$(PY) bash scripts/ensure-postgres.sh) || exit 1; \
	echo "PostgreSQL for tests: $$url"; \
	myurl=$$(PYTHON=$(PY) bash scripts/ensure-mysql.sh) || exit 1; \
	echo "MySQL for tests: $$myurl"; \
	CONVEYOR_TEST_POSTGRES_URL=$$url CONVEYOR_TEST_MYSQL_URL=$$myurl $(PY) -m pytest -n $(TEST_WORKERS) $(PYTEST_ARGS) && \
	CONVEYOR_TEST_MYSQL_URL=$$myurl PYTHON=$(PY) TEST_WORKERS=$(TEST_WORKERS) bash scripts/test-mysqlclient.sh $(PYTEST_ARGS) && \
	CONVEYOR_TEST_POSTGRES_URL=$$url CONVEYOR_TEST_MYSQL_URL=$$myurl bash scripts/test-django.sh

test-django: install ## the Django integration tests alone (.venv-django, Python 3.12+; all three databases)
	@url=$$(PYTHON=$(PY) bash scripts/ensure-postgres.sh) || exit 1; \
	myurl=$$(PYTHON=$(PY) bash scripts/ensure-mysql.sh) || exit 1; \
	CONVEYOR_TEST_POSTGRES_URL=$$url CONVEYOR_TEST_MYSQL_URL=$$myurl bash scripts/test-django.sh

test-versions: ## the SQLite part of the suite on Python 3.12 and 3.13 (.venv-3.12, .venv-3.13)
	bash scripts/test-versions.sh $(PYTEST_ARGS)

bench: install ## benchmarks: Conveyor (SQLite, PostgreSQL; MariaDB in `conveyor bench`) beside PgQueuer
	bash bench/run.sh

lint: install ## ruff lint and format check
	$(VENV)/bin/ruff check src tests bench
	$(VENV)/bin/ruff format --check src tests bench

types: install ## mypy, strict, on src/conveyor
	$(VENV)/bin/mypy

docs: install ## build the documentation site into site/ (strict: a broken link or reference fails)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir site

check: lint types docs ## lint, types and the docs build (CI runs this, then make test)

clean: ## remove the virtualenv and caches
	rm -rf $(VENV) .venv-django .venv-3.12 .venv-3.13 .pytest_cache .ruff_cache src/*.egg-info site docs/reference/openapi.json
