"""The testbed's API regime: generated tasks on AppWorld's protocol (docs/testbed.md, "The API regime").

The names regime asks a policy to look a table's name up before it queries; this regime asks for
the same kind of behaviour in AppWorld's protocol, where the agent writes Python cells that call
`apis.<app>.<api>(...)` in the offline world's REPL: **read an app's API list before calling one
of its APIs**. The base harness never prompts it (AppWorld's `brief` instruction says nothing of
docs), the sibling `docs_first` does (a hint line), and `api_list` lists the app's APIs after a call
to one that does not exist (the negative control: its rescue rests on an observation the base
harness never shows).

Each task draws its own app: a coined app name, three coined attributes, each served by an API with
a coined name whose description is "the <attribute> of an item", and four coined items with a value
per attribute. The task asks for one attribute of one item:

    What is the rotuma of kesipa in my vadiku app?

Half of the tasks (odd indices) hide the API's name with a trigger sentence; the others name it
("Its API is apis.vadiku.motari."). A hidden task is solved by listing the app's APIs,
`apis.api_docs.show_api_descriptions(app_name="vadiku")`, and calling the one whose description
names the attribute: the name must be read from the list and copied, as a hidden table's name is
copied from SHOW TABLES. A guessed name (`apis.vadiku.show_rotuma`) fails with the world's
404, which names no API. The world itself is the offline world's: the supervisor app (whose
`complete_task` ends the episode), `api_docs`, the sandboxed REPL and its error texts.

Splits: `apis_train` (training-kind coined words, training wordings and triggers) and
`apis_heldout` (held-out-kind words: names.is_heldout_word, and wordings and triggers of its own).
Task i depends only on (split, seed, i).
"""
from __future__ import annotations

import dataclasses
import random
import re

from harness_envs.appworld import apps as appworld_apps
from harness_envs.appworld.api import ApiError, Param, Registry
from harness_envs.appworld.checker import TaskTest, answers_match
from harness_envs.appworld.session import OfflineSession
from harness_envs.appworld.tasks import SeededWorld
from harness_envs.synth.names import coin
from harness_envs.synth.tasks import generated, split_of_size

TASK_TYPE = "lookup"
ATTRIBUTES = 3  # APIs an app serves, one an attribute
ITEMS = 4
VALUES = (10, 99)
WORLD_SEED = 0  # every task's supervisor (the user in the prompt) is world 0's
PARAM = "item"
API_DESCRIPTION = "the {attr} of an item"
GUESS_PREFIX = "show_"  # the guessed API: show_<attribute>, which no app has (coined names have no "_")

QUESTIONS = {
    "train": ("What is the {attr} of {item} in my {app} app?",
              "Find the {attr} of {item} in my {app} app.",
              "Give me the {attr} of {item} from my {app} app."),
    "heldout": ("Tell me the {attr} of {item} in my {app} app.",
                "Look up the {attr} of {item} in my {app} app.",
                "I need the {attr} of {item} from my {app} app."),
}
# The sentence that withholds the API's name, disjoint between the kinds (as names.TRIGGERS).
TRIGGERS = {
    "train": ("The API's name is not given.", "I don't know what the API is called.",
              "The API to use is not named here."),
    "heldout": ("Nobody told me the API's name.", "The API is unnamed here.",
                "You are not told which API serves it."),
}
VISIBLE = "Its API is apis.{app}.{api}."
SPLITS = {"apis_train": "train", "apis_heldout": "heldout"}
DEFAULT_SIZES = {"apis_train": 3000, "apis_heldout": 600}


@dataclasses.dataclass(frozen=True)
class ApisTask(SeededWorld):
    """One task of the API regime, with the fields AppWorld's episode and evaluator read.

    `apis`: ((api name, attribute), ...) in the app's order; `items`: ((item, (value per
    attribute, ...)), ...); the task asks for attribute `attribute` of item `item`."""

    task_id: str
    split: str
    index: int
    question: str
    app: str
    apis: tuple[tuple[str, str], ...]
    items: tuple[tuple[str, tuple[int, ...]], ...]
    item: str
    attribute: str
    hidden: bool
    answer: int
    type: str = TASK_TYPE
    kind: str = "question"
    seed: int = WORLD_SEED

    @property
    def scenario_id(self) -> str:
        return self.task_id

    @property
    def apps(self) -> tuple[str, ...]:
        return (self.app,)

    @property
    def api(self) -> str:
        """The API that serves the asked attribute."""
        return next(name for name, attr in self.apis if attr == self.attribute)

    @property
    def solution(self) -> str:
        """The gold cell: the answer straight from the right API."""
        return gold_cell(self)


def gold_cell(task: ApisTask, api: str | None = None) -> str:
    """`complete_task` with the value of `api` (default: the right one) for the task's item."""
    return f'apis.supervisor.complete_task(answer=apis.{task.app}.{api or task.api}({PARAM}="{task.item}"))'


def guessed_api(task: ApisTask) -> str:
    return GUESS_PREFIX + task.attribute


def list_cell(task: ApisTask) -> str:
    """The lookup: the app's APIs and what each one gives."""
    return f'print(apis.api_docs.show_api_descriptions(app_name="{task.app}"))'


_LOOKUP = re.compile(r"\bapis\s*\.\s*api_docs\s*\.\s*show_api_(descriptions|doc)\b")


def opens_with_docs(replies) -> bool:
    """Whether an episode's first reply looks an API up (`show_api_descriptions` or `show_api_doc`)."""
    return bool(replies) and bool(_LOOKUP.search(replies[0] or ""))


def is_hidden(index: int) -> bool:
    return index % 2 == 1


def make_task(split: str, seed: int, index: int, backend=None) -> ApisTask:
    """Task `index` of (split, seed); `backend` is unused (the synth generators' signature)."""
    if split not in SPLITS:
        raise ValueError(f"unknown API-regime split {split!r}; choose one of {sorted(SPLITS)}")
    kind = SPLITS[split]
    rng = random.Random(f"{split}/{seed}/{index}")
    taken: set[str] = set()
    used: set[str] = set()  # no syllable serves two names of a task (names' distinct splits)
    app = coin(rng, kind, taken, used)
    attributes = [coin(rng, kind, taken, used) for _ in range(ATTRIBUTES)]
    api_names = [coin(rng, kind, taken, used) for _ in range(ATTRIBUTES)]
    items = [coin(rng, kind, taken, used) for _ in range(ITEMS)]
    values = [tuple(rng.randint(*VALUES) for _ in range(ATTRIBUTES)) for _ in items]
    a, i = rng.randrange(ATTRIBUTES), rng.randrange(ITEMS)
    hidden = is_hidden(index)
    question = rng.choice(QUESTIONS[kind]).format(attr=attributes[a], item=items[i], app=app)
    tail = rng.choice(TRIGGERS[kind]) if hidden else VISIBLE.format(app=app, api=api_names[a])
    return ApisTask(task_id=f"{split}-s{seed}-{index:05d}", split=split, index=index, question=f"{question} {tail}",
                    app=app, apis=tuple(zip(api_names, attributes)), items=tuple(zip(items, values)),
                    item=items[i], attribute=attributes[a], hidden=hidden, answer=values[i][a])


def load_split(name: str, n: int | None = None, seed: int = 0) -> list[ApisTask]:
    return split_of_size(make_task, DEFAULT_SIZES, name, n, seed)


def make_tasks(split: str, n: int, seed: int = 0) -> list[ApisTask]:
    return generated(make_task, split, n, seed)


def task_registry(task: ApisTask) -> Registry:
    """The apps of a task's world: the offline world's `supervisor` and `api_docs`, and the task's app."""
    registry = Registry()
    for shared in ("supervisor", "api_docs"):
        registry.apps[shared] = dict(appworld_apps.REGISTRY.apps[shared])
        registry.descriptions[shared] = appworld_apps.REGISTRY.descriptions[shared]
    api = registry.app(task.app, f"the user's {task.app} items and what they are worth")
    values = dict(task.items)
    for column, (name, attribute) in enumerate(task.apis):
        def serve(world, item, _name=name, _column=column):
            if item not in values:
                raise ApiError("not_found", f"there is no item named {item!r} in {task.app}", app=task.app, api=_name)
            return values[item][_column]
        api(name, API_DESCRIPTION.format(attr=attribute), Param(PARAM, str, "the item's name"),
            returns="integer")(serve)
    return registry


def check(task: ApisTask, changes, completed: dict | None) -> list[TaskTest]:
    """The task passes when it was completed with the asked value and nothing was changed."""
    answered = completed is not None and completed.get("status") == "success"
    given = completed.get("answer") if completed else None
    return [TaskTest("answer", answered and answers_match(task.answer, given),
                     f"expected {task.answer}, got {given!r}" if answered else "the task was not completed"),
            TaskTest("no_changes", not changes, f"{len(changes)} change(s)" if changes else "")]


class ApisSession(OfflineSession):
    """The offline world of one API-regime task: its own registry, its own check."""

    def __init__(self, task: ApisTask, limits, *, isolation: str = "auto", hide=()):
        super().__init__(task, limits, isolation=isolation, hide=hide, registry=task_registry(task))

    def check(self, changes, completed) -> list[TaskTest]:
        return check(self.task, changes, completed)
