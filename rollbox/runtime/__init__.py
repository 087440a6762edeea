"""Host-side sandbox lifecycle: runsc, OCI bundles, overlay rootfs, cgroups, the agent channel."""
