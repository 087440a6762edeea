/work/main/rollbox/runtime/agent/native/target/debug/deps/hmac-e4b15e6ce9b0d376.d: /usr/share/cargo/registry/hmac-0.12.1/src/lib.rs /usr/share/cargo/registry/hmac-0.12.1/src/optim.rs /usr/share/cargo/registry/hmac-0.12.1/src/simple.rs

/work/main/rollbox/runtime/agent/native/target/debug/deps/libhmac-e4b15e6ce9b0d376.rlib: /usr/share/cargo/registry/hmac-0.12.1/src/lib.rs /usr/share/cargo/registry/hmac-0.12.1/src/optim.rs /usr/share/cargo/registry/hmac-0.12.1/src/simple.rs

/work/main/rollbox/runtime/agent/native/target/debug/deps/libhmac-e4b15e6ce9b0d376.rmeta: /usr/share/cargo/registry/hmac-0.12.1/src/lib.rs /usr/share/cargo/registry/hmac-0.12.1/src/optim.rs /usr/share/cargo/registry/hmac-0.12.1/src/simple.rs

/usr/share/cargo/registry/hmac-0.12.1/src/lib.rs:
/usr/share/cargo/registry/hmac-0.12.1/src/optim.rs:
/usr/share/cargo/registry/hmac-0.12.1/src/simple.rs:
