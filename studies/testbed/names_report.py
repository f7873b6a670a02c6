"""The names regime's report (testbeds v2 and v3): the arms table, the equal-rollout comparison, the
mechanism curves, the behaviour table and the verdict read off the pre-registered rules
(docs/results.md, "Testbed v2").

    python -m studies.testbed.names_report --root W --gates W_gates/gates.json --out DIR

`W` holds `W/<arm>/seed<k>/` training workdirs of the `names_*` arms. Prints markdown tables, writes
`DIR/names_report.json` and `DIR/names_mechanism.png` (SHOW TABLES opening rate under base on hidden
held-out names against cumulative executor rollouts, one line per arm and seed; beside it the
teacher-forced log p of that opening for the runs measured with `studies.testbed.mechanism`).
The behaviour table pools each arm's seeds' `names_behaviour.json` (`studies.testbed.names_behaviour`).
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
from typing import Sequence

from harness_envs.synth import names
from hsjax.harness_s import analysis
from studies.testbed import lookup, mechanism, names_behaviour
from studies.testbed.runs import Run, by_arm, load_sweep

DEFAULT_SPLIT = "distinct_heldout"


def keys(split: str, opening: str = lookup.ROLES["names"].metric) -> tuple[str, str, str]:
    """(primary, mechanism, guardrail) metric names of an evaluation split; `opening` is the
    regime's lookup-opening metric (`LookupRoles.metric`)."""
    prefix = f"eval/{split}/base"
    return f"{prefix}/hidden/success", f"{prefix}/hidden/{opening}", f"{prefix}/visible/success"


def run_roles(run: Run) -> lookup.LookupRoles:
    """The lookup regime a run trained in (`lookup.roles_of` its config)."""
    return lookup.roles_of(run.config)


def run_keys(run: Run) -> tuple[str, str, str]:
    return keys(run.config.get("eval", {}).get("split", DEFAULT_SPLIT), run_roles(run).metric)


def opening_label(runs: Sequence[Run]) -> str:
    """The opening's column title: the regime's, or both where a report mixes regimes."""
    return " / ".join(dict.fromkeys(run_roles(r).label for r in runs)) or lookup.ROLES["names"].label


POSITIVE, NEGATIVE, REROLL = "names_tables_first_base", "names_schema_reminder", "names_base_reroll"
POLICY_ONLY = ("names_policy_only", "names_policy_only_n6")
HARNESS_S = ("names_harness_s", "names_harness_s_base")
MIN_VALID_GAP, MIN_MECHANISM_GAP, NEGATIVE_SLACK, GUARDRAIL_DROP = 0.20, 0.10, 0.03, 0.05


def eval_rows(run: Run) -> list[dict]:
    primary = run_keys(run)[0]
    return [row for row in run.metrics if primary in row]


def at_rollouts(run: Run, budget: float) -> dict | None:
    """The last evaluation row whose cumulative executor rollouts are within `budget`."""
    rows = [r for r in eval_rows(run) if r.get("rollouts/total", 0) <= budget]
    return rows[-1] if rows else None


def arm_table(runs: Sequence[Run]) -> dict[str, dict]:
    """{arm: {"primary": [per seed], "mechanism": [...], "guardrail": [...], "rollouts": [...],
    "seeds": [...]}} at each run's last evaluation."""
    out = {}
    for arm, arm_runs in by_arm(runs).items():
        finals = [(r.seed, run_keys(r), eval_rows(r)[-1]) for r in arm_runs if eval_rows(r)]
        if finals:
            out[arm] = {"seeds": [s for s, _, _ in finals],
                        "primary": [row[k[0]] for _, k, row in finals],
                        "mechanism": [row.get(k[1], float("nan")) for _, k, row in finals],
                        "guardrail": [row.get(k[2], float("nan")) for _, k, row in finals],
                        "rollouts": [row.get("rollouts/total", 0) for _, _, row in finals]}
    return out


def equal_rollouts(runs: Sequence[Run]) -> tuple[float, dict[str, list[float]]]:
    """Primary measure of every arm at the smallest final rollout count among the trained arms."""
    trained = [r for r in runs if eval_rows(r) and eval_rows(r)[-1].get("rollouts/total", 0) > 0]
    if not trained:
        return 0.0, {}
    budget = min(eval_rows(r)[-1]["rollouts/total"] for r in trained)
    out: dict[str, list[float]] = {}
    for r in trained:
        row = at_rollouts(r, budget)
        if row is not None:
            out.setdefault(r.arm, []).append(row[run_keys(r)[0]])
    return budget, out


def mean(xs: Sequence[float]) -> float:
    return statistics.fmean(xs) if xs else float("nan")


def verdict(table: dict[str, dict], gates_pass: bool | None, warm_guardrail: float | None = None) -> dict:
    """The pre-registered rules of docs/results.md applied to the arms table."""
    m = {arm: mean(v["primary"]) for arm, v in table.items()}
    missing = [a for a in (POSITIVE, NEGATIVE, REROLL, *POLICY_ONLY, *HARNESS_S) if a not in table]
    out: dict = {"missing_arms": missing, "gates_pass": gates_pass}
    if POSITIVE not in m or POLICY_ONLY[0] not in m:
        out["testbed"] = "incomplete"
        return out
    gap = m[POSITIVE] - m[POLICY_ONLY[0]]
    valid = bool(gates_pass) and gap >= MIN_VALID_GAP
    out["positive_control_gap"] = gap
    out["testbed"] = "valid" if valid else "invalid"
    comparator = max((a for a in POLICY_ONLY if a in m), key=lambda a: m[a])
    negative_ok = NEGATIVE in m and m[NEGATIVE] <= m[POLICY_ONLY[0]] + NEGATIVE_SLACK
    out["negative_control_ok"] = negative_ok
    for arm in HARNESS_S:
        if arm not in m:
            continue
        ordered = min(table[arm]["primary"]) > max(table[comparator]["primary"])
        beats = m[arm] - m[comparator] >= MIN_MECHANISM_GAP and ordered
        beats_reroll = REROLL in m and m[arm] > m[REROLL]
        out[arm] = {"gap_vs_policy_only": m[arm] - m[comparator], "comparator": comparator,
                    "seeds_ordered": ordered, "beats_base_reroll": beats_reroll,
                    "works": valid and beats and beats_reroll and negative_ok}
    if warm_guardrail is not None:
        out["guardrail_failed"] = sorted(a for a, v in table.items()
                                         if mean(v["guardrail"]) < warm_guardrail - GUARDRAIL_DROP)
    return out


def _cell(xs: Sequence[float]) -> str:
    if not xs:
        return "-"
    sd = statistics.stdev(xs) if len(xs) > 1 else 0.0
    return f"{100 * mean(xs):.1f} ± {100 * sd:.1f}"


def format_table(table: dict[str, dict], equal: dict[str, list[float]], budget: float,
                 opening: str = lookup.ROLES["names"].label) -> str:
    lines = [f"| arm | seeds | hidden held-out success % | at {budget:.0f} rollouts | {opening} "
             "| visible held-out success % | rollouts |", "|---|---|---|---|---|---|---|"]
    for arm, v in table.items():
        lines.append(f"| {arm} | {len(v['seeds'])} | {_cell(v['primary'])} | {_cell(equal.get(arm, []))} | "
                     f"{_cell(v['mechanism'])} | {_cell(v['guardrail'])} | {mean(v['rollouts']):.0f} |")
    return "\n".join(lines)


def logp_curves(runs: Sequence[Run]) -> dict[str, dict]:
    """{"<arm> s<seed>": mechanism_logp.json} of the runs that have one (`studies.testbed.mechanism`)."""
    out = {}
    for r in runs:
        path = r.workdir / mechanism.OUTPUT
        if path.exists():
            out[f"{r.arm} s{r.seed}"] = json.loads(path.read_text())
    return out


def logp_at_budget(curves: dict[str, dict], budget: float) -> dict[str, list[dict]]:
    """{arm: per seed, the mechanism log p at the last checkpoint whose cumulative executor
    rollouts are within `budget`}: the equal-rollout comparison the runs' single final evaluation
    cannot give (every checkpoint is scored, the sampled success only at the last step)."""
    out: dict[str, list[dict]] = {}
    for label, c in curves.items():
        within = [i for i, n in enumerate(c["rollouts"]) if n <= budget]
        if within:
            i = within[-1]
            arm = label.rsplit(" s", 1)[0]
            out.setdefault(arm, []).append({"seed": label.rsplit(" s", 1)[1], "step": c["steps"][i],
                                            "rollouts": c["rollouts"][i], "mean_logp": c["mean_logp"][i]})
    return out


def format_logp_at_budget(rows: dict[str, list[dict]], budget: float) -> str:
    lines = [f"| arm | log p of the SHOW TABLES opening at <= {budget:.0f} executor rollouts, per seed "
             "(step, rollouts) | mean |", "|---|---|---|"]
    for arm, seeds in rows.items():
        cells = ", ".join(f"s{r['seed']} {r['mean_logp']:.2f} ({r['step']}, {r['rollouts']:.0f})" for r in seeds)
        lines.append(f"| {arm} | {cells} | {mean([r['mean_logp'] for r in seeds]):.2f} |")
    return "\n".join(lines)


def behaviours(runs: Sequence[Run]) -> dict[str, dict]:
    """{arm: its seeds' names_behaviour.json pooled} for the runs that have one."""
    out: dict[str, list[dict]] = {}
    for r in runs:
        path = r.workdir / names_behaviour.OUTPUT
        if path.exists():
            out.setdefault(r.arm, []).append(json.loads(path.read_text()))
    return {arm: names_behaviour.pool_runs(bs) for arm, bs in out.items()}


def router_summary(runs: Sequence[Run]) -> dict[str, dict[str, dict]]:
    """Per arm with a router (seeds pooled), per harness: how many failed groups the router sent it, at
    which training steps (as the router logs them), and the rescue rate its final profile holds
    (the Beta posterior mean of its overall rescues, averaged over seeds): what the router tried,
    what it settled on, and what it had learnt of each sibling."""
    out: dict[str, dict[str, dict]] = {}
    for arm, group in by_arm(runs).items():
        chosen: dict[str, list[int]] = collections.defaultdict(list)
        rates: dict[str, list[float]] = collections.defaultdict(list)
        seen = False
        for r in group:
            decisions, profiles = r.workdir / "router_decisions.jsonl", r.workdir / "profiles.json"
            if decisions.exists():
                seen = True
                for line in decisions.read_text().splitlines():
                    if line.strip():
                        d = json.loads(line)
                        for h in d["harnesses"]:
                            chosen[h].append(int(d["step"]))
            if profiles.exists():
                saved = json.loads(profiles.read_text())
                a, b = saved.get("prior", (1.0, 1.0))
                for p in saved["profiles"]:
                    s, f = p["overall"]
                    rates[p["name"]].append((s + a) / (s + f + a + b))
        if seen:
            out[arm] = {h: {"chosen": len(chosen.get(h, [])), "steps": sorted(set(chosen.get(h, []))),
                            "profile": mean(rates[h]) if rates.get(h) else None}
                        for h in sorted(set(chosen) | set(rates), key=lambda h: (-len(chosen.get(h, [])), h))}
    return out


def format_router(rows: dict[str, dict[str, dict]]) -> str:
    lines = ["| arm | harness | failed groups sent to it | at steps | final profile: rescue rate |", "|---|---|---|---|---|"]
    for arm, harnesses in rows.items():
        for h, v in harnesses.items():
            profile = "–" if v["profile"] is None else f"{v['profile']:.2f}"
            lines.append(f"| {arm} | {h} | {v['chosen']} | {', '.join(map(str, v['steps'])) or '–'} | {profile} |")
    return "\n".join(lines)


def rank1_slices(rank1_out: dict) -> dict:
    """A names Rank-1 output (`experiments/testbed.py:names_rank1`, W/eval/names_rank1.json) by
    hidden/visible table name: per arm the share of tasks solved in any rollout and the mean success
    per rollout, and which harness the router chose."""
    rollouts = int(rank1_out["rollouts_per_task"])
    out: dict = {}
    for name, hidden in (("hidden", True), ("visible", False)):
        tasks = [t for t in rank1_out["tasks"] if names.is_hidden(names.task_index(t["task_id"])) == hidden]
        if not tasks:
            continue
        out[name] = {"tasks": len(tasks),
                     **{arm: {"solved": mean([float(t[f"{arm}_success"]) for t in tasks]),
                              "per_rollout": sum(t[f"{arm}_successes"] for t in tasks) / (rollouts * len(tasks))}
                        for arm in ("base", "rank1")},
                     "choices": dict(collections.Counter(t["chosen"] for t in tasks).most_common())}
    return out


def format_rank1(rows: dict[str, dict]) -> str:
    """{label: rank1_slices(...)} as one markdown table."""
    lines = ["| Rank-1 run | slice | tasks | base: solved % (per rollout %) | Rank-1: solved % (per rollout %) "
             "| router's choices |", "|---|---|---|---|---|---|"]
    for label, slices in rows.items():
        for name, v in slices.items():
            cells = [f"{100 * v[a]['solved']:.1f} ({100 * v[a]['per_rollout']:.1f})" for a in ("base", "rank1")]
            choices = ", ".join(f"{h} {n}" for h, n in v["choices"].items())
            lines.append(f"| {label} | {name} | {v['tasks']} | {cells[0]} | {cells[1]} | {choices} |")
    return "\n".join(lines)


def plot_mechanism(runs: Sequence[Run], curves: dict[str, dict], path: str) -> None:
    """Left: the sampled opening rate at each evaluation; right (`curves` from `logp_curves`, when
    any run was measured): the teacher-forced log p of that opening on fixed prompts. One colour
    per arm and one line style per seed, so that a sweep of 9 arms x 3 seeds stays legible."""
    plt = analysis._plt()  # the project's one Agg set-up
    arms = list(dict.fromkeys(r.arm for r in runs))
    colour = {arm: plt.get_cmap("tab10")(i % 10) for i, arm in enumerate(arms)}
    styles = ("-", "--", ":", "-.")
    markers = ("o", "s", "^", "D")

    def draw(ax, arm, seed, xs, ys, labelled):
        ax.plot(xs, ys, color=colour[arm], linestyle=styles[seed % 4], marker=markers[seed % 4],
                markersize=4, alpha=0.85, label=None if arm in labelled else arm)
        labelled.add(arm)

    fig, axes = plt.subplots(1, 2 if curves else 1, figsize=(13 if curves else 7, 4.5), squeeze=False)
    ax, labelled = axes[0][0], set()
    for r in runs:
        rows = eval_rows(r)
        if rows:
            draw(ax, r.arm, r.seed, [x.get("rollouts/total", 0) for x in rows],
                 [100 * x.get(run_keys(r)[1], 0) for x in rows], labelled)
    ax.set_xlabel("cumulative executor rollouts")
    ax.set_ylabel(f"{opening_label(runs).removesuffix(' %')} under base, %")
    ax.set_title("hidden-name held-out tasks, T = 1 (marker/line style = seed)")
    ax.legend(fontsize=7)
    if curves:
        ax, labelled = axes[0][1], set()
        for r in runs:
            c = curves.get(f"{r.arm} s{r.seed}")
            if c:
                draw(ax, r.arm, r.seed, c["rollouts"], c["mean_logp"], labelled)
        ax.set_xlabel("cumulative executor rollouts")
        ax.set_ylabel("mean log p of the SHOW TABLES opening, nats")
        ax.set_title("teacher-forced, base context, fixed hidden-name prompts")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def report(root, out_dir, gates_path=None, rank1: dict[str, str] | None = None) -> dict:
    """Reads the `names_*` runs under `root`, writes `out_dir/names_report.json` and
    `out_dir/names_mechanism.png`, and returns the report with its tables as `markdown`."""
    runs = [r for r in load_sweep(root) if r.arm.startswith("names_")]
    gates = json.loads(open(gates_path).read()) if gates_path else None
    gates_pass = all(g["pass"] for g in gates["gates"].values()) if gates else None
    table = arm_table(runs)
    warm = table.pop("names_warmstart", None)
    budget, equal = equal_rollouts(runs)
    result = verdict(table, gates_pass, mean(warm["guardrail"]) if warm else None)
    os.makedirs(out_dir, exist_ok=True)
    curves = logp_curves(runs)
    logp_equal = logp_at_budget(curves, budget)
    behaviour = behaviours(runs)
    plot_mechanism(runs, curves, os.path.join(out_dir, "names_mechanism.png"))
    parts = [format_table(({"names_warmstart": warm} if warm else {}) | table, equal, budget, opening_label(runs)),
             "```\n" + json.dumps(result, indent=1) + "\n```"]
    if curves:
        parts.append("| run | log p of the SHOW TABLES opening: first -> last checkpoint (nats) |\n|---|---|\n"
                     + "\n".join(f"| {label} | {c['mean_logp'][0]:.2f} -> {c['mean_logp'][-1]:.2f} "
                                  f"(step {c['steps'][-1]}) |" for label, c in curves.items()))
        parts.append(format_logp_at_budget(logp_equal, budget))
    if behaviour:
        parts.append(names_behaviour.markdown([(f"{arm} ({b['runs']} seed{'s' * (b['runs'] > 1)})", b)
                                               for arm, b in behaviour.items()]))
    router = router_summary(runs)
    if router:
        parts.append(format_router(router))
    rank1_rows = {label: rank1_slices(json.loads(open(path).read())) for label, path in (rank1 or {}).items()}
    if rank1_rows:
        parts.append(format_rank1(rank1_rows))
    out = {"table": table, "behaviour": behaviour, "router": router, "warmstart": warm, "rank1": rank1_rows,
           "equal_rollouts": {"budget": budget, "primary": equal, "mean_logp": logp_equal},
           "verdict": result,
           "logp_curves": {k: {"steps": c["steps"], "rollouts": c["rollouts"], "mean_logp": c["mean_logp"]}
                           for k, c in curves.items()}}
    with open(os.path.join(out_dir, "names_report.json"), "w") as f:
        json.dump(out, f, indent=1)
    return out | {"markdown": "\n\n".join(parts)}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", required=True)
    parser.add_argument("--gates", default="", help="the warm start's gates.json")
    parser.add_argument("--out", required=True)
    parser.add_argument("--rank1", action="append", default=[], metavar="LABEL=PATH",
                        help="a names Rank-1 output (W/eval/names_rank1.json) to tabulate by slice")
    args = parser.parse_args(argv)
    rank1 = {}
    for item in args.rank1:
        label, sep, path = item.partition("=")
        if not sep or not label or not path:
            parser.error(f"--rank1 {item!r}: give LABEL=PATH, e.g. warm=W/eval/names_rank1.json")
        rank1[label] = path
    out = report(args.root, args.out, args.gates or None, rank1)
    print(out["markdown"])
    return out


if __name__ == "__main__":
    main()
