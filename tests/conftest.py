"""Test-suite set-up: everything runs on the CPU, in float32, deterministically."""
import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
