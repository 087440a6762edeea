"""Snapshots: a runsc checkpoint image (memory, processes) + the filesystem upper + metadata."""
