"""Scripted AppWorld agents, as chat policies (`chat(contexts, sampling, infos) -> list[str]`).

`OracleAgent` runs the task's gold solution in one cell; if the harness holds `complete_task` back
for confirmation, it confirms. `SlippingAgent(noise={slip: probability})` solves like the oracle
except for the slips drawn for the episode. Each slip fails under the base harness with one failure
mode and is repaired by exactly one sibling of the shipped pool (`SLIPS`): the agent reacts only to
the text that sibling adds to the observation. The slips of an episode depend only on (seed, task
id, sample index), never on the harness, so the same agent behaves the same under every harness.
"""
from __future__ import annotations

from typing import Generator

from harness_envs.appworld import harness as appworld_harness
from harness_envs.appworld.tasks import AppWorldTask
from harness_envs.plan_agent import Plan, PlanAgent, Slip, SlipDrawingAgent


SLIPS: dict[str, Slip] = {
    "code_fence": Slip("syntax_error", "lenient_parse",
                       "writes every cell as prose plus a ```py block, which the published extraction runs as a "
                       "whole (a syntax error)"),
    "wrong_password": Slip("auth_failure", "credentials_reminder",
                           "logs in to the task's app with another app's password; retries with the right one only "
                           "after a credentials reminder; gives up after 3 refusals"),
    "guess_api": Slip("unknown_api", "api_list",
                      "calls made-up API names; uses the real ones once the observation lists the app's APIs; "
                      "gives up after 3 guesses"),
    "bad_args": Slip("wrong_arguments", "api_doc",
                     "calls login with wrong parameter names; fixes them once the observation shows the API's doc; "
                     "gives up after 3 tries"),
    "hasty_answer": Slip("wrong_answer", "verify_answer",
                         "question tasks: answers a wrong guess at once; solves the task when asked to verify"),
    "scratch_note": Slip("collateral_change", "review_changes",
                         "leaves a scratch note behind; deletes it when the harness lists the changes made"),
    "step_waste": Slip("step_limit", "more_steps",
                       "browses the app descriptions for 20 cells before solving"),
}
WASTE_CELLS = 20
ATTEMPTS = 3
_LOGIN = ('me = apis.supervisor.show_profile()\n'
          'passwords = {p["account_name"]: p["password"] for p in apis.supervisor.show_account_passwords()}\n')
CONFIRM = "apis.supervisor.complete_task(answer=answer)"
GIVE_UP = 'apis.supervisor.complete_task(status="fail")'



def fence(code: str, slip: bool = False) -> str:
    if slip:
        return f"I will run this step now.\n```py\n{code}\n```"
    return f"```python\n{code}\n```"


def wrong_answer(task: AppWorldTask):
    if isinstance(task.answer, (int, float)) and not isinstance(task.answer, bool):
        return task.answer + 7
    return "I could not find it"


def _other_app(app: str) -> str:
    return "notes" if app != "notes" else "wallet"


def _attempts(cells: list[str], marker: str, fmt) -> Generator[str, str, bool]:
    """Tries the failing cells in turn until an observation carries `marker`; False if none did."""
    for cell in cells:
        obs = yield fmt(cell)
        if marker in obs:
            return True
    return False


def _finish_loop(fmt, first: str) -> Plan:
    """Sends `first`, then confirms whatever the harness asks, forever (the episode ends it)."""
    obs = yield fmt(first)
    while True:
        obs = yield fmt(CONFIRM)


def _give_up(fmt) -> Plan:
    while True:
        yield fmt(GIVE_UP)


def oracle_plan(task: AppWorldTask, fmt=fence) -> Plan:
    yield from _finish_loop(fmt, task.solution)


def slipping_plan(task: AppWorldTask, slips: frozenset[str], fmt) -> Plan:
    app = task.main_app
    if "step_waste" in slips:
        for _ in range(WASTE_CELLS):
            yield fmt("print(apis.api_docs.show_app_descriptions())")
    if "wrong_password" in slips:
        cell = _LOGIN + f'token = apis.{app}.login(username=me["email"], password=passwords["{_other_app(app)}"])'
        if not (yield from _attempts([cell] * ATTEMPTS, appworld_harness.CREDENTIALS_REMINDER, fmt)):
            yield from _give_up(fmt)
    if "guess_api" in slips:
        cells = [f"print(apis.{app}.{name}())" for name in ("list_all", f"get_{app}_items", "fetch")]
        if not (yield from _attempts(cells, appworld_harness.APP_LIST_LEAD.format(app=app), fmt)):
            yield from _give_up(fmt)
    if "bad_args" in slips:
        cell = _LOGIN + f'token = apis.{app}.login(email=me["email"], pwd=passwords["{app}"])'
        feedback = appworld_harness.API_DOC_LEAD.format(app=app, api="login")
        if not (yield from _attempts([cell] * ATTEMPTS, feedback, fmt)):
            yield from _give_up(fmt)
    scratch = "scratch_note" in slips
    if scratch:
        yield fmt(_LOGIN + 'scratch_token = apis.notes.login(username=me["email"], password=passwords["notes"])'
                  '["access_token"]\nscratch = apis.notes.create_note(access_token=scratch_token, '
                  f'title="scratch work", content="working on: {task.type}")\nprint(scratch)')
    if "hasty_answer" in slips and task.kind == "question":
        obs = yield fmt(f"apis.supervisor.complete_task(answer={wrong_answer(task)!r})")
        while appworld_harness.VERIFY_PROMPT not in obs:
            obs = yield fmt(f"apis.supervisor.complete_task(answer={wrong_answer(task)!r})")
    obs = yield fmt(task.solution)
    while True:
        if scratch and appworld_harness.REVIEW_LEAD in obs:
            scratch = False
            undo = 'apis.notes.delete_note(access_token=scratch_token, note_id=scratch["note_id"])\n'
            obs = yield fmt(undo + CONFIRM)
        else:
            obs = yield fmt(CONFIRM)


class OracleAgent(PlanAgent):
    """Runs the gold solution, then confirms whatever the harness asks."""

    def _new_plan(self, info: dict) -> Plan:
        return oracle_plan(info["task"])


class SlippingAgent(SlipDrawingAgent):
    """The oracle with slips: `noise` maps slip names of `SLIPS` to probabilities per episode."""

    SLIPS = SLIPS
    slip_noun = "AppWorld slip"

    def _new_plan(self, info: dict) -> Plan:
        slips = self.slips_for(info)
        return slipping_plan(info["task"], slips, lambda code: fence(code, slip="code_fence" in slips))
