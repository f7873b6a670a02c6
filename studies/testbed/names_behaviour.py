"""What the policy does on the names regime's held-out tasks, and what each sibling made it do.

    python -m studies.testbed.names_behaviour --run W/names_harness_s/seed0

The behaviour to internalise is one action: on a hidden-name task, open with `SHOW TABLES`. The
evaluation's rates (`hidden/opens_show_tables`) say how often; this says what else happened. For
the run's last evaluation under the base harness, per slice (hidden / visible table name):

- `openings`: the share of episodes whose first reply runs SHOW TABLES, another SQL statement (on a
  hidden name: a guessed table), answers, or is malformed; `success_by_opening` beside it;
- `show_after_error`: of the episodes whose first statement failed, the share that run SHOW TABLES
  later (recovering by the same action, rather than opening with it);
- `failure_modes` of the failed episodes and the mean number of turns.

`rescue` gives the same for the training rollouts of every sibling harness (the rescues, as
generated): what the behaviour looked like where the policy learnt it.

Writes `<run>/names_behaviour.json`; the sweep archives it and `names_report` prints the table.
"""
from __future__ import annotations

import argparse
import collections
import json
import pathlib
import statistics
from typing import Iterable, Sequence

from harness_envs.synth import names
from studies.testbed import lookup
from studies.testbed import runs as runs_lib

OUTPUT = "names_behaviour.json"
OPENINGS = ("show_tables", "query", "answer", "malformed")


def opening(episode: dict) -> str:
    """The kind of an episode's first action."""
    turns = episode.get("turns") or []
    if names.opens_with_show_tables(episode.get("replies") or [""]):
        return "show_tables"
    kind = turns[0].get("kind") if turns else None
    return {"sql": "query", "answer": "answer"}.get(kind, "malformed")


def first_statement_failed(episode: dict) -> bool:
    first = next((t for t in episode.get("turns") or [] if t.get("kind") == "sql"), None)
    return first is not None and first.get("ok") is False


def show_tables_after_error(episode: dict) -> bool:
    """Whether a SHOW TABLES statement follows the episode's first failed statement."""
    failed = False
    for turn in episode.get("turns") or []:
        if turn.get("kind") != "sql":
            continue
        if failed and names.opens_with_show_tables([turn.get("sql") or ""]):
            return True
        failed = failed or turn.get("ok") is False
    return False


def summarise(episodes: Sequence[dict]) -> dict:
    """Openings, success by opening, SHOW TABLES after an error, failure modes of `episodes`."""
    n = len(episodes)
    if not n:
        return {"episodes": 0}
    kinds = [opening(e) for e in episodes]
    counts = collections.Counter(kinds)
    wins = collections.Counter(k for k, e in zip(kinds, episodes) if e.get("success"))
    errored = [e for e in episodes if first_statement_failed(e)]
    failed = collections.Counter(e.get("failure_mode") or "unknown" for e in episodes if not e.get("success"))
    return {"episodes": n,
            "success": sum(bool(e.get("success")) for e in episodes) / n,
            "openings": {k: counts[k] / n for k in OPENINGS},
            "success_by_opening": {k: wins[k] / counts[k] for k in OPENINGS if counts[k]},
            "first_statement_failed": len(errored) / n,
            "show_after_error": (sum(map(show_tables_after_error, errored)) / len(errored)) if errored else None,
            "failure_modes": {k: v / n for k, v in failed.most_common()},
            "mean_turns": statistics.fmean(e.get("num_turns") or len(e.get("turns") or []) for e in episodes)}


def pool(summaries: Sequence[dict]) -> dict:
    """The summary of the union of the episodes behind `summaries` (e.g. one arm's seeds), exact:
    every share is turned back into a count first."""
    parts = [s for s in summaries if s.get("episodes")]
    n = sum(s["episodes"] for s in parts)
    if not n:
        return {"episodes": 0}
    count = lambda f: sum(f(s) * s["episodes"] for s in parts)
    opened = {k: count(lambda s: s["openings"][k]) for k in OPENINGS}
    errored = count(lambda s: s["first_statement_failed"])
    modes = collections.Counter()
    for s in parts:
        modes.update({k: v * s["episodes"] for k, v in s["failure_modes"].items()})
    return {"episodes": n,
            "success": count(lambda s: s["success"]) / n,
            "openings": {k: opened[k] / n for k in OPENINGS},
            "success_by_opening": {k: count(lambda s: s["openings"][k] * s["success_by_opening"].get(k, 0.0))
                                   / opened[k] for k in OPENINGS if opened[k]},
            "first_statement_failed": errored / n,
            "show_after_error": (count(lambda s: s["first_statement_failed"] * (s["show_after_error"] or 0.0))
                                 / errored) if errored else None,
            "failure_modes": {k: v / n for k, v in modes.most_common()},
            "mean_turns": count(lambda s: s["mean_turns"]) / n}


def pool_runs(behaviours: Sequence[dict]) -> dict:
    """One arm's `run_behaviour`s (its seeds) pooled slice by slice, rescue harness by harness."""
    pooled = lambda get: {k: pool([get(b).get(k, {}) for b in behaviours]) for k in ("hidden", "visible")}
    harnesses = sorted({h for b in behaviours for h in b.get("rescue", {})})
    return {"runs": len(behaviours), "eval": pooled(lambda b: b["eval"]),
            "rescue": {h: pooled(lambda b: b.get("rescue", {}).get(h, {})) for h in harnesses}}


def by_slice(episodes: Iterable[dict]) -> dict[str, dict]:
    """{"hidden": summary, "visible": summary} by whether the task withholds its table name."""
    parts: dict[str, list[dict]] = {"hidden": [], "visible": []}
    for e in episodes:
        parts["hidden" if names.is_hidden(names.task_index(e["task_id"])) else "visible"].append(e)
    return {k: summarise(v) for k, v in parts.items()}


def run_behaviour(run: runs_lib.Run) -> dict:
    """The last evaluation's behaviour under base (by slice) and each sibling's rescue rollouts."""
    if lookup.regime_of(run.config) != "names":
        raise ValueError(f"{run.workdir} trained in the API regime; names_behaviour reads the names regime's "
                         "SQL turns (an API-regime run's lookup openings are its evaluations' hidden/opens_docs)")
    split = run.config.get("eval", {}).get("split") or next(iter(sorted({s for s, _ in run.evals})), None)
    final = run.final_eval(split) if split else None
    if final is None:
        raise FileNotFoundError(f"{run.workdir} has no evaluation of its split {split!r} (eval/*.json)")
    rescue: dict[str, list[dict]] = collections.defaultdict(list)
    if (run.workdir / "episodes").is_dir():
        for e in run.episodes():
            if e.get("harness", "base") != "base":
                rescue[e["harness"]].append(e)
    return {"split": split, "step": final["step"], "eval": by_slice(final["episodes"]),
            "rescue": {h: by_slice(eps) for h, eps in sorted(rescue.items())}}


def write(workdir) -> pathlib.Path:
    out = pathlib.Path(workdir) / OUTPUT
    out.write_text(json.dumps(run_behaviour(runs_lib.load_run(workdir)), indent=1))
    return out


def _pct(x) -> str:
    return "–" if x is None else f"{100 * x:.0f}"


def markdown(rows: Sequence[tuple[str, dict]]) -> str:
    """One line per (label, names_behaviour.json) and slice: the final evaluation, then rescues."""
    lines = ["| run | episodes of | slice | n | success % | opens SHOW TABLES % (succeeds %) "
             "| opens with a query % (succeeds %) | SHOW TABLES after a failed first statement % "
             "| top failure modes |", "|---|---|---|---|---|---|---|---|---|"]
    for label, b in rows:
        sources = [("eval, base", b["eval"])] + [(f"rescue, {h}", s) for h, s in b.get("rescue", {}).items()]
        for source, slices in sources:
            for name, s in slices.items():
                if not s.get("episodes"):
                    continue
                o, won = s["openings"], s["success_by_opening"]
                modes = ", ".join(f"{k} {_pct(v)}" for k, v in list(s["failure_modes"].items())[:2]) or "–"
                lines.append(f"| {label} | {source} | {name} | {s['episodes']} | {_pct(s['success'])} "
                             f"| {_pct(o['show_tables'])} ({_pct(won.get('show_tables'))}) "
                             f"| {_pct(o['query'])} ({_pct(won.get('query'))}) "
                             f"| {_pct(s['show_after_error'])} | {modes} |")
    return "\n".join(lines)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", required=True, help="a finished names_* training workdir")
    args = parser.parse_args(argv)
    path = write(args.run)
    out = json.loads(path.read_text())
    print(markdown([(args.run, out)]))
    return out


if __name__ == "__main__":
    main()
