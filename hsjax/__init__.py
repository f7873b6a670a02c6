"""hsjax: GRPO for LLM agents with sibling-harness rescue (Harness-S), in JAX."""
