/work/main/rollbox/runtime/agent/native/target/debug/deps/digest-cb3cef653b249b68.d: /usr/share/cargo/registry/digest-0.10.5/src/lib.rs /usr/share/cargo/registry/digest-0.10.5/src/core_api.rs /usr/share/cargo/registry/digest-0.10.5/src/core_api/ct_variable.rs /usr/share/cargo/registry/digest-0.10.5/src/core_api/rt_variable.rs /usr/share/cargo/registry/digest-0.10.5/src/core_api/wrapper.rs /usr/share/cargo/registry/digest-0.10.5/src/core_api/xof_reader.rs /usr/share/cargo/registry/digest-0.10.5/src/digest.rs /usr/share/cargo/registry/digest-0.10.5/src/mac.rs

/work/main/rollbox/runtime/agent/native/target/debug/deps/libdigest-cb3cef653b249b68.rlib: /usr/share/cargo/registry/digest-0.10.5/src/lib.rs /usr/share/cargo/registry/digest-0.10.5/src/core_api.rs /usr/share/cargo/registry/digest-0.10.5/src/core_api/ct_variable.rs /usr/share/cargo/registry/digest-0.10.5/src/core_api/rt_variable.rs /usr/share/cargo/registry/digest-0.10.5/src/core_api/wrapper.rs /usr/share/cargo/registry/digest-0.10.5/src/core_api/xof_reader.rs /usr/share/cargo/registry/digest-0.10.5/src/digest.rs /usr/share/cargo/registry/digest-0.10.5/src/mac.rs

/work/main/rollbox/runtime/agent/native/target/debug/deps/libdigest-cb3cef653b249b68.rmeta: /usr/share/cargo/registry/digest-0.10.5/src/lib.rs /usr/share/cargo/registry/digest-0.10.5/src/core_api.rs /usr/share/cargo/registry/digest-0.10.5/src/core_api/ct_variable.rs /usr/share/cargo/registry/digest-0.10.5/src/core_api/rt_variable.rs /usr/share/cargo/registry/digest-0.10.5/src/core_api/wrapper.rs /usr/share/cargo/registry/digest-0.10.5/src/core_api/xof_reader.rs /usr/share/cargo/registry/digest-0.10.5/src/digest.rs /usr/share/cargo/registry/digest-0.10.5/src/mac.rs

/usr/share/cargo/registry/digest-0.10.5/src/lib.rs:
/usr/share/cargo/registry/digest-0.10.5/src/core_api.rs:
/usr/share/cargo/registry/digest-0.10.5/src/core_api/ct_variable.rs:
/usr/share/cargo/registry/digest-0.10.5/src/core_api/rt_variable.rs:
/usr/share/cargo/registry/digest-0.10.5/src/core_api/wrapper.rs:
/usr/share/cargo/registry/digest-0.10.5/src/core_api/xof_reader.rs:
/usr/share/cargo/registry/digest-0.10.5/src/digest.rs:
/usr/share/cargo/registry/digest-0.10.5/src/mac.rs:
