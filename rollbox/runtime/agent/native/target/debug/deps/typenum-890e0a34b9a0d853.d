/work/main/rollbox/runtime/agent/native/target/debug/deps/typenum-890e0a34b9a0d853.d: /usr/share/cargo/registry/typenum-1.16.0/src/lib.rs /usr/share/cargo/registry/typenum-1.16.0/src/bit.rs /usr/share/cargo/registry/typenum-1.16.0/src/int.rs /usr/share/cargo/registry/typenum-1.16.0/src/marker_traits.rs /usr/share/cargo/registry/typenum-1.16.0/src/operator_aliases.rs /usr/share/cargo/registry/typenum-1.16.0/src/private.rs /usr/share/cargo/registry/typenum-1.16.0/src/type_operators.rs /usr/share/cargo/registry/typenum-1.16.0/src/uint.rs /usr/share/cargo/registry/typenum-1.16.0/src/array.rs /work/main/rollbox/runtime/agent/native/target/debug/build/typenum-48a3cc0d09794fdb/out/op.rs /work/main/rollbox/runtime/agent/native/target/debug/build/typenum-48a3cc0d09794fdb/out/consts.rs

/work/main/rollbox/runtime/agent/native/target/debug/deps/libtypenum-890e0a34b9a0d853.rlib: /usr/share/cargo/registry/typenum-1.16.0/src/lib.rs /usr/share/cargo/registry/typenum-1.16.0/src/bit.rs /usr/share/cargo/registry/typenum-1.16.0/src/int.rs /usr/share/cargo/registry/typenum-1.16.0/src/marker_traits.rs /usr/share/cargo/registry/typenum-1.16.0/src/operator_aliases.rs /usr/share/cargo/registry/typenum-1.16.0/src/private.rs /usr/share/cargo/registry/typenum-1.16.0/src/type_operators.rs /usr/share/cargo/registry/typenum-1.16.0/src/uint.rs /usr/share/cargo/registry/typenum-1.16.0/src/array.rs /work/main/rollbox/runtime/agent/native/target/debug/build/typenum-48a3cc0d09794fdb/out/op.rs /work/main/rollbox/runtime/agent/native/target/debug/build/typenum-48a3cc0d09794fdb/out/consts.rs

/work/main/rollbox/runtime/agent/native/target/debug/deps/libtypenum-890e0a34b9a0d853.rmeta: /usr/share/cargo/registry/typenum-1.16.0/src/lib.rs /usr/share/cargo/registry/typenum-1.16.0/src/bit.rs /usr/share/cargo/registry/typenum-1.16.0/src/int.rs /usr/share/cargo/registry/typenum-1.16.0/src/marker_traits.rs /usr/share/cargo/registry/typenum-1.16.0/src/operator_aliases.rs /usr/share/cargo/registry/typenum-1.16.0/src/private.rs /usr/share/cargo/registry/typenum-1.16.0/src/type_operators.rs /usr/share/cargo/registry/typenum-1.16.0/src/uint.rs /usr/share/cargo/registry/typenum-1.16.0/src/array.rs /work/main/rollbox/runtime/agent/native/target/debug/build/typenum-48a3cc0d09794fdb/out/op.rs /work/main/rollbox/runtime/agent/native/target/debug/build/typenum-48a3cc0d09794fdb/out/consts.rs

/usr/share/cargo/registry/typenum-1.16.0/src/lib.rs:
/usr/share/cargo/registry/typenum-1.16.0/src/bit.rs:
/usr/share/cargo/registry/typenum-1.16.0/src/int.rs:
/usr/share/cargo/registry/typenum-1.16.0/src/marker_traits.rs:
/usr/share/cargo/registry/typenum-1.16.0/src/operator_aliases.rs:
/usr/share/cargo/registry/typenum-1.16.0/src/private.rs:
/usr/share/cargo/registry/typenum-1.16.0/src/type_operators.rs:
/usr/share/cargo/registry/typenum-1.16.0/src/uint.rs:
/usr/share/cargo/registry/typenum-1.16.0/src/array.rs:
/work/main/rollbox/runtime/agent/native/target/debug/build/typenum-48a3cc0d09794fdb/out/op.rs:
/work/main/rollbox/runtime/agent/native/target/debug/build/typenum-48a3cc0d09794fdb/out/consts.rs:

# env-dep:TYPENUM_BUILD_CONSTS=/work/main/rollbox/runtime/agent/native/target/debug/build/typenum-48a3cc0d09794fdb/out/consts.rs
# env-dep:TYPENUM_BUILD_OP=/work/main/rollbox/runtime/agent/native/target/debug/build/typenum-48a3cc0d09794fdb/out/op.rs
