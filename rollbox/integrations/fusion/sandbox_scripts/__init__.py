"""Programs that run inside the sandbox (copied into the warm snapshot), not imported here."""
