"""Benchmarks by name: `make_benchmark(name, **options)` for `config.benchmark.name`."""
from __future__ import annotations

from harness_envs.appworld.benchmark import AppWorld
from harness_envs.benchmark import Benchmark
from harness_envs.dbbench.benchmark import DBBench
from harness_envs.swegym.benchmark import SWEGym
from harness_envs.synth.benchmark import Synth, SynthApis, SynthNames

BENCHMARKS: dict[str, type[Benchmark]] = {cls.name: cls for cls in (DBBench, Synth, SynthNames, SynthApis, AppWorld, SWEGym)}


def make_benchmark(name: str, **options) -> Benchmark:
    """The benchmark `name` built with its options (DBBench: `backend`, `rule`; AppWorld and
    SWE-Gym: `backend`)."""
    if name not in BENCHMARKS:
        raise ValueError(f"unknown benchmark {name!r}; known: {sorted(BENCHMARKS)}")
    try:
        return BENCHMARKS[name](**options)
    except TypeError as e:
        raise ValueError(f"benchmark {name!r}: {e}; check the options under config.benchmark") from None
