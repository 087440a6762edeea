/work/main/rollbox/runtime/agent/native/target/debug/deps/crypto_common-1a4963ac7aeb12f8.d: /usr/share/cargo/registry/crypto-common-0.1.3/src/lib.rs

/work/main/rollbox/runtime/agent/native/target/debug/deps/libcrypto_common-1a4963ac7aeb12f8.rlib: /usr/share/cargo/registry/crypto-common-0.1.3/src/lib.rs

/work/main/rollbox/runtime/agent/native/target/debug/deps/libcrypto_common-1a4963ac7aeb12f8.rmeta: /usr/share/cargo/registry/crypto-common-0.1.3/src/lib.rs

/usr/share/cargo/registry/crypto-common-0.1.3/src/lib.rs:
