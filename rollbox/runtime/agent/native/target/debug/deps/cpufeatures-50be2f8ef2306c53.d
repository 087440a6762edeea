/work/main/rollbox/runtime/agent/native/target/debug/deps/cpufeatures-50be2f8ef2306c53.d: /usr/share/cargo/registry/cpufeatures-0.2.4/src/lib.rs /usr/share/cargo/registry/cpufeatures-0.2.4/src/x86.rs

/work/main/rollbox/runtime/agent/native/target/debug/deps/libcpufeatures-50be2f8ef2306c53.rlib: /usr/share/cargo/registry/cpufeatures-0.2.4/src/lib.rs /usr/share/cargo/registry/cpufeatures-0.2.4/src/x86.rs

/work/main/rollbox/runtime/agent/native/target/debug/deps/libcpufeatures-50be2f8ef2306c53.rmeta: /usr/share/cargo/registry/cpufeatures-0.2.4/src/lib.rs /usr/share/cargo/registry/cpufeatures-0.2.4/src/x86.rs

/usr/share/cargo/registry/cpufeatures-0.2.4/src/lib.rs:
/usr/share/cargo/registry/cpufeatures-0.2.4/src/x86.rs:
