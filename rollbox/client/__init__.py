"""Transport to the daemon, and starting the local daemon when none runs."""
