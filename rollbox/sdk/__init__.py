"""The user-facing SDK: Sandbox, Image, SandboxPool (sync, with `.aio` async mirrors)."""
