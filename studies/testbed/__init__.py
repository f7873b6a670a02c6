"""The learnable testbed (docs/testbed.md, results in docs/results.md): synthetic DBBench-protocol
tasks, a scripted expert and a tiny policy trained from scratch, to measure what Harness-S teaches.

Its configs are `experiments/testbed*.py`; its notebook is `ablations.ipynb` beside this file.
"""

# The run.py modes this study adds (collected by studies.MODES).
MODES = {
    "sft": "studies.testbed.warmstart",
    "copy_base": "studies.testbed.copy_base",
    "probe": "studies.testbed.probe",
    "testbed_demo": "studies.testbed.demo",
    "testbed_gates": "studies.testbed.gates",
}
