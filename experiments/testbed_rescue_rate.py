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

from harness_envs.synth import tasks as synth_tasks
from harness_envs.synth.benchmark import Synth
from hsjax.policies.base import SamplingParams
from hsjax.policies.jax_policy import JaxPolicy
from hsjax.rollout.runner import EpisodeRunner
from studies.testbed import warmstart as sft

REPO = pathlib.Path(__file__).resolve().parents[1]

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
    bench = Synth()
    specs = bench.load_pool().select(args.harnesses.split(","))
    tasks = [t for t in synth_tasks.by_type(synth_tasks.make_tasks("synth_train", 40 * args.per_type,
                                                                   args.task_seed), args.per_type)
             if t.type in FAMILIES_B]
    policy = JaxPolicy.from_pretrained(args.hf, seed=args.seed)
    print(f"families B, {len(tasks)} unseen synth_train tasks (task seed {args.task_seed}), {args.hf}")
    print(f"{'temperature':<12}" + "".join(f"{s.name:>18}" for s in specs) + f"{'s':>6}")
    for temp in [float(t) for t in args.temperatures.split(",")]:
        t0 = time.perf_counter()
        sampling = SamplingParams(greedy=temp == 0.0, temperature=temp or 1.0, max_new_tokens=64, seed=args.seed)
        runner = EpisodeRunner(bench.make_episode, policy, sampling, batch_size=128)
        result = sft.evaluate_families(runner, tasks, specs, sampling)
        print(f"{'greedy' if temp == 0 else temp:<12}"
              + "".join(f"{100 * result['summary'][s.name]['success']:>17.1f}%" for s in specs)
              + f"{time.perf_counter() - t0:>6.0f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
