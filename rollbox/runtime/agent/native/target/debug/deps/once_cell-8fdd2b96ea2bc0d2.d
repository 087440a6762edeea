/work/main/rollbox/runtime/agent/native/target/debug/deps/once_cell-8fdd2b96ea2bc0d2.d: /usr/share/cargo/registry/once_cell-1.17.0/src/lib.rs /usr/share/cargo/registry/once_cell-1.17.0/src/imp_std.rs /usr/share/cargo/registry/once_cell-1.17.0/src/race.rs

/work/main/rollbox/runtime/agent/native/target/debug/deps/libonce_cell-8fdd2b96ea2bc0d2.rlib: /usr/share/cargo/registry/once_cell-1.17.0/src/lib.rs /usr/share/cargo/registry/once_cell-1.17.0/src/imp_std.rs /usr/share/cargo/registry/once_cell-1.17.0/src/race.rs

/work/main/rollbox/runtime/agent/native/target/debug/deps/libonce_cell-8fdd2b96ea2bc0d2.rmeta: /usr/share/cargo/registry/once_cell-1.17.0/src/lib.rs /usr/share/cargo/registry/once_cell-1.17.0/src/imp_std.rs /usr/share/cargo/registry/once_cell-1.17.0/src/race.rs

/usr/share/cargo/registry/once_cell-1.17.0/src/lib.rs:
/usr/share/cargo/registry/once_cell-1.17.0/src/imp_std.rs:
/usr/share/cargo/registry/once_cell-1.17.0/src/race.rs:
