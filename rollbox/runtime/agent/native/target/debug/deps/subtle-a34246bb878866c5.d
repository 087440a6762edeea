/work/main/rollbox/runtime/agent/native/target/debug/deps/subtle-a34246bb878866c5.d: /usr/share/cargo/registry/subtle-2.4.1/src/lib.rs

/work/main/rollbox/runtime/agent/native/target/debug/deps/libsubtle-a34246bb878866c5.rlib: /usr/share/cargo/registry/subtle-2.4.1/src/lib.rs

/work/main/rollbox/runtime/agent/native/target/debug/deps/libsubtle-a34246bb878866c5.rmeta: /usr/share/cargo/registry/subtle-2.4.1/src/lib.rs

/usr/share/cargo/registry/subtle-2.4.1/src/lib.rs:
