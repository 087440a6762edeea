/work/main/rollbox/runtime/agent/native/target/debug/deps/ryu-494d80678c289219.d: /usr/share/cargo/registry/ryu-1.0.2/src/lib.rs /usr/share/cargo/registry/ryu-1.0.2/src/buffer/mod.rs /usr/share/cargo/registry/ryu-1.0.2/src/common.rs /usr/share/cargo/registry/ryu-1.0.2/src/d2s.rs /usr/share/cargo/registry/ryu-1.0.2/src/d2s_full_table.rs /usr/share/cargo/registry/ryu-1.0.2/src/d2s_intrinsics.rs /usr/share/cargo/registry/ryu-1.0.2/src/digit_table.rs /usr/share/cargo/registry/ryu-1.0.2/src/f2s.rs /usr/share/cargo/registry/ryu-1.0.2/src/pretty/mod.rs /usr/share/cargo/registry/ryu-1.0.2/src/pretty/exponent.rs /usr/share/cargo/registry/ryu-1.0.2/src/pretty/mantissa.rs

/work/main/rollbox/runtime/agent/native/target/debug/deps/libryu-494d80678c289219.rlib: /usr/share/cargo/registry/ryu-1.0.2/src/lib.rs /usr/share/cargo/registry/ryu-1.0.2/src/buffer/mod.rs /usr/share/cargo/registry/ryu-1.0.2/src/common.rs /usr/share/cargo/registry/ryu-1.0.2/src/d2s.rs /usr/share/cargo/registry/ryu-1.0.2/src/d2s_full_table.rs /usr/share/cargo/registry/ryu-1.0.2/src/d2s_intrinsics.rs /usr/share/cargo/registry/ryu-1.0.2/src/digit_table.rs /usr/share/cargo/registry/ryu-1.0.2/src/f2s.rs /usr/share/cargo/registry/ryu-1.0.2/src/pretty/mod.rs /usr/share/cargo/registry/ryu-1.0.2/src/pretty/exponent.rs /usr/share/cargo/registry/ryu-1.0.2/src/pretty/mantissa.rs

/work/main/rollbox/runtime/agent/native/target/debug/deps/libryu-494d80678c289219.rmeta: /usr/share/cargo/registry/ryu-1.0.2/src/lib.rs /usr/share/cargo/registry/ryu-1.0.2/src/buffer/mod.rs /usr/share/cargo/registry/ryu-1.0.2/src/common.rs /usr/share/cargo/registry/ryu-1.0.2/src/d2s.rs /usr/share/cargo/registry/ryu-1.0.2/src/d2s_full_table.rs /usr/share/cargo/registry/ryu-1.0.2/src/d2s_intrinsics.rs /usr/share/cargo/registry/ryu-1.0.2/src/digit_table.rs /usr/share/cargo/registry/ryu-1.0.2/src/f2s.rs /usr/share/cargo/registry/ryu-1.0.2/src/pretty/mod.rs /usr/share/cargo/registry/ryu-1.0.2/src/pretty/exponent.rs /usr/share/cargo/registry/ryu-1.0.2/src/pretty/mantissa.rs

/usr/share/cargo/registry/ryu-1.0.2/src/lib.rs:
/usr/share/cargo/registry/ryu-1.0.2/src/buffer/mod.rs:
/usr/share/cargo/registry/ryu-1.0.2/src/common.rs:
/usr/share/cargo/registry/ryu-1.0.2/src/d2s.rs:
/usr/share/cargo/registry/ryu-1.0.2/src/d2s_full_table.rs:
/usr/share/cargo/registry/ryu-1.0.2/src/d2s_intrinsics.rs:
/usr/share/cargo/registry/ryu-1.0.2/src/digit_table.rs:
/usr/share/cargo/registry/ryu-1.0.2/src/f2s.rs:
/usr/share/cargo/registry/ryu-1.0.2/src/pretty/mod.rs:
/usr/share/cargo/registry/ryu-1.0.2/src/pretty/exponent.rs:
/usr/share/cargo/registry/ryu-1.0.2/src/pretty/mantissa.rs:
