"""The daemon: HTTP API (app), sandbox lifecycle (service), SQLite state (store), watchdog."""
