"""Environments and harnesses, independent of JAX."""
