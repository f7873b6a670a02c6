"""The benchmark interface: every registered benchmark declares a consistent taxonomy, directions and
knobs, and DBBench and the synthetic testbed play through it."""
import pytest

from harness_envs.base import Episode, Task
from harness_envs.benchmark import Benchmark
from harness_envs.dbbench.benchmark import DBBench
from harness_envs.registry import BENCHMARKS, make_benchmark
from harness_envs.synth.benchmark import Synth
from hsjax.policies.base import SamplingParams
from hsjax.rollout.runner import EpisodeRunner, Job


@pytest.mark.parametrize("name", sorted(BENCHMARKS))
def test_declarations_agree(name):
    with make_benchmark(name) as bench:
        assert isinstance(bench, Benchmark) and bench.name == name and bench.description
        bench.check()
        assert bench.failure_modes[0] == "success" and bench.headline and bench.splits
        for d in bench.directions:
            assert bench.direction(name=d.name) is d and bench.direction(failure_mode=d.failure_mode) is d
        pool = bench.load_pool()  # the shipped pool, read against the benchmark's knobs
        assert pool.base.schema is bench.knobs and pool.benchmark == bench.knobs.benchmark
        targets = bench.target_modes(pool.siblings)
        assert all(mode in bench.failure_modes for mode in targets.values())


def test_check_names_a_direction_that_points_nowhere():
    class Broken(DBBench):
        directions = (*DBBench.directions, DBBench.directions[0].__class__("x", "no_such_mode", (), "?"))
    with pytest.raises(ValueError, match="unknown failure mode 'no_such_mode'"):
        Broken().check()


@pytest.mark.parametrize("cls,split,seed", [(DBBench, "dev", 0), (Synth, "synth_heldout", 3)])
def test_the_oracle_plays_through_the_interface(cls, split, seed):
    with cls() as bench:
        tasks = bench.load_split(split, seed=seed, limit=6)
        assert len(tasks) == 6 and all(isinstance(t, Task) for t in tasks)
        pool = bench.load_pool()
        episode = bench.make_episode(tasks[0], pool.base, sample_index=2)
        assert isinstance(episode, Episode) and episode.info["sample_index"] == 2
        assert bench.initial_messages(tasks[0], pool.base)[-1]["content"].startswith(tasks[0].question)
        runner = EpisodeRunner(bench.make_episode, bench.make_agent("oracle"), SamplingParams())
        results = runner.results([Job(pool.base, t) for t in tasks])
        summary = bench.summarize(results)
        assert summary[bench.headline] == 1.0 and runner.rollouts == 6
        assert "overall_cat" in bench.format_table({"oracle": summary})


def test_options_and_errors():
    assert make_benchmark("dbbench", backend={"kind": "sqlite", "url": "", "time_budget_s": 1.0}).backend_options \
        == {"time_budget_s": 1.0}
    with pytest.raises(ValueError, match="unknown benchmark 'nope'"):
        make_benchmark("nope")
    with pytest.raises(ValueError, match="check the options under config.benchmark"):
        make_benchmark("dbbench", nope=1)
    with pytest.raises(ValueError, match="rule='v9'"):
        DBBench(rule="v9")
    with pytest.raises(ValueError, match="takes no task seed"):
        DBBench().load_split("dev", seed=1)
    with pytest.raises(ValueError, match="no scripted agent 'expert'"):
        DBBench().make_agent("expert")
    assert Synth().make_agent("expert", styles={"UPDATE": "format_slip"}).style_for("UPDATE") == "format_slip"
