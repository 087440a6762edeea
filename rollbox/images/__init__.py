"""Images: read-only root filesystem layers, stacked under each sandbox's private upper."""
