/work/main/rollbox/runtime/agent/native/target/debug/deps/rollbox_agent-17d642e9ec5576ac.d: src/main.rs src/gate.rs src/jail.rs src/memwatch.rs src/ops.rs src/proc.rs src/procs.rs src/procs_ops.rs src/retain.rs src/sys.rs src/wire.rs src/zygote.rs

/work/main/rollbox/runtime/agent/native/target/debug/deps/rollbox_agent-17d642e9ec5576ac: src/main.rs src/gate.rs src/jail.rs src/memwatch.rs src/ops.rs src/proc.rs src/procs.rs src/procs_ops.rs src/retain.rs src/sys.rs src/wire.rs src/zygote.rs

src/main.rs:
src/gate.rs:
src/jail.rs:
src/memwatch.rs:
src/ops.rs:
src/proc.rs:
src/procs.rs:
src/procs_ops.rs:
src/retain.rs:
src/sys.rs:
src/wire.rs:
src/zygote.rs:

# env-dep:CARGO_PKG_VERSION=0.1.0
