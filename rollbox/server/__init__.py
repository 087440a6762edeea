"""The daemon: HTTP API (app), the sandbox service (service: a façade over registry, boot,
create, checkpoints, execfiles, teardown, networking, usage, admission, artifacts), the
lifecycle state machine (lifecycle), SQLite state (store), watchdog, warm pools, builder."""
