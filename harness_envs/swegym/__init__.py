"""SWE-Gym: SWE-bench-format instances, a CodeAct-style code harness, local and container runtimes."""
