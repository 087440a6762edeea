"""Adapters that let other stacks use rollbox unchanged: SandboxFusion's HTTP API (`fusion`),
inspect-ai's sandbox environment (`inspect`). Each adapter is a package of its own, imports
its stack itself (importing `rollbox` never does) and uses only the public SDK, never the
daemon's modules."""
