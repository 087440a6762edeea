/work/main/rollbox/runtime/agent/native/target/debug/deps/block_buffer-2a0a04d1d7caff7c.d: /usr/share/cargo/registry/block-buffer-0.10.2/src/lib.rs /usr/share/cargo/registry/block-buffer-0.10.2/src/sealed.rs

/work/main/rollbox/runtime/agent/native/target/debug/deps/libblock_buffer-2a0a04d1d7caff7c.rlib: /usr/share/cargo/registry/block-buffer-0.10.2/src/lib.rs /usr/share/cargo/registry/block-buffer-0.10.2/src/sealed.rs

/work/main/rollbox/runtime/agent/native/target/debug/deps/libblock_buffer-2a0a04d1d7caff7c.rmeta: /usr/share/cargo/registry/block-buffer-0.10.2/src/lib.rs /usr/share/cargo/registry/block-buffer-0.10.2/src/sealed.rs

/usr/share/cargo/registry/block-buffer-0.10.2/src/lib.rs:
/usr/share/cargo/registry/block-buffer-0.10.2/src/sealed.rs:
