"""How often can a sibling rescue the warm start? Success of a policy on unseen training-domain tasks of
families B under the base harness and under their rescuer, at several sampling temperatures.

    python experiments/testbed_rescue_rate.py --hf assets/testbed_warmstart --per_type 20 \
        --temperatures 0,0.7,1.0

Rescue training only has signal when the rescuer's rollouts succeed at the temperature the trainer
samples at (experiments/testbed.py: rollout.temperature = 1.0); this prints that rate beside the
greedy one that the SFT evaluation reports (temperature 0 = greedy). Results: docs/results.md.
"""
from __future__ import annotations

import argparse
import pathlib
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from harness_envs import harness as hz  # noqa: E402
from harness_envs.dbbench.sqlite_backend import SQLiteBackend  # noqa: E402
from harness_envs.synth import tasks as synth_tasks  # noqa: E402
from hsjax.studies.testbed import warmstart as sft  # noqa: E402
from hsjax.rollout.policy import JaxPolicy, SamplingParams  # noqa: E402

FAMILIES_B = ("comparison", "aggregation-MIN", "aggregation-AVG", "UPDATE")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hf", default=str(REPO / "assets" / "testbed_warmstart"))
    parser.add_argument("--harnesses", default="base,schema_reminder")
    parser.add_argument("--per_type", type=int, default=20)
    parser.add_argument("--task_seed", type=int, default=1)
    parser.add_argument("--temperatures", default="0,0.7,1.0")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    pool = hz.load_pool(REPO / "harness_envs" / "pools" / "dbbench_siblings.json")
    specs = [pool[name] for name in args.harnesses.split(",")]
    tasks = [t for t in synth_tasks.by_type(synth_tasks.make_tasks("synth_train", 40 * args.per_type,
                                                                   args.task_seed), args.per_type)
             if t.type in FAMILIES_B]
    policy = JaxPolicy.from_pretrained(args.hf, seed=args.seed)
    print(f"families B, {len(tasks)} unseen synth_train tasks (task seed {args.task_seed}), {args.hf}")
    print(f"{'temperature':<12}" + "".join(f"{s.name:>18}" for s in specs) + f"{'s':>6}")
    for temp in [float(t) for t in args.temperatures.split(",")]:
        t0 = time.perf_counter()
        sampling = SamplingParams(greedy=temp == 0.0, temperature=temp or 1.0, max_new_tokens=64, seed=args.seed)
        result = sft.evaluate_families(policy, tasks, specs, sampling, SQLiteBackend(), batch_size=128)
        print(f"{'greedy' if temp == 0 else temp:<12}"
              + "".join(f"{100 * result['summary'][s.name]['success']:>17.1f}%" for s in specs)
              + f"{time.perf_counter() - t0:>6.0f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
