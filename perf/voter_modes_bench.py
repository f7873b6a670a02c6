"""The two voter modes against one served model: how often each answers in a form the router can
read, how its first choices spread over the candidates' positions, and how long a vote takes.

    python run.py --config experiments/serve.py --config.serve.hf_dir=.cache/models/smollm2-135m-instruct \
        --config.serve.port=8011 --config.serve.model_name=smol --workdir /tmp/hsjax/serve_smol &
    python perf/voter_modes_bench.py --base-url http://127.0.0.1:8011/v1 --model smol --requests 24

Each request is one the router would send for a failed DBBench group: a dev task, a group of four
failed rollouts with drawn failure modes, the six siblings of the shipped pool with cards from
drawn rescue outcomes (so cards differ between requests). Both modes get the same requests, one at
a time, greedy. "first by position" counts how often the top-ranked candidate was the 1st, 2nd, ...
of the listed candidates: a model that always names the first is not ranking anything. The third
row asks the log-probability vote once per rotation of the candidates' order (`letter_rotations`,
one request each) and averages each candidate's probability over them.
"""
from __future__ import annotations

import argparse
import collections
import json
import pathlib
import random
import statistics
import sys

from harness_envs.dbbench import data as dbdata
from hsjax.harness_s.router.aggregation import group_summary
from hsjax.harness_s.router.profiles import Profiles
from hsjax.harness_s.router.voters import FAILURE_REASONS, VOTE_MODES, LLMVoter, VoteRequest, VoterSpec

POOL = pathlib.Path(__file__).resolve().parents[1] / "harness_envs" / "pools" / "dbbench_siblings.json"
MODES = ("malformed_action", "sql_error_loop", "turn_limit", "answer_format", "wrong_answer")


def siblings() -> list[str]:
    names = [h["name"] for h in json.loads(POOL.read_text())["harnesses"]]
    return [n for n in names if n != "base"]


def requests(count: int, seed: int) -> list[VoteRequest]:
    rng = random.Random(seed)
    names = siblings()
    tasks = dbdata.load_split("dev")
    out = []
    for i in range(count):
        task = tasks[i % len(tasks)]
        profiles = Profiles(names)
        for name in names:
            mode = rng.choice(MODES)
            one = {"harness": name, "task_type": task.type, "base_failure_mode": mode}
            profiles.update([{**one, "success": rng.random() < 0.5} for _ in range(rng.randint(0, 4))])
        failed = [{"task_id": task.task_id, "type": task.type, "failure_mode": rng.choice(MODES),
                   "num_turns": rng.randint(1, 5)} for _ in range(4)]
        out.append(VoteRequest(task={"task_id": task.task_id, "type": task.type, "question": task.question},
                               group_summary=group_summary(failed),
                               cards={h: profiles.card(h) for h in names}, candidates=tuple(names)))
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--requests", type=int, default=24)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-tokens", type=int, default=96, help="the ranking mode's reply budget")
    args = parser.parse_args(argv)
    batch = requests(args.requests, args.seed)
    firsts: dict[str, list[str | None]] = {}
    print(f"$ python perf/voter_modes_bench.py {' '.join(argv if argv is not None else sys.argv[1:])}")
    print("| mode | requests | ok | malformed | unknown_names | other | malformed % | first by position | "
          "median s |")
    print("|---|---|---|---|---|---|---|---|---|")
    rotations = len(batch[0].candidates)
    for mode, turns in [(m, 1) for m in VOTE_MODES] + [("logprob", rotations)]:
        label = mode if turns == 1 else f"{mode}, {turns} rotations"
        voter = LLMVoter(VoterSpec(name=label, base_url=args.base_url, model=args.model, vote_mode=mode,
                                   timeout_s=300.0, max_retries=0, max_tokens=args.max_tokens,
                                   letter_rotations=turns))
        results = [voter.vote(r) for r in batch]
        voter.close()
        status = collections.Counter(r.status for r in results)
        other = sum(status[s] for s in FAILURE_REASONS if s not in ("malformed", "unknown_names"))
        firsts[label] = [r.ranking[0] if r.ranking else None for r in results]
        positions = collections.Counter(batch[i].candidates.index(f) + 1
                                        for i, f in enumerate(firsts[label]) if f is not None)
        spread = " ".join(f"{p}:{positions[p]}" for p in sorted(positions)) or "-"
        print(f"| {label} | {len(results)} | {status['ok']} | {status['malformed']} | {status['unknown_names']} | "
              f"{other} | {100 * status['malformed'] / len(results):.0f} | {spread} | "
              f"{statistics.median(r.latency_s for r in results):.2f} |")
    labels = list(firsts)
    for i, a_label in enumerate(labels):
        for b_label in labels[i + 1:]:
            both = [(a, b) for a, b in zip(firsts[a_label], firsts[b_label]) if a is not None and b is not None]
            print(f"first choices of '{a_label}' and '{b_label}' agree on {sum(a == b for a, b in both)} "
                  f"of the {len(both)} requests both answered")
    return 0


if __name__ == "__main__":
    sys.exit(main())
