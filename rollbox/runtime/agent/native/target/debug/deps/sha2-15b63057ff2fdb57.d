/work/main/rollbox/runtime/agent/native/target/debug/deps/sha2-15b63057ff2fdb57.d: /usr/share/cargo/registry/sha2-0.10.5/src/lib.rs /usr/share/cargo/registry/sha2-0.10.5/src/core_api.rs /usr/share/cargo/registry/sha2-0.10.5/src/sha256.rs /usr/share/cargo/registry/sha2-0.10.5/src/sha512.rs /usr/share/cargo/registry/sha2-0.10.5/src/consts.rs /usr/share/cargo/registry/sha2-0.10.5/src/sha256/soft.rs /usr/share/cargo/registry/sha2-0.10.5/src/sha256/x86.rs /usr/share/cargo/registry/sha2-0.10.5/src/sha512/soft.rs /usr/share/cargo/registry/sha2-0.10.5/src/sha512/x86.rs

/work/main/rollbox/runtime/agent/native/target/debug/deps/libsha2-15b63057ff2fdb57.rlib: /usr/share/cargo/registry/sha2-0.10.5/src/lib.rs /usr/share/cargo/registry/sha2-0.10.5/src/core_api.rs /usr/share/cargo/registry/sha2-0.10.5/src/sha256.rs /usr/share/cargo/registry/sha2-0.10.5/src/sha512.rs /usr/share/cargo/registry/sha2-0.10.5/src/consts.rs /usr/share/cargo/registry/sha2-0.10.5/src/sha256/soft.rs /usr/share/cargo/registry/sha2-0.10.5/src/sha256/x86.rs /usr/share/cargo/registry/sha2-0.10.5/src/sha512/soft.rs /usr/share/cargo/registry/sha2-0.10.5/src/sha512/x86.rs

/work/main/rollbox/runtime/agent/native/target/debug/deps/libsha2-15b63057ff2fdb57.rmeta: /usr/share/cargo/registry/sha2-0.10.5/src/lib.rs /usr/share/cargo/registry/sha2-0.10.5/src/core_api.rs /usr/share/cargo/registry/sha2-0.10.5/src/sha256.rs /usr/share/cargo/registry/sha2-0.10.5/src/sha512.rs /usr/share/cargo/registry/sha2-0.10.5/src/consts.rs /usr/share/cargo/registry/sha2-0.10.5/src/sha256/soft.rs /usr/share/cargo/registry/sha2-0.10.5/src/sha256/x86.rs /usr/share/cargo/registry/sha2-0.10.5/src/sha512/soft.rs /usr/share/cargo/registry/sha2-0.10.5/src/sha512/x86.rs

/usr/share/cargo/registry/sha2-0.10.5/src/lib.rs:
/usr/share/cargo/registry/sha2-0.10.5/src/core_api.rs:
/usr/share/cargo/registry/sha2-0.10.5/src/sha256.rs:
/usr/share/cargo/registry/sha2-0.10.5/src/sha512.rs:
/usr/share/cargo/registry/sha2-0.10.5/src/consts.rs:
/usr/share/cargo/registry/sha2-0.10.5/src/sha256/soft.rs:
/usr/share/cargo/registry/sha2-0.10.5/src/sha256/x86.rs:
/usr/share/cargo/registry/sha2-0.10.5/src/sha512/soft.rs:
/usr/share/cargo/registry/sha2-0.10.5/src/sha512/x86.rs:
