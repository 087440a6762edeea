/work/main/rollbox/runtime/agent/native/target/debug/deps/generic_array-38d81b5c721e3a6e.d: /usr/share/cargo/registry/generic-array-0.14.4/src/lib.rs /usr/share/cargo/registry/generic-array-0.14.4/src/hex.rs /usr/share/cargo/registry/generic-array-0.14.4/src/impls.rs /usr/share/cargo/registry/generic-array-0.14.4/src/arr.rs /usr/share/cargo/registry/generic-array-0.14.4/src/functional.rs /usr/share/cargo/registry/generic-array-0.14.4/src/iter.rs /usr/share/cargo/registry/generic-array-0.14.4/src/sequence.rs

/work/main/rollbox/runtime/agent/native/target/debug/deps/libgeneric_array-38d81b5c721e3a6e.rlib: /usr/share/cargo/registry/generic-array-0.14.4/src/lib.rs /usr/share/cargo/registry/generic-array-0.14.4/src/hex.rs /usr/share/cargo/registry/generic-array-0.14.4/src/impls.rs /usr/share/cargo/registry/generic-array-0.14.4/src/arr.rs /usr/share/cargo/registry/generic-array-0.14.4/src/functional.rs /usr/share/cargo/registry/generic-array-0.14.4/src/iter.rs /usr/share/cargo/registry/generic-array-0.14.4/src/sequence.rs

/work/main/rollbox/runtime/agent/native/target/debug/deps/libgeneric_array-38d81b5c721e3a6e.rmeta: /usr/share/cargo/registry/generic-array-0.14.4/src/lib.rs /usr/share/cargo/registry/generic-array-0.14.4/src/hex.rs /usr/share/cargo/registry/generic-array-0.14.4/src/impls.rs /usr/share/cargo/registry/generic-array-0.14.4/src/arr.rs /usr/share/cargo/registry/generic-array-0.14.4/src/functional.rs /usr/share/cargo/registry/generic-array-0.14.4/src/iter.rs /usr/share/cargo/registry/generic-array-0.14.4/src/sequence.rs

/usr/share/cargo/registry/generic-array-0.14.4/src/lib.rs:
/usr/share/cargo/registry/generic-array-0.14.4/src/hex.rs:
/usr/share/cargo/registry/generic-array-0.14.4/src/impls.rs:
/usr/share/cargo/registry/generic-array-0.14.4/src/arr.rs:
/usr/share/cargo/registry/generic-array-0.14.4/src/functional.rs:
/usr/share/cargo/registry/generic-array-0.14.4/src/iter.rs:
/usr/share/cargo/registry/generic-array-0.14.4/src/sequence.rs:
