"""experiments/swegym.py: every key of each variant is read by its mode, the demo runs the slips under
their siblings, evolution and Rank-1 run through the benchmark interface, and a smoke Harness-S run
trains through rescue. On the tiny cache (config.benchmark.backend.cache_dir), so they always run."""
import json

import pytest

from hsjax.infra import experiments
from hsjax.infra.metrics import read_metrics
from hsjax.modes import evaluate, evolve, rank1, train
from tests.harness_envs.swegym.tiny_cache import make_cache
from tests.experiments.config_reads import covered, never_read


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return str(make_cache(tmp_path_factory.mktemp("swegym_cache")))


@pytest.mark.parametrize("variant", ["eval", "demo"])
def test_eval_variants_read_their_config(tmp_path, cache, variant):
    config = experiments.get_config("swegym", variant)
    config.benchmark.backend.cache_dir = cache
    unread = never_read(config, lambda: evaluate.main(config, str(tmp_path)))
    assert covered(unread, evaluate.unread(config)) == set()
    out = json.loads((tmp_path / "eval" / f"{config.name}.json").read_text())
    if variant == "eval":
        assert out["summary"]["base"]["resolved"] == 1.0
    else:
        assert set(out["summary"]) == set(config.harnesses)


def test_evolution_and_rank1_run_on_swegym(tmp_path, cache):
    config = experiments.get_config("swegym", "evolve")
    config.benchmark.backend.cache_dir = cache
    for slip in config.policy.noise:  # one slip for sure: its sibling is evolved
        config.policy.noise[slip] = 1.0 if slip == "indentation" else 0.0
    config.evolve.max_candidates = 4  # every single-knob candidate of edit_grounding
    config.evolve.regression_sample = 1
    unread = never_read(config, lambda: evolve.main(config, str(tmp_path / "evolve")))
    assert covered(unread, evolve.unread(config)) == set()
    pool = json.loads((tmp_path / "evolve" / "pool.json").read_text())
    assert [h["knobs"] for h in pool["harnesses"][1:]] == [{"str_replace_hint": True}]
    config = experiments.get_config("swegym", "rank1")
    config.benchmark.backend.cache_dir = cache
    config.rank1.pool = str(tmp_path / "evolve" / "pool.json")
    unread = never_read(config, lambda: rank1.main(config, str(tmp_path / "rank1")))
    assert covered(unread, rank1.unread(config)) == set()


def test_every_variant_builds():
    for variant in ("eval", "demo", "policy_only", "dapo", "hint", "harness_s", "smoke", "smoke_harness_s",
                    "smoke,dapo", "evolve", "rank1"):
        config = experiments.get_config("swegym", variant)
        assert config.benchmark.name == "swegym" and config.benchmark.backend.kind == "offline"
    with pytest.raises(ValueError, match="unknown experiments/swegym.py variant"):
        experiments.get_config("swegym", "nope")
    with pytest.raises(ValueError, match="mix eval and training"):
        experiments.get_config("swegym", "demo,smoke")


def test_a_smoke_harness_s_run_trains_through_rescue(tmp_path, cache):
    config = experiments.get_config("swegym", "smoke_harness_s")
    config.benchmark.backend.cache_dir = cache
    config.total_steps = 1
    config.optim.warmup_steps = 0
    config.eval.every = 1
    config.eval.limit = 1
    config.data.limit = 2
    config.rollout.groups = 1
    config.rollout.max_new_tokens = 8
    config.eval.max_new_tokens = 8
    config.batch.T_buckets = (1024,)
    config.router.local_voters = ("rule",)  # the tiny served voter costs a JAX server start; the DBBench tests run it
    unread = never_read(config, lambda: train.main(config, str(tmp_path)))
    assert covered(unread, train.unread(config)) == set()
    rows = read_metrics(str(tmp_path))
    assert [r["step"] for r in rows] == [1]
    # A random tiny policy fails every group, so every group is rescued by siblings the router picked.
    assert all(r["rescue/groups_rolled"] == config.rollout.groups for r in rows)
    assert all(r["rollouts/rescue"] > 0 for r in rows)
    assert "eval/test/base/success" in rows[-1]
