"""Adapters that plug rollbox into other stacks. Each subpackage imports its stack itself;
importing `rollbox` never does."""
