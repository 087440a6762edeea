/work/main/rollbox/runtime/agent/native/target/debug/deps/base64-e06f1c996d453f64.d: /usr/share/cargo/registry/base64-0.13.0/src/lib.rs /usr/share/cargo/registry/base64-0.13.0/src/chunked_encoder.rs /usr/share/cargo/registry/base64-0.13.0/src/display.rs /usr/share/cargo/registry/base64-0.13.0/src/read/mod.rs /usr/share/cargo/registry/base64-0.13.0/src/read/decoder.rs /usr/share/cargo/registry/base64-0.13.0/src/tables.rs /usr/share/cargo/registry/base64-0.13.0/src/write/mod.rs /usr/share/cargo/registry/base64-0.13.0/src/write/encoder.rs /usr/share/cargo/registry/base64-0.13.0/src/write/encoder_string_writer.rs /usr/share/cargo/registry/base64-0.13.0/src/encode.rs /usr/share/cargo/registry/base64-0.13.0/src/decode.rs

/work/main/rollbox/runtime/agent/native/target/debug/deps/libbase64-e06f1c996d453f64.rlib: /usr/share/cargo/registry/base64-0.13.0/src/lib.rs /usr/share/cargo/registry/base64-0.13.0/src/chunked_encoder.rs /usr/share/cargo/registry/base64-0.13.0/src/display.rs /usr/share/cargo/registry/base64-0.13.0/src/read/mod.rs /usr/share/cargo/registry/base64-0.13.0/src/read/decoder.rs /usr/share/cargo/registry/base64-0.13.0/src/tables.rs /usr/share/cargo/registry/base64-0.13.0/src/write/mod.rs /usr/share/cargo/registry/base64-0.13.0/src/write/encoder.rs /usr/share/cargo/registry/base64-0.13.0/src/write/encoder_string_writer.rs /usr/share/cargo/registry/base64-0.13.0/src/encode.rs /usr/share/cargo/registry/base64-0.13.0/src/decode.rs

/work/main/rollbox/runtime/agent/native/target/debug/deps/libbase64-e06f1c996d453f64.rmeta: /usr/share/cargo/registry/base64-0.13.0/src/lib.rs /usr/share/cargo/registry/base64-0.13.0/src/chunked_encoder.rs /usr/share/cargo/registry/base64-0.13.0/src/display.rs /usr/share/cargo/registry/base64-0.13.0/src/read/mod.rs /usr/share/cargo/registry/base64-0.13.0/src/read/decoder.rs /usr/share/cargo/registry/base64-0.13.0/src/tables.rs /usr/share/cargo/registry/base64-0.13.0/src/write/mod.rs /usr/share/cargo/registry/base64-0.13.0/src/write/encoder.rs /usr/share/cargo/registry/base64-0.13.0/src/write/encoder_string_writer.rs /usr/share/cargo/registry/base64-0.13.0/src/encode.rs /usr/share/cargo/registry/base64-0.13.0/src/decode.rs

/usr/share/cargo/registry/base64-0.13.0/src/lib.rs:
/usr/share/cargo/registry/base64-0.13.0/src/chunked_encoder.rs:
/usr/share/cargo/registry/base64-0.13.0/src/display.rs:
/usr/share/cargo/registry/base64-0.13.0/src/read/mod.rs:
/usr/share/cargo/registry/base64-0.13.0/src/read/decoder.rs:
/usr/share/cargo/registry/base64-0.13.0/src/tables.rs:
/usr/share/cargo/registry/base64-0.13.0/src/write/mod.rs:
/usr/share/cargo/registry/base64-0.13.0/src/write/encoder.rs:
/usr/share/cargo/registry/base64-0.13.0/src/write/encoder_string_writer.rs:
/usr/share/cargo/registry/base64-0.13.0/src/encode.rs:
/usr/share/cargo/registry/base64-0.13.0/src/decode.rs:
