"""The testbed probe end to end on a tiny warm start and a tiny training run (studies/testbed/probe.py).

The warm start, the training run and the probe run in this process, so the sampler programs they
compile are shared; each is what `python run.py --config ...` runs for the same config.
"""
import json
import pathlib

import numpy as np
import pytest

from harness_envs.synth.benchmark import Synth
from hsjax.harness_s import analysis
from hsjax.infra import experiments
from studies.testbed import probe as tp

REPO = pathlib.Path(__file__).resolve().parents[2]


def _probe_config(hf_dir, checkpoints):
    c = experiments.get_config("testbed_probe", "smoke")
    c.model.hf_dir = str(hf_dir)
    c.probe.checkpoints = checkpoints
    return c


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """(warm start hf dir, training workdir with checkpoints 1-2): the shipped warm start (test_sft
    covers making one) and a two-step smoke run from it."""
    from hsjax.modes import train

    root = tmp_path_factory.mktemp("probe_runs")
    warm = REPO / "assets" / "testbed_warmstart"
    c = experiments.load("testbed").get_config("policy_only,smoke")
    c.model.hf_dir = str(warm)
    c.total_steps = 2  # the smoke modifier's 3 less one; it checkpoints every step
    c.eval.every = 0  # the probe reads the run's checkpoints, not its evaluations
    train.main(c, str(root / "R"))
    return warm, root / "R"


@pytest.fixture(scope="module")
def probed(runs, tmp_path_factory):
    hf_dir, run = runs
    workdir = tmp_path_factory.mktemp("probe_out")
    config = _probe_config(hf_dir, f"hf,{run}:2")
    config.probe.rank1_checkpoints = "first_last"
    # Fewer tasks than the smoke config's 4 / 3 / 3 (the checks below count from the config). Each
    # stage runs its rollouts as one batch padded to a power of two, and each batch size is one
    # more sampler program to compile: these sizes make batches of 2, 4 and 16 only (2 base
    # rollouts, their failures under the base and six siblings, 2 profiled tasks under seven
    # harnesses, one rank-1 task per set with 1 or 2 rollouts).
    config.probe.num_tasks = config.probe.profile_tasks = 2
    config.probe.rank1_tasks = 1
    out = tp.main(config, str(workdir))
    return workdir, out, config


def _load(path):
    return json.loads(pathlib.Path(path).read_text())


def test_writes_every_output_per_checkpoint(probed):
    workdir, out, _ = probed
    for label in ("hf", "R_step2"):
        for name in (f"properties_{label}.json", f"rank1_{label}.json"):
            assert (workdir / name).stat().st_size > 0, name
    assert (workdir / "nonstationarity.json").exists() and (workdir / "probe.json").exists()
    assert [r["label"] for r in out["checkpoints"]] == ["hf", "R_step2"]
    assert _load(workdir / "nonstationarity.json")["labels"] == ["hf", "R_step2"]
    assert _load(workdir / "probe.json")["checkpoints"][1]["checkpoint"].endswith(":2")


@pytest.mark.parametrize("label", ["hf", "R_step2"])
def test_properties_agree_with_their_outcomes(probed, label):
    workdir, _, config = probed
    props = _load(workdir / f"properties_{label}.json")
    base, outcomes = props["base"], props["outcomes"]
    n_tasks = config.probe.num_tasks * config.probe.samples
    assert base["n"] == n_tasks == len(props["base_results"])
    failures = {(r["task_id"], r["sample_index"]) for r in props["base_results"] if not r["success"]}
    assert len(failures) == n_tasks - base["successes"] == props["complementarity"]["n_failures"]
    # Every failure once under the base (the control) and once under each of the six siblings.
    loc = props["locality"]
    assert len(loc["siblings"]) == 6 and "base" not in loc["siblings"]
    assert len(outcomes) == len(failures) * 7 * config.probe.tries == props["rollouts"]["rescue"]
    assert props["control"]["rollouts"] == len(failures)
    assert {(o["task_id"], o["sample_index"]) for o in outcomes} == failures
    # Locality counts are the outcomes' counts; the pooled diagonal and off-diagonal cover them all.
    assert np.sum(loc["n"]) == len(failures) * 6
    split = props["locality_split"]
    assert split["diagonal"]["n"] + split["off_diagonal"]["n"] == len(failures) * 6
    # Complementarity: the union covers at least the best single sibling, recomputed here.
    comp = props["complementarity"]
    rescued = {h: {(o["task_id"], o["sample_index"]) for o in outcomes if o["harness"] == h and o["success"]}
               for h in loc["siblings"]}
    union = set().union(*rescued.values())
    assert comp["union_count"] == len(union)
    assert comp["union"] >= comp["best_single"] == max(len(v) for v in rescued.values()) / max(len(failures), 1)


@pytest.mark.parametrize("label", ["hf", "R_step2"])
def test_rank1_and_base_arms_spend_equal_rollouts(probed, label):
    workdir, _, config = probed
    r1 = _load(workdir / f"rank1_{label}.json")
    assert set(r1["sets"]) == {"synth_heldout:1", "synth_train:1"}
    assert r1["profiling_rollouts"] == config.probe.profile_tasks * 8  # a base probe + 7 harnesses
    profiled = set(r1["profile_task_ids"])
    for name, arms in r1["sets"].items():
        assert set(arms) == {"probe=none,B=1", "probe=base,B=2"}
        for arm in arms.values():
            b, n = arm["rollouts_per_task"], config.probe.rank1_tasks
            assert arm["rollouts"] == {"base": n * b, "rank1": n * b}
            assert len(arm["tasks"]) == n and not profiled & {t["task_id"] for t in arm["tasks"]}
            assert all(t["task_id"].startswith(name.split(":")[0]) for t in arm["tasks"])
            for t in arm["tasks"]:
                assert len(t["base_failure_modes"]) == len(t["rank1_failure_modes"]) == b
                assert t["base_success"] == (t["base_successes"] > 0)
            solved = np.mean([t["rank1_success"] for t in arm["tasks"]])
            assert arm["table"]["rank1"]["accuracy"] == pytest.approx(solved)
            assert sum(arm["choices"].values()) == n
    # Over all sets: each arm's rollouts as run_rank1 counted them, and as the runner spent them.
    for key, arm in r1["arms"].items():
        per_set = [r1["sets"][name][key]["rollouts"] for name in r1["sets"]]
        assert arm["rollouts"] == {k: sum(p[k] for p in per_set) for k in ("base", "rank1")}
        assert arm["runner_rollouts"] == arm["rollouts"]["base"] + arm["rollouts"]["rank1"]


def test_trained_checkpoint_is_loaded_into_the_warm_start_model(runs):
    import jax

    from hsjax import models

    hf_dir, run = runs
    _, warm, _ = models.load_pretrained(str(hf_dir))
    (spec,) = tp.parse_checkpoints(f"{run}:2")
    trained = tp.load_params(spec, warm)
    assert jax.tree.structure(trained) == jax.tree.structure(warm)
    assert all(a.dtype == b.dtype for a, b in zip(jax.tree.leaves(trained), jax.tree.leaves(warm)))
    # Placed like the warm start too, so the sampler's programs compiled for it serve every
    # checkpoint (jit compiles anew for an argument that is committed where the last was not).
    assert all(a.committed == b.committed for a, b in zip(jax.tree.leaves(trained), jax.tree.leaves(warm)))
    step = jax.jit(lambda p: jax.tree.leaves(p)[0].sum())
    step(warm), step(trained)
    assert step._cache_size() == 1
    assert any(not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(trained), jax.tree.leaves(warm)))
    assert tp.load_params(tp.parse_checkpoints("hf")[0], warm) is warm


def test_missing_step_or_workdir_is_named_before_anything_runs(runs, tmp_path):
    hf_dir, run = runs
    with pytest.raises(tp.ProbeError, match=r"no checkpoint step 7 .*saved steps: \[1, 2\]"):
        tp.main(_probe_config(hf_dir, f"hf,{run}:7"), str(tmp_path / "a"))
    with pytest.raises(tp.ProbeError, match="does not exist"):
        tp.main(_probe_config(hf_dir, f"{tmp_path / 'absent'}:3"), str(tmp_path / "b"))
    with pytest.raises(tp.ProbeError, match="no checkpoints directory"):
        tp.main(_probe_config(hf_dir, f"{hf_dir}:3"), str(tmp_path / "c"))
    bad_arm = _probe_config(hf_dir, "hf")
    bad_arm.probe.rank1_arms = ("base:1",)
    with pytest.raises(tp.ProbeError, match="rank1_arms"):
        tp.main(bad_arm, str(tmp_path / "e"))
    with pytest.raises(tp.ProbeError, match="model.hf_dir"):
        tp.main(_probe_config(tmp_path, "hf"), str(tmp_path / "d"))
    assert not (tmp_path / "a" / "properties_hf.json").exists()


def test_params_of_another_model_are_refused(tmp_path):
    from hsjax.infra import checkpoint as ckpt_lib

    with ckpt_lib.Checkpointer(tmp_path / "other", keep=None) as ckpt:
        ckpt.save(1, {"params": {"w": np.zeros((3,), np.float32)}})
    (spec,) = tp.parse_checkpoints(f"{tmp_path / 'other'}:1")
    with pytest.raises(tp.ProbeError, match="not shaped like model.hf_dir"):
        tp.load_params(spec, {"w": np.zeros((3,), np.float32), "v": np.zeros((2,), np.float32)})


def test_checkpoint_specs_parse_into_file_safe_labels():
    specs = tp.parse_checkpoints("hf, /tmp/runs/po arm:5,/tmp/runs/hs:15")
    assert [(s.label, s.workdir, s.step) for s in specs] == [
        ("hf", None, None), ("po_arm_step5", "/tmp/runs/po arm", 5), ("hs_step15", "/tmp/runs/hs", 15)]
    assert tp.parse_checkpoints(("hf", "a:1,b:2"))[2].label == "b_step2"
    for bad, msg in (("", "empty"), ("run", "neither"), ("run:x", "neither"), ("a/r:1,b/r:1", "twice")):
        with pytest.raises(tp.ProbeError, match=msg):
            tp.parse_checkpoints(bad)
    assert tp.rank1_labels(specs, "first_last") == {"hf", "hs_step15"}
    assert tp.rank1_labels(specs, "last") == {"hs_step15"}
    with pytest.raises(tp.ProbeError, match="rank1_checkpoints"):
        tp.rank1_labels(specs, "first")


def test_locality_split_pools_target_and_other_cells():
    outcomes = [{"harness": h, "task_id": f"t{i}", "sample_index": 0, "base_failure_mode": m, "success": s}
                for i, (h, m, s) in enumerate([("lenient_parse", "malformed_action", True),
                                               ("lenient_parse", "malformed_action", False),
                                               ("lenient_parse", "sql_error_loop", False),
                                               ("schema_reminder", "sql_error_loop", True),
                                               ("schema_reminder", "malformed_action", True)])]
    bench = Synth()
    pool = bench.load_pool()
    siblings = [pool["lenient_parse"], pool["schema_reminder"]]
    split = tp.locality_split(analysis.locality(outcomes, siblings, bench.target_modes(siblings)))
    assert split["diagonal"] == {"successes": 2, "n": 3, "rate": 2 / 3}
    assert split["off_diagonal"] == {"successes": 1, "n": 2, "rate": 0.5}
