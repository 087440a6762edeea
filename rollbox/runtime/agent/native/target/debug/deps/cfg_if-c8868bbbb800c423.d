/work/main/rollbox/runtime/agent/native/target/debug/deps/cfg_if-c8868bbbb800c423.d: /usr/share/cargo/registry/cfg-if-1.0.0/src/lib.rs

/work/main/rollbox/runtime/agent/native/target/debug/deps/libcfg_if-c8868bbbb800c423.rlib: /usr/share/cargo/registry/cfg-if-1.0.0/src/lib.rs

/work/main/rollbox/runtime/agent/native/target/debug/deps/libcfg_if-c8868bbbb800c423.rmeta: /usr/share/cargo/registry/cfg-if-1.0.0/src/lib.rs

/usr/share/cargo/registry/cfg-if-1.0.0/src/lib.rs:
