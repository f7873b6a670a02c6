"""The API regime (AppWorld's protocol) end to end on a few tasks: the SFT mix plants what the config
asks for, a short SFT continues the shipped names warm start on the regime's expert episodes, and
the gates measure it with the regime's siblings and opening (docs/testbed.md, "The API regime")."""
import collections
import json

import pytest

from harness_envs.synth import apis
from hsjax.infra import experiments
from hsjax.modes import train
from studies.testbed import budget_curve, gates, lookup, mechanism, names_behaviour, warmstart
from studies.testbed import sft_data

from tests.experiments.config_reads import covered, never_read


def test_the_apis_sft_mix_never_looks_up_under_base():
    config = experiments.get_config("testbed", "sft,apis")
    jobs = sft_data.sft_jobs(apis.make_tasks(config.data.train_split, 2000), config)
    assert all(s == "protocol" for t, _, s in jobs if not t.hidden)
    hidden = collections.Counter((h, s) for t, h, s in jobs if t.hidden)
    assert set(hidden) <= {("base", "guess_api"), ("docs_first", "docs_first"), ("docs_first", "guess_api"),
                           ("api_list", "guess_api")}
    assert hidden[("docs_first", "docs_first")] / (hidden[("docs_first", "docs_first")] +
                                                   hidden[("docs_first", "guess_api")]) == pytest.approx(0.75, abs=0.05)
    # Expected failures: a guess under any harness but api_list; nothing else.
    task = next(t for t, _, _ in jobs if t.hidden)
    assert sft_data.expected_to_fail(task, "base", "guess_api", "apis")
    assert not sft_data.expected_to_fail(task, "api_list", "guess_api", "apis")
    assert not sft_data.expected_to_fail(task, "base", "docs_first", "apis")


def test_apis_sft_and_gates_run_from_the_names_warm_start(tmp_path):
    config = experiments.get_config("testbed", "sft,apis,smoke")
    config.sft.steps = 2
    assert config.sft.init_from == experiments.load("testbed").NAMES_V3_WARMSTART
    unread = never_read(config, lambda: warmstart.main(config, str(tmp_path / "sft")))
    assert covered(unread, warmstart.unread(config)) == set()
    out = json.loads((tmp_path / "sft" / "eval" / "sft.json").read_text())
    assert set(out["regime"]) <= {"base/protocol", "docs_first/protocol", "base/guess_api",
                                  "docs_first/docs_first", "docs_first/guess_api", "api_list/guess_api"}

    gate = experiments.get_config("testbed", "gates,apis")
    gate.model.hf_dir = str(tmp_path / "sft" / "hf")
    gate.gates.tasks_per_cell, gate.gates.max_new_tokens = 3, 8
    assert never_read(gate, lambda: gates.main(gate, str(tmp_path / "gates"))) == set()
    result = json.loads((tmp_path / "gates" / "gates.json").read_text())
    assert set(result["cells"]) == {c[0] for c in gates.cells_of(lookup.ROLES["apis"])}
    assert all("opens_docs" in c for c in result["cells"].values())
    assert {e["task_id"].split("-")[0] for e in result["episodes"]} == {"apis_train", "apis_heldout"}
    assert "api_list" in result["gates"]["G4"]["rule"]

    # The positive control's arm in the regime: its sibling is docs_first, its tasks the regime's.
    arm = experiments.get_config("testbed", "names_tables_first_base,apis,smoke")
    assert tuple(arm.rescue.siblings) == ("docs_first",) and arm.checkpoint.every == 1
    arm.model.hf_dir = str(tmp_path / "sft" / "hf")
    arm.total_steps, arm.eval.limit, arm.eval.every = 2, 12, 2
    train.main(arm, str(tmp_path / "arm"))
    final = json.loads((tmp_path / "arm" / "metrics.jsonl").read_text().splitlines()[-1])
    assert {"eval/apis_heldout/base/hidden/success", "eval/apis_heldout/base/hidden/opens_docs"} <= set(final)

    # The sweep's analyses of a finished arm read its regime: the mechanism curve scores the expert's
    # API lookup, the budget curve evaluates under base as the loop does; the SQL-turn behaviour refuses.
    curve = mechanism.measure(str(tmp_path / "arm"), num_prompts=2, batch_size=2)
    assert curve["steps"] == [0, 1, 2] and "show_api_descriptions" in curve["reply"]
    assert all(v < 0 for v in curve["mean_logp"])
    budgets = budget_curve.measure(str(tmp_path / "arm"), budgets=[final["rollouts/total"]])
    assert budgets["steps"] == [2]
    assert budgets["metrics"][0]["eval/apis_heldout/base/hidden/success"] == final["eval/apis_heldout/base/hidden/success"]
    with pytest.raises(ValueError, match="API regime"):
        names_behaviour.write(tmp_path / "arm")


def test_apis_gate_verdicts_read_the_regime_cells():
    roles = lookup.ROLES["apis"]
    values = {"visible/heldout/base": (0.6, 0.0), "visible/train/base": (0.65, 0.0),
              "hidden/heldout/docs_first": (0.5, 0.7), "hidden/heldout/base": (0.0, 0.0),
              "hidden/heldout/api_list": (0.55, 0.0)}
    cells = {k: {"n": 300, "success": s, "opens_docs": o} for k, (s, o) in values.items()}
    verdicts = gates.verdicts(cells, (0.0, 0.01), (0.0, 0.0034), roles)
    assert all(v["pass"] for v in verdicts.values())
    cells["hidden/heldout/base"]["opens_docs"] = 0.02
    assert not gates.verdicts(cells, (0.0, 0.01), (0.0, 0.0034), roles)["G3"]["pass"]
