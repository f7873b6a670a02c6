"""The training loop's sampling seeds and runner: named phases that no other step's phase shares,
the seeds recorded runs used, and its runner's one batch per phase."""
import pytest

from hsjax import builders
from hsjax.infra import experiments
from hsjax.infra.errors import UserError
from hsjax.harness_s import step_rollouts
from hsjax.modes import train
from hsjax.rollout.runner import Job


def test_the_phases_keep_the_seeds_runs_have_used():
    assert (step_rollouts.RESCUE_PHASE, step_rollouts.EVAL_PHASE, step_rollouts.MAX_DRAWS) == (1000, 2000, 81)
    assert step_rollouts.phase_seed(3, 5, 0) == 3 * 1_000_003 + 5 * 101
    assert step_rollouts.phase_seed(3, 5, step_rollouts.RESCUE_PHASE) == 3 * 1_000_003 + 5 * 101 + 1000
    assert step_rollouts.phase_seed(3, 5, step_rollouts.EVAL_PHASE) == 3 * 1_000_003 + 5 * 101 + 2000


def test_no_two_phases_of_any_steps_share_a_seed():
    phases = [*range(step_rollouts.MAX_DRAWS), step_rollouts.RESCUE_PHASE, step_rollouts.EVAL_PHASE]
    seeds = [step_rollouts.phase_seed(7, step, phase) for step in range(2000) for phase in phases]
    assert len(set(seeds)) == len(seeds)
    # one draw more and a draw of a later step takes an evaluation's seed
    assert step_rollouts.phase_seed(7, 19, step_rollouts.MAX_DRAWS) == step_rollouts.phase_seed(7, 0, step_rollouts.EVAL_PHASE)


def test_more_draws_than_the_phases_hold_end_the_run_before_it_starts(tmp_path):
    config = experiments.get_config("dbbench", "smoke,dapo")
    config.dapo.max_draws = step_rollouts.MAX_DRAWS + 1
    with pytest.raises(UserError, match=r"^dapo.max_draws=82 is more than 81: further draws would sample"):
        train.main(config, str(tmp_path))
    assert not (tmp_path / "config.json").exists()


class Batches:
    def __init__(self):
        self.sizes = []

    def update(self, n):
        self.sizes.append(n)


def test_the_training_runner_runs_a_phase_as_one_batch_and_an_eval_runner_in_its_batches():
    config = experiments.get_config("dbbench", "smoke")
    bench = builders.make_benchmark(config)
    try:
        base = builders.load_pool(config, bench).base
        tasks = builders.load_split(bench, config.data.train_split, seed=0, limit=5)
        policy = bench.make_agent("oracle", seed=0)
        progress = Batches()
        runner = builders.make_runner(config, bench, policy, runner="rollout", sampling="rollout", sharded=True,
                                      progress=progress)
        assert runner.batch_size is None and runner.max_context_tokens == config.rollout.max_context_tokens
        runner.run([Job(base, t, i) for t in tasks for i in range(3)])
        assert progress.sizes == [15]
        eval_config = experiments.get_config("dbbench", "eval")
        eval_config.runner.batch_size = 4
        progress = Batches()
        runner = builders.make_runner(eval_config, bench, policy, progress=progress)
        runner.run([Job(base, t) for t in tasks])
        assert progress.sizes == [4, 1] and runner.max_context_chars == eval_config.runner.max_context_chars
    finally:
        bench.close()
