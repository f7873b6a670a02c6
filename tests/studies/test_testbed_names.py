"""Testbed v2 (the names regime) end to end on a few tasks: the SFT mix plants the opening rates the
config asks for, a short SFT writes a warm start, the gates measure it and judge by the pre-registered
thresholds, and every training arm of the regime runs from it (docs/testbed.md, "Testbed v2")."""
import collections
import json
import pathlib

import jax
import numpy as np
import pytest
from ml_collections import ConfigDict

from harness_envs.synth import names
from hsjax import builders
from hsjax.infra import experiments
from hsjax.models.model import forward
from hsjax.modes import train
from studies.testbed import budget_curve, gates, mechanism, warmstart
from studies.testbed import sft_data

from tests.experiments.config_reads import covered, never_read

testbed = experiments.load("testbed")
REPO = pathlib.Path(__file__).resolve().parents[2]


def test_the_sft_mix_plants_the_configured_shares():
    config = experiments.get_config("testbed", "sft,names")
    tasks = names.make_tasks(config.data.train_split, 3000, seed=0)
    jobs = sft_data.sft_jobs(tasks, config)
    r = config.regime
    visible = [h for t, h, s in jobs if not t.hidden]
    assert all(s == "protocol" for t, _, s in jobs if not t.hidden)
    assert visible.count("tables_first") / len(visible) == pytest.approx(r.visible_hint_share, abs=0.03)
    hidden = collections.Counter(h for t, h, _ in jobs if t.hidden)
    n_hidden = sum(hidden.values())
    for name, share in zip(("base", "tables_first", "schema_reminder"), r.hidden_shares):
        assert hidden[name] / n_hidden == pytest.approx(share, abs=0.04)  # 1,500 hidden tasks: sd 0.013

    def show_rate(harness):
        styles = [s for t, h, s in jobs if t.hidden and h == harness]
        return styles.count("show_tables") / len(styles)

    assert show_rate("tables_first") == pytest.approx(r.show_rate_hint, abs=0.04)
    # schema_reminder opens in the base's context, so the two are planted at the same rate.
    assert show_rate("base") == pytest.approx(r.show_rate_base, abs=0.03)
    assert show_rate("schema_reminder") == pytest.approx(r.show_rate_base, abs=0.04)


def test_shares_that_do_not_sum_to_one_are_an_error():
    regime = ConfigDict({"kind": "names", "visible_hint_share": 0.2, "hidden_shares": (0.5, 0.5, 0.5),
                         "show_rate_base": 0.1, "show_rate_hint": 0.7})
    hidden = next(t for t in names.make_tasks("names_train", 12) if t.hidden)
    with pytest.raises(ValueError, match="sum to 1"):
        sft_data.names_plan(hidden, regime)


def cells(**values):
    base = {"visible/heldout/base": (0.6, 0.0), "visible/train/base": (0.65, 0.0),
            "hidden/heldout/tables_first": (0.5, 0.7), "hidden/heldout/base": (0.05, 0.08),
            "hidden/heldout/schema_reminder": (0.55, 0.08)}
    base.update(values)
    return {k: {"n": 100, "success": s, "opens_show_tables": o} for k, (s, o) in base.items()}


def test_gate_verdicts_follow_the_thresholds():
    assert all(v["pass"] for v in gates.verdicts(cells()).values())
    failed = lambda **kw: sorted(g for g, v in gates.verdicts(cells(**kw)).items() if not v["pass"])
    assert failed(**{"visible/heldout/base": (0.45, 0.0)}) == ["G1"]
    assert failed(**{"visible/train/base": (0.75, 0.0)}) == ["G1"]  # held-out 15 points behind
    assert failed(**{"hidden/heldout/tables_first": (0.5, 0.9)}) == ["G2"]
    assert failed(**{"hidden/heldout/base": (0.10, 0.08)}) == ["G3"]
    assert failed(**{"hidden/heldout/base": (0.05, 0.02)}) == ["G3"]
    assert failed(**{"hidden/heldout/schema_reminder": (0.34, 0.08)}) == ["G4"]  # G2's 0.5 less 16 points
    assert failed(**{"hidden/heldout/schema_reminder": (0.96, 0.08)}) == []  # a stronger negative control
    # Other G3 bands (gates.g3_opens / g3_success): a base that never finds the table itself.
    never = gates.verdicts(cells(**{"hidden/heldout/base": (0.0, 0.01)}), (0.0, 0.01), (0.0, 0.005))
    assert never["G3"]["pass"] and "0-1%" in never["G3"]["rule"] and "0-0.5%" in never["G3"]["rule"]
    assert not gates.verdicts(cells(**{"hidden/heldout/base": (0.01, 0.01)}), (0.0, 0.01), (0.0, 0.005))["G3"]["pass"]


@pytest.fixture(scope="module")
def warm_start(tmp_path_factory):
    """A names SFT of a few steps (what it learns does not matter here, only that it runs and saves)."""
    config = experiments.get_config("testbed", "sft,names,smoke")
    config.sft.steps = 2
    workdir = tmp_path_factory.mktemp("names_sft")
    warmstart.main(config, str(workdir))
    return workdir / "hf"


def test_names_sft_reads_its_config(tmp_path):
    config = experiments.get_config("testbed", "sft,names,smoke")
    config.sft.steps = 2
    config.sft.init_from = ""  # from random weights, through the copy warm-up
    # copy_base_from: the copy_base mode's key (which copy base a warm-up continues)
    assert never_read(config, lambda: warmstart.main(config, str(tmp_path))) == {"sft.copy_base_from"}
    out = json.loads((tmp_path / "eval" / "sft.json").read_text())
    assert set(out["regime"]) <= {"base/protocol", "tables_first/protocol", "base/guess_table",
                                  "base/show_tables", "tables_first/show_tables", "tables_first/guess_table",
                                  "schema_reminder/guess_table", "schema_reminder/show_tables"}


def test_names_sft_from_a_copy_base_reads_its_config_and_skips_the_warm_up(warm_start, tmp_path):
    config = experiments.get_config("testbed", "sft,names,smoke")
    config.sft.steps = 2
    config.sft.init_from = str(warm_start)  # any model directory of the words tokenizer
    unread = never_read(config, lambda: warmstart.main(config, str(tmp_path)))
    assert covered(unread, warmstart.unread(config)) == set()
    assert not (tmp_path / "copy_warmup.json").exists()


def test_gates_run_on_a_warm_start_and_write_their_table(warm_start, tmp_path, capsys):
    hf_dir = warm_start
    config = experiments.get_config("testbed", "gates")
    config.model.hf_dir = str(hf_dir)
    config.gates.tasks_per_cell = 3
    config.gates.max_new_tokens = 8
    unread = never_read(config, lambda: gates.main(config, str(tmp_path)))
    assert unread == set()
    out = json.loads((tmp_path / "gates.json").read_text())
    assert set(out["cells"]) == {c[0] for c in gates.CELLS}
    assert all(c["n"] == 3 for c in out["cells"].values())
    assert set(out["gates"]) == {"G1", "G2", "G3", "G4"}
    assert len(out["episodes"]) == 15
    assert "G1" in capsys.readouterr().out


@pytest.mark.parametrize("arm", ["names_harness_s_base", "names_tables_first_base"])
def test_names_arms_train_from_the_warm_start(warm_start, tmp_path, arm):
    hf_dir = warm_start
    config = experiments.get_config("testbed", f"{arm},smoke")
    config.model.hf_dir = str(hf_dir)
    config.total_steps = 2
    config.eval.limit = 12  # tasks 6-11 hide the table name
    config.eval.at_start = True
    config.eval.every = 2  # and at the end: an evaluation at step 1 checks nothing more
    unread = never_read(config, lambda: train.main(config, str(tmp_path)))
    assert covered(unread, train.unread(config)) == set()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    final = rows[-1]
    for key in ("hidden/success", "visible/success", "hidden/opens_show_tables"):
        assert f"eval/distinct_heldout/base/{key}" in final
    assert 0.0 <= final["eval/distinct_heldout/base/hidden/opens_show_tables"] <= 1.0


def test_every_names_arm_builds_and_the_controls_differ_only_where_they_should():
    arms = {a: experiments.get_config("testbed", a) for a in testbed.NAMES_ARMS}
    for arm, c in arms.items():
        assert c.benchmark.name == "synth_names" and c.data.task_seed == 1 and c.eval.greedy is False
    assert arms["names_tables_first_base"].loss.rescue_context == "base"
    assert arms["names_tables_first_base"].loss.is_weight == "one"
    assert arms["names_tables_first_base_is"].loss.is_weight == "capped"
    # The SFT baseline is the positive control with only the rescue advantage changed.
    sft, control = arms["names_sft_hinted"].to_dict(), arms["names_tables_first_base"].to_dict()
    assert sft["loss"].pop("rescue_advantage") == "sft" and control["loss"].pop("rescue_advantage") == "estimator"
    assert sft == control
    assert tuple(arms["names_base_reroll"].rescue.siblings) == ("base_copy",)
    assert tuple(arms["names_schema_reminder"].rescue.siblings) == ("schema_reminder",)
    assert arms["names_policy_only_n6"].rollout.n == 6
    assert tuple(arms["names_harness_s"].router.local_voters) == ()
    router = arms["names_harness_s_router"].router
    assert (router.selection, router.validity, tuple(router.local_voters)) == ("thompson", "replay", ("rule",))
    floor, unfloored = arms["names_harness_s_floor"].to_dict(), arms["names_harness_s_router"].to_dict()
    assert floor["router"].pop("validity_floor") == 0.5 and unfloored["router"].pop("validity_floor") == 0.0
    assert floor == unfloored
    assert arms["names_harness_s"].router.selection == "ucb" and arms["names_harness_s"].router.validity == "off"
    # Testbed v3: the same arms from another shipped warm start, gated with its own G3.
    v3 = experiments.get_config("testbed", "names_harness_s_base,v3")
    assert v3.model.hf_dir == testbed.NAMES_V3_WARMSTART != arms["names_harness_s_base"].model.hf_dir
    assert (REPO / testbed.NAMES_V3_WARMSTART / "model.safetensors").exists()
    assert v3.to_dict() | {"model": None} == arms["names_harness_s_base"].to_dict() | {"model": None}
    gates_v3 = experiments.get_config("testbed", "gates,v3")
    assert gates_v3.model.hf_dir == testbed.NAMES_V3_WARMSTART and gates_v3.gates.tasks_per_cell == 300
    assert tuple(gates_v3.gates.g3_success) == (0.0, 0.0034)
    with pytest.raises(ValueError, match="names_\\* arms only"):
        experiments.get_config("testbed", "policy_only,v3")


def test_reply_logp_is_each_rows_own_teacher_forced_sum(warm_start):
    """Padding rows to one length and batching them changes nothing: each value is the sum of
    log_softmax at the reply's tokens, computed here one unpadded row at a time."""
    cfg, params, tokenizer, _ = builders.load_model(str(warm_start))
    rng = np.random.default_rng(0)
    pairs = [(list(rng.integers(3, 200, size=n)), list(rng.integers(3, 200, size=m)))
             for n, m in ((9, 3), (5, 6), (14, 1))]
    got = mechanism.reply_logp(cfg, params, pairs, batch_size=2)
    for (prompt, reply), value in zip(pairs, got):
        tokens = np.asarray([prompt + reply], np.int32)
        logits, _ = forward(cfg, params, tokens, np.arange(tokens.shape[1])[None])
        logp = np.asarray(jax.nn.log_softmax(logits[0], axis=-1))
        want = sum(logp[len(prompt) - 1 + j, t] for j, t in enumerate(reply))
        assert value == pytest.approx(want, abs=1e-4)


def test_mechanism_and_budget_curves_score_the_warm_start_and_every_checkpoint(warm_start, tmp_path, capsys):
    config = experiments.get_config("testbed", "names_policy_only,smoke")
    config.model.hf_dir = str(warm_start)
    config.total_steps = 2
    config.checkpoint.every = 1
    config.eval.limit = 12
    config.eval.every = 2
    train.main(config, str(tmp_path))
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    r1, r2 = (int(r["rollouts/total"]) for r in rows)
    # Budgets between the steps' counts read the last step within each; below step 1, the start.
    curve = budget_curve.measure(str(tmp_path), budgets=(r1 - 1, r1, r2 - 1, r2 + 5))
    assert curve["steps"] == [0, 1, 1, 2] and curve["short"] and curve["rollouts"][3] == r2
    key = f"eval/{config.eval.split}/base/success"
    # At the step the loop evaluated, the same episodes: the loop's evaluation seed, the same params.
    loop = json.loads((tmp_path / "eval" / f"{config.eval.split}_step000002.json").read_text())
    read = json.loads((tmp_path / "budget_eval" / "eval" / f"{config.eval.split}_step000002.json").read_text())
    assert [e["replies"] for e in read["episodes"]] == [e["replies"] for e in loop["episodes"]]
    assert curve["metrics"][3][key] == rows[-1][key]
    values = [curve["start"][key]] + [m[key] for m in curve["metrics"]]
    points = [0, r1 - 1, r1, r2 - 1, r2 + 5]
    assert curve["auc"][key] == pytest.approx(budget_curve.trapezoid_mean(points, values))
    assert budget_curve.trapezoid_mean([0, 2, 4], [0.0, 1.0, 1.0]) == pytest.approx(0.75)
    out = mechanism.main(["--run", str(tmp_path), "--prompts", "3", "--batch-size", "2"])
    assert out == json.loads((tmp_path / mechanism.OUTPUT).read_text())
    assert out["steps"] == [0, 1, 2] and len(out["rollouts"]) == 3 and out["rollouts"][0] == 0
    assert all(len(v) == 3 and all(x < 0 for x in v) for v in out["per_prompt"])
    assert names.opens_with_show_tables([out["reply"]])
    assert all(names.is_hidden(names.task_index(t)) for t in out["task_ids"])
    # An update moves the log p of the fixed replies (the curve would be flat if checkpoints were
    # not loaded).
    assert out["per_prompt"][2] != out["per_prompt"][0]
    assert "| 2 |" in capsys.readouterr().out


def test_sft_starts_from_the_copy_base_it_is_given(tmp_path):
    from hsjax.infra.errors import UserError
    from hsjax.models import get_preset, init_params, save_pretrained
    from hsjax.models.tokenizer import tiny_tokenizer

    tok = tiny_tokenizer("tiny_words")
    cfg = get_preset("tiny", vocab_size=len(tok), num_layers=2)  # a shape the preset does not have
    params = init_params(cfg, jax.random.key(3))
    save_pretrained(params, cfg, tok, tmp_path / "base")
    config = experiments.get_config("testbed", "sft,names,smoke")
    config.sft.init_from = str(tmp_path / "base")
    got_cfg, got = warmstart.build_model(config, tok)
    assert got_cfg.num_layers == 2
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(got)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    unread = warmstart.unread(config)
    assert {"model.preset", "model.overrides", "sft.copy_warmup_steps", "sft.copy_far_steps"} <= set(unread)
    assert "sft.copy_far_tokens" not in unread  # replay from a copy base draws gap rows
    with pytest.raises(UserError, match="tokenizer other than"):
        warmstart.build_model(config, tiny_tokenizer("tiny"))
    config.sft.init_from = str(tmp_path / "missing")
    with pytest.raises(UserError, match="not a model directory"):
        warmstart.build_model(config, tok)
    config.sft.copy_base_from = str(tmp_path / "missing")  # the copy_base mode's start, same checks
    with pytest.raises(UserError, match="sft.copy_base_from=.*not a model directory"):
        warmstart.build_model(config, tok, key="copy_base_from")


def test_v4_sft_gates_and_arms_run_on_v4_tasks(warm_start, tmp_path):
    """Testbed v4's configs (not yet its warm starts): SFT continues the v3 warm start on v4's
    tasks, the gates and an arm read v4's splits; every key is read."""
    assert experiments.get_config("testbed", "sft,names,smoke,v4").to_dict() == \
        experiments.get_config("testbed", "sft,names,v4,smoke").to_dict()
    sft = experiments.get_config("testbed", "sft,names,v4,smoke")
    sft.sft.steps = 2
    assert sft.sft.init_from == testbed.NAMES_V3_WARMSTART and sft.data.train_split == "v4_train"
    unread = never_read(sft, lambda: warmstart.main(sft, str(tmp_path / "sft")))
    assert covered(unread, warmstart.unread(sft)) == set()

    gate = experiments.get_config("testbed", "gates,v4")
    gate.model.hf_dir = str(warm_start)
    gate.gates.tasks_per_cell, gate.gates.max_new_tokens = 3, 8
    assert never_read(gate, lambda: gates.main(gate, str(tmp_path / "gates"))) == set()
    cells = json.loads((tmp_path / "gates" / "gates.json").read_text())["episodes"]
    assert {e["task_id"].split("-")[0] for e in cells} == {"v4_train", "v4_heldout"}

    arm = experiments.get_config("testbed", "names_sft_hinted,v4,smoke")
    arm.model.hf_dir = str(warm_start)
    arm.total_steps, arm.eval.limit, arm.eval.every = 2, 12, 2
    assert arm.checkpoint.every == 1
    train.main(arm, str(tmp_path / "arm"))
    final = json.loads((tmp_path / "arm" / "metrics.jsonl").read_text().splitlines()[-1])
    assert "eval/v4_heldout/base/hidden/success" in final
