"""Studies: experiments built on the library (hsjax, harness_envs), never part of it.

A study is a client of the library: it imports hsjax and harness_envs, and neither imports it (the
import contract in pyproject.toml). Its configs are `experiments/<study>*.py`, beside the other
experiment files, so that `run.py --config` and the config checks find every config in one place.

`MODES` is the registration hook of `run.py`: each study names the modes it adds (mode -> module
with `main(config, workdir)` and optionally `unread(config)`), and run.py joins them to the
library's own. A mode name belongs to one table only (tests/studies/test_study_modes.py).
"""
from studies.testbed import MODES as TESTBED_MODES

MODES: dict[str, str] = {**TESTBED_MODES}
