/work/main/rollbox/runtime/agent/native/target/debug/deps/itoa-a5580fe3c46a67ba.d: /usr/share/cargo/registry/itoa-1.0.1/src/lib.rs /usr/share/cargo/registry/itoa-1.0.1/src/udiv128.rs

/work/main/rollbox/runtime/agent/native/target/debug/deps/libitoa-a5580fe3c46a67ba.rlib: /usr/share/cargo/registry/itoa-1.0.1/src/lib.rs /usr/share/cargo/registry/itoa-1.0.1/src/udiv128.rs

/work/main/rollbox/runtime/agent/native/target/debug/deps/libitoa-a5580fe3c46a67ba.rmeta: /usr/share/cargo/registry/itoa-1.0.1/src/lib.rs /usr/share/cargo/registry/itoa-1.0.1/src/udiv128.rs

/usr/share/cargo/registry/itoa-1.0.1/src/lib.rs:
/usr/share/cargo/registry/itoa-1.0.1/src/udiv128.rs:
