# rollbox: `make demo` (set-up + the HumanEval main job), `make test` (set-up + the suite).
# Every set-up step is idempotent: a second run skips what is done.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
STAMPS := .stamps
ROLLBOX_HOME ?= /var/lib/rollbox
export ROLLBOX_HOME

.PHONY: setup host venv agent base-image demo lint-imports test test-unit test-system bench bench-quick bench-smoke soak gpu-check clean-state doctor typecheck

setup: host venv base-image

host:
	bash scripts/setup-host.sh

$(STAMPS)/venv: pyproject.toml
	@mkdir -p $(STAMPS)
	test -x $(VENV)/bin/python || $(PY) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip >/dev/null
	$(VENV)/bin/pip install -q -e '.[test]'
	touch $@

venv: host $(STAMPS)/venv agent

# The native in-sandbox agent (PID 1 of every sandbox), a static binary next to agent.py so
# that it is visible in sandboxes at /.rollbox/rollbox-agent. Without cargo, sandboxes use
# agent.py (which needs python3 in the image). Cargo's own incremental build makes it cheap.
AGENT_SRC := rollbox/runtime/agent/native
AGENT_BIN := rollbox/runtime/agent/rollbox-agent
AGENT_TARGET := x86_64-unknown-linux-gnu

agent:
	@if command -v cargo >/dev/null 2>&1; then \
	  RUSTFLAGS="-C target-feature=+crt-static" CARGO_TARGET_DIR=$(CURDIR)/build/agent-target \
	    cargo build --quiet --release --offline --target $(AGENT_TARGET) --manifest-path $(AGENT_SRC)/Cargo.toml && \
	  install -m 0755 build/agent-target/$(AGENT_TARGET)/release/rollbox-agent $(AGENT_BIN).tmp && \
	  mv -f $(AGENT_BIN).tmp $(AGENT_BIN) && echo "native agent: $(AGENT_BIN)" || \
	  echo "building the native agent failed (Rust >= 1.66 needed): sandboxes will use agent.py (images need python3)"; \
	else echo "cargo not found: sandboxes will use the Python agent (images need python3)"; fi

test-agent: agent
	CARGO_TARGET_DIR=$(CURDIR)/build/agent-target cargo test --quiet --offline --manifest-path $(AGENT_SRC)/Cargo.toml

base-image: host venv
	$(VENV)/bin/rollbox image build-base

demo: setup
	$(VENV)/bin/rollbox demo humaneval

doctor: $(STAMPS)/venv
	$(VENV)/bin/rollbox doctor

# The import contracts (pyproject.toml [tool.importlinter]) first: a broken one fails the run.
lint-imports: $(STAMPS)/venv
	$(VENV)/bin/lint-imports --no-cache

test: setup lint-imports typecheck
	$(VENV)/bin/python -m pytest tests -q

test-unit: venv lint-imports typecheck
	$(VENV)/bin/python -m pytest tests/unit -q
	CARGO_TARGET_DIR=$(CURDIR)/build/agent-target cargo test --quiet --offline --manifest-path $(AGENT_SRC)/Cargo.toml || ! command -v cargo >/dev/null

test-system: setup
	$(VENV)/bin/python -m pytest tests/system -q

bench: setup
	$(VENV)/bin/python -m bench.bench

bench-quick: setup
	$(VENV)/bin/python -m bench.bench --quick

# Every step of the full benchmark at toy sizes (~3 min): checks the script, measures nothing.
bench-smoke: setup
	$(VENV)/bin/python -m bench.bench --smoke

# 2,000 create -> exec -> terminate cycles at concurrency 16, then a burst of 100 creates from 10
# threads beside a CPU hog (bench/burst.py); each prints what is left (must be 0).
soak: setup
	$(VENV)/bin/python -m bench.soak --cycles $${ROLLBOX_SOAK_CYCLES:-2000} --concurrency 16
	$(VENV)/bin/python -m bench.burst --creates $${ROLLBOX_BURST_CREATES:-100} --threads $${ROLLBOX_BURST_THREADS:-10}

# On a machine with an NVIDIA GPU: nvidia-smi, a torch matmul and a GPU-memory snapshot in gVisor.
gpu-check:
	bash bench/gpu_check.sh

# mypy --strict on rollbox/ (pyproject.toml [tool.mypy]; the in-sandbox scripts less strictly).
typecheck: $(STAMPS)/venv
	$(VENV)/bin/mypy rollbox
