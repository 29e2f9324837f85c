# `make serve` starts Quiver on the packaged all-MiniLM-L6-v2; `make test` runs every test.
# Both create the virtual environment .venv on first use.

VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# The CPU build of torch 2.13.0 when it is at hand (as on our CI machines), else pip's default build.
TORCH ?= torch==2.13.0

.PHONY: install serve test clean

$(STAMP): setup.cfg pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q "$(TORCH)" || $(PY) -m pip install -q torch
	$(PY) -m pip install -q -e '.[test]' -e ./bench
	touch $(STAMP)

install: $(STAMP)

serve: $(STAMP)
	$(VENV)/bin/quiver serve $(ARGS)

test: $(STAMP)
	bash ops/ci/install-tools.sh
	$(PY) -m pytest -q $(ARGS)

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache
