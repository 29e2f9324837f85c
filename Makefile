# `make serve` starts Quiver on the packaged all-MiniLM-L6-v2; `make test` runs ruff, mypy and every test.
# Both create the virtual environment .venv on first use: `serve` installs only what serving needs,
# `test` adds the test extra (pytest, the reference libraries, ruff, mypy) and quiver-bench.

VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check
SERVE_STAMP := $(VENV)/.installed-serve
TEST_STAMP := $(VENV)/.installed-test
# The CPU build of torch 2.13.0 when it is at hand (as on our CI machines), else pip's default build.
TORCH ?= torch==2.13.0

.PHONY: install serve test lint clean

$(PY):
	@echo "==> creating the virtual environment $(VENV)"
	python3 -m venv $(VENV)

$(SERVE_STAMP): setup.cfg pyproject.toml | $(PY)
	@echo "==> [1/2] installing torch ($(TORCH)); the first time this downloads 0.2-3 GB"
	$(PIP) install "$(TORCH)" || $(PIP) install torch
	@echo "==> [2/2] installing quiver and what serving needs"
	$(PIP) install -e .
	touch $@

$(TEST_STAMP): $(SERVE_STAMP) bench/pyproject.toml
	@echo "==> installing the test extra (pytest, transformers, sentence-transformers, ruff, mypy) and quiver-bench"
	$(PIP) install -e '.[test]' -e ./bench
	$(PIP) install --no-deps 'FlagEmbedding>=1.4,<1.5'
	touch $@

install: $(SERVE_STAMP)

serve: $(SERVE_STAMP)
	@echo "==> starting quiver serve: ready once http://127.0.0.1:8080/health answers 200 (about 25 s on a busy 2-core CPU machine; a GPU worker captures its CUDA graphs first, about 40 s for a 0.6B model on an H200)"
	$(VENV)/bin/quiver serve $(ARGS)

lint: $(TEST_STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

test: $(TEST_STAMP)
	bash ops/ci/install-tools.sh
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	$(PY) -m pytest -q $(ARGS)

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache .mypy_cache
