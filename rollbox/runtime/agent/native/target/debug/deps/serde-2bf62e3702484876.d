/work/main/rollbox/runtime/agent/native/target/debug/deps/serde-2bf62e3702484876.d: /usr/share/cargo/registry/serde-1.0.152/src/lib.rs /usr/share/cargo/registry/serde-1.0.152/src/macros.rs /usr/share/cargo/registry/serde-1.0.152/src/integer128.rs /usr/share/cargo/registry/serde-1.0.152/src/de/mod.rs /usr/share/cargo/registry/serde-1.0.152/src/de/value.rs /usr/share/cargo/registry/serde-1.0.152/src/de/format.rs /usr/share/cargo/registry/serde-1.0.152/src/de/ignored_any.rs /usr/share/cargo/registry/serde-1.0.152/src/de/impls.rs /usr/share/cargo/registry/serde-1.0.152/src/de/utf8.rs /usr/share/cargo/registry/serde-1.0.152/src/ser/mod.rs /usr/share/cargo/registry/serde-1.0.152/src/ser/fmt.rs /usr/share/cargo/registry/serde-1.0.152/src/ser/impls.rs /usr/share/cargo/registry/serde-1.0.152/src/ser/impossible.rs /usr/share/cargo/registry/serde-1.0.152/src/private/mod.rs /usr/share/cargo/registry/serde-1.0.152/src/private/de.rs /usr/share/cargo/registry/serde-1.0.152/src/private/ser.rs /usr/share/cargo/registry/serde-1.0.152/src/private/size_hint.rs /usr/share/cargo/registry/serde-1.0.152/src/private/doc.rs /usr/share/cargo/registry/serde-1.0.152/src/de/seed.rs

/work/main/rollbox/runtime/agent/native/target/debug/deps/libserde-2bf62e3702484876.rlib: /usr/share/cargo/registry/serde-1.0.152/src/lib.rs /usr/share/cargo/registry/serde-1.0.152/src/macros.rs /usr/share/cargo/registry/serde-1.0.152/src/integer128.rs /usr/share/cargo/registry/serde-1.0.152/src/de/mod.rs /usr/share/cargo/registry/serde-1.0.152/src/de/value.rs /usr/share/cargo/registry/serde-1.0.152/src/de/format.rs /usr/share/cargo/registry/serde-1.0.152/src/de/ignored_any.rs /usr/share/cargo/registry/serde-1.0.152/src/de/impls.rs /usr/share/cargo/registry/serde-1.0.152/src/de/utf8.rs /usr/share/cargo/registry/serde-1.0.152/src/ser/mod.rs /usr/share/cargo/registry/serde-1.0.152/src/ser/fmt.rs /usr/share/cargo/registry/serde-1.0.152/src/ser/impls.rs /usr/share/cargo/registry/serde-1.0.152/src/ser/impossible.rs /usr/share/cargo/registry/serde-1.0.152/src/private/mod.rs /usr/share/cargo/registry/serde-1.0.152/src/private/de.rs /usr/share/cargo/registry/serde-1.0.152/src/private/ser.rs /usr/share/cargo/registry/serde-1.0.152/src/private/size_hint.rs /usr/share/cargo/registry/serde-1.0.152/src/private/doc.rs /usr/share/cargo/registry/serde-1.0.152/src/de/seed.rs

/work/main/rollbox/runtime/agent/native/target/debug/deps/libserde-2bf62e3702484876.rmeta: /usr/share/cargo/registry/serde-1.0.152/src/lib.rs /usr/share/cargo/registry/serde-1.0.152/src/macros.rs /usr/share/cargo/registry/serde-1.0.152/src/integer128.rs /usr/share/cargo/registry/serde-1.0.152/src/de/mod.rs /usr/share/cargo/registry/serde-1.0.152/src/de/value.rs /usr/share/cargo/registry/serde-1.0.152/src/de/format.rs /usr/share/cargo/registry/serde-1.0.152/src/de/ignored_any.rs /usr/share/cargo/registry/serde-1.0.152/src/de/impls.rs /usr/share/cargo/registry/serde-1.0.152/src/de/utf8.rs /usr/share/cargo/registry/serde-1.0.152/src/ser/mod.rs /usr/share/cargo/registry/serde-1.0.152/src/ser/fmt.rs /usr/share/cargo/registry/serde-1.0.152/src/ser/impls.rs /usr/share/cargo/registry/serde-1.0.152/src/ser/impossible.rs /usr/share/cargo/registry/serde-1.0.152/src/private/mod.rs /usr/share/cargo/registry/serde-1.0.152/src/private/de.rs /usr/share/cargo/registry/serde-1.0.152/src/private/ser.rs /usr/share/cargo/registry/serde-1.0.152/src/private/size_hint.rs /usr/share/cargo/registry/serde-1.0.152/src/private/doc.rs /usr/share/cargo/registry/serde-1.0.152/src/de/seed.rs

/usr/share/cargo/registry/serde-1.0.152/src/lib.rs:
/usr/share/cargo/registry/serde-1.0.152/src/macros.rs:
/usr/share/cargo/registry/serde-1.0.152/src/integer128.rs:
/usr/share/cargo/registry/serde-1.0.152/src/de/mod.rs:
/usr/share/cargo/registry/serde-1.0.152/src/de/value.rs:
/usr/share/cargo/registry/serde-1.0.152/src/de/format.rs:
/usr/share/cargo/registry/serde-1.0.152/src/de/ignored_any.rs:
/usr/share/cargo/registry/serde-1.0.152/src/de/impls.rs:
/usr/share/cargo/registry/serde-1.0.152/src/de/utf8.rs:
/usr/share/cargo/registry/serde-1.0.152/src/ser/mod.rs:
/usr/share/cargo/registry/serde-1.0.152/src/ser/fmt.rs:
/usr/share/cargo/registry/serde-1.0.152/src/ser/impls.rs:
/usr/share/cargo/registry/serde-1.0.152/src/ser/impossible.rs:
/usr/share/cargo/registry/serde-1.0.152/src/private/mod.rs:
/usr/share/cargo/registry/serde-1.0.152/src/private/de.rs:
/usr/share/cargo/registry/serde-1.0.152/src/private/ser.rs:
/usr/share/cargo/registry/serde-1.0.152/src/private/size_hint.rs:
/usr/share/cargo/registry/serde-1.0.152/src/private/doc.rs:
/usr/share/cargo/registry/serde-1.0.152/src/de/seed.rs:
