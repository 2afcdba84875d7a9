# Two commands for a newcomer: `make demo` and `make test`. Each bootstraps .venv.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test lint bench clean

$(STAMP): requirements.lock pyproject.toml
	test -x $(PY) || $(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11) and "shardc needs Python 3.11 or later (the lock pins numpy 2.4 and jax 0.10), this is " + sys.version.split()[0] + ": run make PYTHON=python3.11 (or newer)")'
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -r requirements.lock
	$(PY) -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e .
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/shardc parse 'f32[10@(dp,tp),16]' --mesh dp=2,tp=4
	$(VENV)/bin/shardc plan --mesh dp=2,tp=4 'f32[12@(dp,tp),10]' 'f32[12@tp,10]'
	$(VENV)/bin/shardc run --mesh dp=2,tp=4 'f32[12@(dp,tp),10]' 'f32[12@tp,10]' --check --bench 5

test: $(STAMP)
	$(VENV)/bin/ruff check spec_lang lowering torch_backend jax_backend tests bench
	$(PY) -m mypy
	$(PY) -m pytest -q

bench: $(STAMP)
	$(PY) bench/plan_quality.py
	$(PY) bench/plan_speed.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .mypy_cache .hypothesis
