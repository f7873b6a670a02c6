"""The learnable testbed: synthetic DBBench-protocol tasks and their scripted expert (docs/testbed.md)."""
from harness_envs.synth.expert import RESCUER, STYLES, ScriptedExpert
from harness_envs.synth.questions import TYPES
from harness_envs.synth.tasks import SPLITS, SynthTask, by_type, load_split, make_tasks

__all__ = ["RESCUER", "STYLES", "ScriptedExpert", "TYPES", "SPLITS", "SynthTask", "by_type",
           "load_split", "make_tasks"]
