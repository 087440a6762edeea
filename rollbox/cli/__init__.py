"""The `rollbox` command line (typer), thin over the SDK and the daemon."""
