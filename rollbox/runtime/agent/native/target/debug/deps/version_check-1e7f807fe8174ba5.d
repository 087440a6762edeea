/work/main/rollbox/runtime/agent/native/target/debug/deps/version_check-1e7f807fe8174ba5.d: /usr/share/cargo/registry/version_check-0.9.4/src/lib.rs /usr/share/cargo/registry/version_check-0.9.4/src/version.rs /usr/share/cargo/registry/version_check-0.9.4/src/channel.rs /usr/share/cargo/registry/version_check-0.9.4/src/date.rs

/work/main/rollbox/runtime/agent/native/target/debug/deps/libversion_check-1e7f807fe8174ba5.rlib: /usr/share/cargo/registry/version_check-0.9.4/src/lib.rs /usr/share/cargo/registry/version_check-0.9.4/src/version.rs /usr/share/cargo/registry/version_check-0.9.4/src/channel.rs /usr/share/cargo/registry/version_check-0.9.4/src/date.rs

/work/main/rollbox/runtime/agent/native/target/debug/deps/libversion_check-1e7f807fe8174ba5.rmeta: /usr/share/cargo/registry/version_check-0.9.4/src/lib.rs /usr/share/cargo/registry/version_check-0.9.4/src/version.rs /usr/share/cargo/registry/version_check-0.9.4/src/channel.rs /usr/share/cargo/registry/version_check-0.9.4/src/date.rs

/usr/share/cargo/registry/version_check-0.9.4/src/lib.rs:
/usr/share/cargo/registry/version_check-0.9.4/src/version.rs:
/usr/share/cargo/registry/version_check-0.9.4/src/channel.rs:
/usr/share/cargo/registry/version_check-0.9.4/src/date.rs:
