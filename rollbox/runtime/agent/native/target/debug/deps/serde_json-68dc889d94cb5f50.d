/work/main/rollbox/runtime/agent/native/target/debug/deps/serde_json-68dc889d94cb5f50.d: /usr/share/cargo/registry/serde_json-1.0.87/src/lib.rs /usr/share/cargo/registry/serde_json-1.0.87/src/macros.rs /usr/share/cargo/registry/serde_json-1.0.87/src/de.rs /usr/share/cargo/registry/serde_json-1.0.87/src/error.rs /usr/share/cargo/registry/serde_json-1.0.87/src/map.rs /usr/share/cargo/registry/serde_json-1.0.87/src/ser.rs /usr/share/cargo/registry/serde_json-1.0.87/src/value/mod.rs /usr/share/cargo/registry/serde_json-1.0.87/src/value/de.rs /usr/share/cargo/registry/serde_json-1.0.87/src/value/from.rs /usr/share/cargo/registry/serde_json-1.0.87/src/value/index.rs /usr/share/cargo/registry/serde_json-1.0.87/src/value/partial_eq.rs /usr/share/cargo/registry/serde_json-1.0.87/src/value/ser.rs /usr/share/cargo/registry/serde_json-1.0.87/src/features_check/mod.rs /usr/share/cargo/registry/serde_json-1.0.87/src/io/mod.rs /usr/share/cargo/registry/serde_json-1.0.87/src/iter.rs /usr/share/cargo/registry/serde_json-1.0.87/src/number.rs /usr/share/cargo/registry/serde_json-1.0.87/src/read.rs

/work/main/rollbox/runtime/agent/native/target/debug/deps/libserde_json-68dc889d94cb5f50.rlib: /usr/share/cargo/registry/serde_json-1.0.87/src/lib.rs /usr/share/cargo/registry/serde_json-1.0.87/src/macros.rs /usr/share/cargo/registry/serde_json-1.0.87/src/de.rs /usr/share/cargo/registry/serde_json-1.0.87/src/error.rs /usr/share/cargo/registry/serde_json-1.0.87/src/map.rs /usr/share/cargo/registry/serde_json-1.0.87/src/ser.rs /usr/share/cargo/registry/serde_json-1.0.87/src/value/mod.rs /usr/share/cargo/registry/serde_json-1.0.87/src/value/de.rs /usr/share/cargo/registry/serde_json-1.0.87/src/value/from.rs /usr/share/cargo/registry/serde_json-1.0.87/src/value/index.rs /usr/share/cargo/registry/serde_json-1.0.87/src/value/partial_eq.rs /usr/share/cargo/registry/serde_json-1.0.87/src/value/ser.rs /usr/share/cargo/registry/serde_json-1.0.87/src/features_check/mod.rs /usr/share/cargo/registry/serde_json-1.0.87/src/io/mod.rs /usr/share/cargo/registry/serde_json-1.0.87/src/iter.rs /usr/share/cargo/registry/serde_json-1.0.87/src/number.rs /usr/share/cargo/registry/serde_json-1.0.87/src/read.rs

/work/main/rollbox/runtime/agent/native/target/debug/deps/libserde_json-68dc889d94cb5f50.rmeta: /usr/share/cargo/registry/serde_json-1.0.87/src/lib.rs /usr/share/cargo/registry/serde_json-1.0.87/src/macros.rs /usr/share/cargo/registry/serde_json-1.0.87/src/de.rs /usr/share/cargo/registry/serde_json-1.0.87/src/error.rs /usr/share/cargo/registry/serde_json-1.0.87/src/map.rs /usr/share/cargo/registry/serde_json-1.0.87/src/ser.rs /usr/share/cargo/registry/serde_json-1.0.87/src/value/mod.rs /usr/share/cargo/registry/serde_json-1.0.87/src/value/de.rs /usr/share/cargo/registry/serde_json-1.0.87/src/value/from.rs /usr/share/cargo/registry/serde_json-1.0.87/src/value/index.rs /usr/share/cargo/registry/serde_json-1.0.87/src/value/partial_eq.rs /usr/share/cargo/registry/serde_json-1.0.87/src/value/ser.rs /usr/share/cargo/registry/serde_json-1.0.87/src/features_check/mod.rs /usr/share/cargo/registry/serde_json-1.0.87/src/io/mod.rs /usr/share/cargo/registry/serde_json-1.0.87/src/iter.rs /usr/share/cargo/registry/serde_json-1.0.87/src/number.rs /usr/share/cargo/registry/serde_json-1.0.87/src/read.rs

/usr/share/cargo/registry/serde_json-1.0.87/src/lib.rs:
/usr/share/cargo/registry/serde_json-1.0.87/src/macros.rs:
/usr/share/cargo/registry/serde_json-1.0.87/src/de.rs:
/usr/share/cargo/registry/serde_json-1.0.87/src/error.rs:
/usr/share/cargo/registry/serde_json-1.0.87/src/map.rs:
/usr/share/cargo/registry/serde_json-1.0.87/src/ser.rs:
/usr/share/cargo/registry/serde_json-1.0.87/src/value/mod.rs:
/usr/share/cargo/registry/serde_json-1.0.87/src/value/de.rs:
/usr/share/cargo/registry/serde_json-1.0.87/src/value/from.rs:
/usr/share/cargo/registry/serde_json-1.0.87/src/value/index.rs:
/usr/share/cargo/registry/serde_json-1.0.87/src/value/partial_eq.rs:
/usr/share/cargo/registry/serde_json-1.0.87/src/value/ser.rs:
/usr/share/cargo/registry/serde_json-1.0.87/src/features_check/mod.rs:
/usr/share/cargo/registry/serde_json-1.0.87/src/io/mod.rs:
/usr/share/cargo/registry/serde_json-1.0.87/src/iter.rs:
/usr/share/cargo/registry/serde_json-1.0.87/src/number.rs:
/usr/share/cargo/registry/serde_json-1.0.87/src/read.rs:
