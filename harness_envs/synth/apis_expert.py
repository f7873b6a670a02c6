"""The scripted expert of the API regime (harness_envs/synth/apis.py): what its warm start imitates.

Replies are bare ```python cells, no reasoning text, so a tiny policy can learn them. Styles act
differently only on tasks that hide the API's name:
    protocol   one cell: `complete_task` with the value of the API the task names (a hidden task
               has none to name: the expert calls the right API, as if it knew it)
    docs_first lists the app's APIs (`apis.api_docs.show_api_descriptions`), reads the one whose
               description names the attribute from the output, then the gold cell (valid under
               every harness: it is what the `docs_first` sibling's hint asks for)
    guess_api  calls `show_<attribute>`, which no app has; after the world's bare 404 it gives up
               (`complete_task(status="fail")`), after an observation that lists the app's APIs
               (`api_list`) it calls the right one
"""
from __future__ import annotations

import re

from harness_envs.appworld import harness as appworld_harness
from harness_envs.plan_agent import Plan, PlanAgent
from harness_envs.synth import apis

STYLES = ("protocol", "docs_first", "guess_api")
# The sibling of the regime's pool under which each style succeeds on a hidden task.
RESCUER = {"protocol": "base", "docs_first": "docs_first", "guess_api": "api_list"}
GIVE_UP = 'apis.supervisor.complete_task(status="fail")'


def fence(code: str) -> str:
    return f"```python\n{code}\n```"


def read_api(task: apis.ApisTask, observation: str) -> str | None:
    """The name of the API whose description names the task's attribute, as the observation lists
    it: `show_api_descriptions`' dicts or the api-list note's signatures; None if it is not there."""
    description = re.escape(apis.API_DESCRIPTION.format(attr=task.attribute))
    app = re.escape(task.app)
    for pattern in (rf"'name': '(\w+)', 'description': '{description}'",
                    rf"apis\.{app}\.(\w+)\([^)]*\)\s+#\s+{description}\b"):
        found = re.search(pattern, observation or "")
        if found:
            return found.group(1)
    return None


def acts_on_hidden_name(style: str, task) -> bool:
    return style in ("docs_first", "guess_api") and bool(getattr(task, "hidden", False))


def expert_plan(task: apis.ApisTask, style: str = "protocol") -> Plan:
    """The expert's moves for one episode: a generator fed each observation, yielding replies."""
    if style not in STYLES:
        raise ValueError(f"unknown API-regime expert style {style!r}; choose one of {STYLES}")
    api = task.api
    if acts_on_hidden_name(style, task) and style == "docs_first":
        obs = yield fence(apis.list_cell(task))
        # The listing always names it; the gold keeps the expert an expert if a harness cut it off.
        api = read_api(task, obs) or task.api
    if acts_on_hidden_name(style, task) and style == "guess_api":
        obs = yield fence(apis.gold_cell(task, apis.guessed_api(task)))
        if appworld_harness.APP_LIST_LEAD.format(app=task.app) not in obs:
            while True:
                yield fence(GIVE_UP)
        api = read_api(task, obs) or task.api
    while True:  # a harness that holds complete_task back for confirmation gets the same cell again
        yield fence(apis.gold_cell(task, api))


class ApisExpert(PlanAgent):
    """ChatPolicy playing every episode in `default_style` (the SFT data runs one expert a style)."""

    def __init__(self, default_style: str = "protocol"):
        super().__init__()
        if default_style not in STYLES:
            raise ValueError(f"API-regime expert style {default_style!r} is not one of {STYLES}")
        self.default_style = default_style

    def _new_plan(self, info: dict) -> Plan:
        return expert_plan(info["task"], self.default_style)
