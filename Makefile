# rollbox: `make demo` (set-up + the HumanEval main job), `make test` (set-up + the suite).
# Every set-up step is idempotent: a second run skips what is done.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
STAMPS := .stamps
ROLLBOX_HOME ?= /var/lib/rollbox
export ROLLBOX_HOME

.PHONY: setup host venv base-image demo test test-unit test-system bench bench-quick soak gpu-check clean-state doctor typecheck

setup: host venv base-image

host:
	bash scripts/setup-host.sh

$(STAMPS)/venv: pyproject.toml
	@mkdir -p $(STAMPS)
	test -x $(VENV)/bin/python || $(PY) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip >/dev/null
	$(VENV)/bin/pip install -q -e '.[test]'
	touch $@

venv: host $(STAMPS)/venv

base-image: host venv
	$(VENV)/bin/rollbox image build-base

demo: setup
	$(VENV)/bin/rollbox demo humaneval

doctor: $(STAMPS)/venv
	$(VENV)/bin/rollbox doctor

test: setup
	$(VENV)/bin/python -m pytest tests -q

test-unit: venv
	$(VENV)/bin/python -m pytest tests/unit -q

test-system: setup
	$(VENV)/bin/python -m pytest tests/system -q

bench: setup
	$(VENV)/bin/python -m bench.bench

bench-quick: setup
	$(VENV)/bin/python -m bench.bench --quick

# 2,000 create -> exec -> terminate cycles at concurrency 16; prints what is left (must be 0).
soak: setup
	$(VENV)/bin/python -m bench.soak --cycles $${ROLLBOX_SOAK_CYCLES:-2000} --concurrency 16

# On a machine with an NVIDIA GPU: nvidia-smi, a torch matmul and a GPU-memory snapshot in gVisor.
gpu-check:
	bash bench/gpu_check.sh

typecheck: $(STAMPS)/venv
	$(VENV)/bin/pip install -q mypy >/dev/null
	$(VENV)/bin/mypy rollbox --ignore-missing-imports
