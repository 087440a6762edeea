"""Adapters that let other stacks use rollbox unchanged (SandboxFusion's HTTP API, ...).

Each adapter is a package of its own and uses only the public SDK (`rollbox.Sandbox`,
`SandboxPool`, `Image`, ...), never the daemon's modules.
"""
