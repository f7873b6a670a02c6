"""experiments/appworld.py: every key of each variant is read by its mode, the demo shows each slip
repaired by its sibling, and a smoke Harness-S run trains through rescue on the offline world."""
import json

import pytest

from hsjax.infra import experiments
from hsjax.infra.metrics import read_metrics
from hsjax.modes import evaluate, evolve, rank1, train
from tests.experiments.config_reads import covered, never_read


@pytest.mark.parametrize("variant", ["eval", "demo"])
def test_eval_variants_read_their_config(tmp_path, variant):
    config = experiments.get_config("appworld", variant)
    config.limit = 6
    unread = never_read(config, lambda: evaluate.main(config, str(tmp_path)))
    assert covered(unread, evaluate.unread(config)) == set()
    out = json.loads((tmp_path / "eval" / f"{config.name}.json").read_text())
    if variant == "eval":
        assert out["summary"]["base"]["tgc"] == 1.0 and out["summary"]["base"]["sgc"] == 1.0


def test_evolution_and_rank1_run_on_appworld(tmp_path):
    config = experiments.get_config("appworld", "evolve")
    config.limit = 8
    config.evolve.max_candidates = 3
    config.evolve.regression_sample = 3
    unread = never_read(config, lambda: evolve.main(config, str(tmp_path / "evolve")))
    assert covered(unread, evolve.unread(config)) == set()
    assert (tmp_path / "evolve" / "pool.json").exists()
    config = experiments.get_config("appworld", "rank1")
    config.rank1.pool = str(tmp_path / "evolve" / "pool.json")
    config.rank1.profile_limit = 8
    config.rank1.limit = 6
    unread = never_read(config, lambda: rank1.main(config, str(tmp_path / "rank1")))
    assert covered(unread, rank1.unread(config)) == set()


def test_every_variant_builds():
    for variant in ("eval", "demo", "policy_only", "dapo", "hint", "harness_s", "smoke", "smoke_harness_s",
                    "smoke,dapo", "evolve", "rank1"):
        config = experiments.get_config("appworld", variant)
        assert config.benchmark.name == "appworld" and config.benchmark.backend.kind == "offline"
    with pytest.raises(ValueError, match="unknown experiments/appworld.py variant"):
        experiments.get_config("appworld", "nope")
    with pytest.raises(ValueError, match="mix eval and training"):
        experiments.get_config("appworld", "demo,smoke")


def test_a_smoke_harness_s_run_trains_through_rescue(tmp_path):
    config = experiments.get_config("appworld", "smoke_harness_s")
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
    assert "eval/dev/base/success" in rows[-1]
