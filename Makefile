# rollbox: `make demo` (set-up + the HumanEval main job), `make test` (set-up + the suite).
# Every set-up step is idempotent: a second run skips what is done.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
STAMPS := .stamps
ROLLBOX_HOME ?= /var/lib/rollbox
export ROLLBOX_HOME

.PHONY: setup host venv agent base-image demo lint-imports test test-unit test-system test-full-size test-fusion-toolchains bench bench-quick bench-smoke soak gpu-check clean-state doctor typecheck

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
# that it is visible in sandboxes at /.rollbox/rollbox-agent. Built with Debian 12's own cargo
# and rustc (1.63) from Debian's packaged crates (librust-*-dev, a directory source named in
# $(AGENT_SRC)/.cargo/config.toml), all installed by scripts/setup-host.sh: apt alone, no
# rustup and no network. Named explicitly so that a rustup toolchain first on PATH is not used.
# Without them, sandboxes use agent.py (which needs python3 in the image).
AGENT_SRC := rollbox/runtime/agent/native
AGENT_BIN := rollbox/runtime/agent/rollbox-agent
AGENT_TARGET := x86_64-unknown-linux-gnu
AGENT_CARGO ?= /usr/bin/cargo
AGENT_RUSTC ?= /usr/bin/rustc
AGENT_ENV := RUSTC=$(AGENT_RUSTC) CARGO_TARGET_DIR=$(CURDIR)/build/agent-target

agent:
	@if [ -x $(AGENT_CARGO) ] && [ -x $(AGENT_RUSTC) ]; then \
	  cd $(AGENT_SRC) && RUSTFLAGS="-C target-feature=+crt-static" $(AGENT_ENV) \
	    $(AGENT_CARGO) build --quiet --release --offline --locked --target $(AGENT_TARGET) && cd $(CURDIR) && \
	  install -m 0755 build/agent-target/$(AGENT_TARGET)/release/rollbox-agent $(AGENT_BIN).tmp && \
	  mv -f $(AGENT_BIN).tmp $(AGENT_BIN) && echo "native agent: $(AGENT_BIN)" || \
	  echo "building the native agent failed: sandboxes will use agent.py (images need python3)"; \
	else echo "$(AGENT_CARGO) not found (apt-get install cargo rustc, see scripts/setup-host.sh): sandboxes will use the Python agent (images need python3)"; fi

# cargo reads .cargo/config.toml from the directory it runs in, hence the cd.
test-agent: agent
	cd $(AGENT_SRC) && $(AGENT_ENV) $(AGENT_CARGO) test --quiet --offline --locked

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
	cd $(AGENT_SRC) && $(AGENT_ENV) $(AGENT_CARGO) test --quiet --offline --locked || ! [ -x $(AGENT_CARGO) ]
	$(VENV)/bin/python -m pytest tests -q

test-unit: venv lint-imports typecheck
	$(VENV)/bin/python -m pytest tests/unit -q
	cd $(AGENT_SRC) && $(AGENT_ENV) $(AGENT_CARGO) test --quiet --offline --locked || ! [ -x $(AGENT_CARGO) ]

test-system: setup
	$(VENV)/bin/python -m pytest tests/system -q

# The load tests at the issues' full sizes (the suite runs them smaller to stay under 25 min).
test-full-size: setup
	ROLLBOX_VOLUME_FLEET=64 ROLLBOX_NET_RESTORES=64 ROLLBOX_ADMISSION_EPISODES=200 ROLLBOX_CHURN_CYCLES=200 \
	ROLLBOX_MAP_INPUTS=200 ROLLBOX_KILL_MAP_EPISODES=200 ROLLBOX_OUTPUT_MIB=100 \
	$(VENV)/bin/python -m pytest tests/load tests/system/test_persistence.py tests/system/test_network.py \
	  tests/system/test_function.py -q

# tests/system/test_fusion.py on `serve-fusion --image toolchains`: every language (cpp, go, java,
# nodejs, rust, pytest, bash, python). Opt-in: the first run in a test state directory builds the
# image (4-5 min here, 2.4 GiB; cached after), then the file takes 1.5-2 min.
test-fusion-toolchains: setup
	ROLLBOX_FUSION_TEST_IMAGE=toolchains $(VENV)/bin/python -m pytest tests/system/test_fusion.py -q

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
