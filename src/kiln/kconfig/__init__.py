"""Kernel config tooling: fragments, checks, and config work in the kernel's build container."""
