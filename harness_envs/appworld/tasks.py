"""Tasks of the offline world: templates, scenarios, splits, gold solutions and checkers.

A template is one kind of task (its name is the task `type`): it picks its parameters from a world,
states the instruction, writes the gold solution (code that calls the APIs, as AppWorld's
`solution.py` does) and checks an episode's end state. A scenario is a template with a scenario
number; its three tasks (variants) have the same instruction pattern in three different worlds,
as AppWorld's scenarios do. Task ids are `<template>-<scenario>_<variant>`.

Checks (`check_task`) run on the database diff and the answer given to `complete_task`: the
template's own tests, plus "no collateral changes" (every changed row is one the task asked for).
A task passes (TGC) when all its tests pass; a scenario (SGC) when all its tasks pass.

Splits: `train` and `dev` draw scenarios of the six train templates (disjoint scenario numbers);
`test` uses five other templates, and the `todo` app appears only there (held-out app).
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import random
from typing import Any, Callable

from harness_envs.appworld.checker import (
    TaskTest,
    answers_match,
    contact_of,
    contacts_list,
    expect_email_total,
    expect_note,
    expect_nothing,
    expect_payment,
    expect_phone,
    expect_todo_added,
    expect_todos_done,
    inbox_from,
    latest,
    people,
    received,
    sent,
)
from harness_envs.appworld.world import Change, WorldSpec, generate

SPLITS = ("train", "dev", "test")
VARIANTS = 3


class SeededWorld:
    """What AppWorld's episode reads of a task's world: the world of the task's `seed`, its
    supervisor, and the first of its `apps` as the main one (shared by the testbed's API tasks)."""

    @property
    def world(self) -> WorldSpec:
        return world_for(self.seed)

    @property
    def supervisor(self) -> dict:
        return self.world.supervisor

    @property
    def main_app(self) -> str:
        return self.apps[0]


@dataclasses.dataclass(frozen=True)
class AppWorldTask(SeededWorld):
    """One task: `question` is the instruction; `answer` the gold answer (None for action tasks);
    `solution` the gold code; `params` what the checker needs."""

    task_id: str
    type: str
    question: str
    scenario_id: str
    split: str
    seed: int
    kind: str  # question | action
    apps: tuple[str, ...]
    params: dict
    answer: Any
    solution: str


@functools.lru_cache(maxsize=512)
def world_for(seed: int) -> WorldSpec:
    return generate(seed)


# ---------------------------------------------------------------- pieces of gold code

_SETUP = '''passwords = {p["account_name"]: p["password"] for p in apis.supervisor.show_account_passwords()}
me = apis.supervisor.show_profile()

def all_pages(api, **kwargs):
    items, page = [], 0
    while True:
        batch = api(page_index=page, page_limit=20, **kwargs)
        if not batch:
            return items
        items += batch
        page += 1
'''


def _login(app: str) -> str:
    return f'{app}_token = apis.{app}.login(username=me["email"], password=passwords["{app}"])["access_token"]\n'


def _find_contact(first: str, last: str) -> str:
    return (_login("contacts") +
            f'person = [c for c in all_pages(apis.contacts.search_contacts, access_token=contacts_token, '
            f'query={first + " " + last!r}) if c["first_name"] == {first!r} and c["last_name"] == {last!r}][0]\n')


def _finish(answer: str = "None") -> str:
    return f"answer = {answer}\napis.supervisor.complete_task(answer=answer)\n"


# ---------------------------------------------------------------- templates

@dataclasses.dataclass(frozen=True)
class Template:
    name: str
    kind: str
    apps: tuple[str, ...]
    pick: Callable[[WorldSpec, random.Random], dict | None]  # params, or None if the world does not fit
    question: Callable[[dict], str]
    answer: Callable[[WorldSpec, dict], Any]
    solution: Callable[[dict], str]
    expect: Callable[[WorldSpec, dict, list[Change]], tuple[list[TaskTest], set]]  # own tests, explained changes


def _pick_person(w: WorldSpec, rng: random.Random, ok: Callable[[int], bool]) -> dict | None:
    ids = [p["id"] for p in w.table("people")[1:] if ok(p["id"])]
    if not ids:
        return None
    p = people(w)[rng.choice(ids)]
    return {"person_id": p["id"], "first": p["first_name"], "last": p["last_name"], "email": p["email"],
            "relationship": contact_of(w, p["id"])["relationship"]}


def _pick_relationship(w, rng):
    counts = {}
    for c in w.table("contacts"):
        counts[c["relationship"]] = counts.get(c["relationship"], 0) + 1
    rels = sorted(r for r, n in counts.items() if n >= 2)
    if not rels:
        return None
    return {"relationship": rng.choice(rels), "title": f"My {rng.choice(('circle', 'people', 'list'))}"}


def _pick_word(w, rng):
    words = sorted({word for t in w.table("todos") if not t["done"] for word in t["title"].lower().split()[-1:]})
    return {"word": rng.choice(words)} if words else None


def _pick_latest_subject(w, rng):
    p = _pick_person(w, rng, lambda pid: bool(inbox_from(w, pid)))
    return None if p is None else {**p, "subject": latest(inbox_from(w, p["person_id"]))["subject"]}


def _with(extra: Callable[[random.Random], dict], ok=lambda w, pid: True):
    def pick(w, rng):
        p = _pick_person(w, rng, lambda pid: ok(w, pid))
        return None if p is None else {**p, **extra(rng)}
    return pick


TEMPLATES: dict[str, Template] = {t.name: t for t in (
    Template("wallet_total_sent", "question", ("wallet", "contacts"),
             _with(lambda rng: {}, lambda w, pid: bool(sent(w, pid))),
             lambda p: f"How much money have I sent in total to my {p['relationship']} {p['first']} {p['last']} on "
                       "wallet? Answer with just the number.",
             lambda w, p: round(sum(t["amount"] for t in sent(w, p["person_id"])), 2),
             lambda p: _SETUP + _find_contact(p["first"], p["last"]) + _login("wallet") +
             'sent = all_pages(apis.wallet.search_transactions, access_token=wallet_token, direction="sent", '
             'counterpart_email=person["email"])\n' + _finish('round(sum(t["amount"] for t in sent), 2)'),
             expect_nothing),
    Template("contact_phone", "question", ("contacts",), _with(lambda rng: {}),
             lambda p: f"What is the phone number of my {p['relationship']} {p['first']} {p['last']}? Answer with just "
                       "the number as my contacts list it.",
             lambda w, p: contact_of(w, p["person_id"])["phone"],
             lambda p: _SETUP + _find_contact(p["first"], p["last"]) + _finish('person["phone_number"]'),
             expect_nothing),
    Template("email_count", "question", ("mail", "contacts"),
             _with(lambda rng: {}, lambda w, pid: bool(inbox_from(w, pid))),
             lambda p: f"How many emails have I received from {p['first']} {p['last']}? Answer with just the number.",
             lambda w, p: len(inbox_from(w, p["person_id"])),
             lambda p: _SETUP + _find_contact(p["first"], p["last"]) + _login("mail") +
             'emails = all_pages(apis.mail.search_emails, access_token=mail_token, sender_email=person["email"])\n' +
             _finish("len(emails)"),
             expect_nothing),
    Template("wallet_pay", "action", ("wallet", "contacts"),
             _with(lambda rng: {"amount": float(rng.randint(10, 60)),
                                "description": f"for the {rng.choice(('tickets', 'groceries', 'taxi', 'gift'))}"}),
             lambda p: f"Send ${p['amount']:.0f} to my {p['relationship']} {p['first']} {p['last']} on wallet with "
                       f"the description '{p['description']}'.",
             lambda w, p: None,
             lambda p: _SETUP + _find_contact(p["first"], p["last"]) + _login("wallet") +
             f'apis.wallet.send_money(access_token=wallet_token, receiver_email=person["email"], '
             f'amount={p["amount"]!r}, description={p["description"]!r})\n' + _finish(),
             expect_payment),
    Template("contact_update", "action", ("contacts",),
             _with(lambda rng: {"new_phone": f"{rng.randint(200, 989)}{rng.randint(1000000, 9999999)}"}),
             lambda p: f"My {p['relationship']} {p['first']} {p['last']} has a new phone number, {p['new_phone']}. "
                       "Update it in my contacts.",
             lambda w, p: None,
             lambda p: _SETUP + _find_contact(p["first"], p["last"]) +
             f'apis.contacts.update_contact(access_token=contacts_token, contact_id=person["contact_id"], '
             f'phone_number={p["new_phone"]!r})\n' + _finish(),
             expect_phone),
    Template("note_from_email", "action", ("notes", "mail", "contacts"),
             _with(lambda rng: {"title": f"From my inbox {rng.randint(1, 99)}"},
                   lambda w, pid: bool(inbox_from(w, pid))),
             lambda p: f"Save the body of the latest email I received from {p['first']} {p['last']} as a new note "
                       f"titled '{p['title']}'.",
             lambda w, p: None,
             lambda p: _SETUP + _find_contact(p["first"], p["last"]) + _login("mail") + _login("notes") +
             'latest = apis.mail.search_emails(access_token=mail_token, sender_email=person["email"])[0]\n'
             'body = apis.mail.show_email(access_token=mail_token, email_id=latest["email_id"])["body"]\n'
             f'apis.notes.create_note(access_token=notes_token, title={p["title"]!r}, content=body)\n' + _finish(),
             expect_note("title", lambda w, p: latest(inbox_from(w, p["person_id"]))["body"])),
    # ---- test templates (the todo app appears only here)
    Template("email_received_total", "action", ("mail", "wallet", "contacts"),
             _with(lambda rng: {"subject": f"Your payments {rng.randint(1, 99)}"},
                   lambda w, pid: bool(received(w, pid))),
             lambda p: f"Email my {p['relationship']} {p['first']} {p['last']} the total amount of money I have "
                       f"received from them on wallet, with the subject '{p['subject']}' and just the number as the "
                       "body.",
             lambda w, p: None,
             lambda p: _SETUP + _find_contact(p["first"], p["last"]) + _login("wallet") + _login("mail") +
             'got = all_pages(apis.wallet.search_transactions, access_token=wallet_token, direction="received", '
             'counterpart_email=person["email"])\n'
             f'apis.mail.send_email(access_token=mail_token, to_email=person["email"], subject={p["subject"]!r}, '
             'body=str(round(sum(t["amount"] for t in got), 2)))\n' + _finish(),
             expect_email_total),
    Template("notecontacts_list", "action", ("notes", "contacts"), _pick_relationship,
             lambda p: f"Create a note titled '{p['title']}' listing the first names of my contacts who are my "
                       f"{p['relationship']}s, one per line, in alphabetical order.",
             lambda w, p: None,
             lambda p: _SETUP + _login("contacts") + _login("notes") +
             f'people = all_pages(apis.contacts.search_contacts, access_token=contacts_token, '
             f'relationship={p["relationship"]!r})\n'
             'content = "\\n".join(sorted(c["first_name"] for c in people))\n'
             f'apis.notes.create_note(access_token=notes_token, title={p["title"]!r}, content=content)\n' + _finish(),
             expect_note("title", contacts_list)),
    Template("todo_mark_done", "action", ("todo",), _pick_word,
             lambda p: f"Mark every open task on my todo list whose title mentions '{p['word']}' as done.",
             lambda w, p: None,
             lambda p: _SETUP + _login("todo") +
             f'for t in all_pages(apis.todo.search_tasks, access_token=todo_token, query={p["word"]!r}, done=False):\n'
             '    apis.todo.mark_task_done(access_token=todo_token, task_id=t["task_id"])\n' + _finish(),
             expect_todos_done),
    Template("todo_count_open", "question", ("todo",), lambda w, rng: {},
             lambda p: "How many tasks on my todo list are not done yet? Answer with just the number.",
             lambda w, p: sum(1 for t in w.table("todos") if not t["done"]),
             lambda p: _SETUP + _login("todo") +
             _finish("len(all_pages(apis.todo.search_tasks, access_token=todo_token, done=False))"),
             expect_nothing),
    Template("todo_from_email", "action", ("todo", "mail", "contacts"), _pick_latest_subject,
             lambda p: f"Add a task to my todo list whose title is the subject of the latest email I received from "
                       f"{p['first']} {p['last']}.",
             lambda w, p: None,
             lambda p: _SETUP + _find_contact(p["first"], p["last"]) + _login("mail") + _login("todo") +
             'latest = apis.mail.search_emails(access_token=mail_token, sender_email=person["email"])[0]\n'
             'apis.todo.add_task(access_token=todo_token, title=latest["subject"])\n' + _finish(),
             expect_todo_added),
)}

TRAIN_TEMPLATES = ("wallet_total_sent", "contact_phone", "email_count", "wallet_pay", "contact_update",
                   "note_from_email")
TEST_TEMPLATES = ("email_received_total", "notecontacts_list", "todo_mark_done", "todo_count_open", "todo_from_email")
SCENARIOS = {"train": (TRAIN_TEMPLATES, range(0, 5)), "dev": (TRAIN_TEMPLATES, range(5, 7)),
             "test": (TEST_TEMPLATES, range(0, 4))}
HELD_OUT_APPS = ("todo",)


def _seed(*parts) -> int:
    return int(hashlib.sha256("/".join(map(str, parts)).encode()).hexdigest()[:8], 16)


def make_task(template: str, scenario: int, variant: int, split: str) -> AppWorldTask:
    t = TEMPLATES[template]
    attempt = 0
    while True:  # the first world (of a seeded sequence) the template fits
        seed = _seed(template, scenario, variant, attempt)
        world = world_for(seed)
        params = t.pick(world, random.Random(seed))
        if params is not None:
            break
        attempt += 1
    return AppWorldTask(
        task_id=f"{template}-{scenario}_{variant}", type=template, question=t.question(params),
        scenario_id=f"{template}-{scenario}", split=split, seed=seed, kind=t.kind, apps=t.apps, params=params,
        answer=t.answer(world, params), solution=t.solution(params))


@functools.lru_cache(maxsize=None)
def _split(name: str) -> tuple[AppWorldTask, ...]:
    templates, scenarios = SCENARIOS[name]
    return tuple(make_task(t, k, v, name) for k in scenarios for t in templates for v in range(1, VARIANTS + 1))


def load_split(name: str) -> list[AppWorldTask]:
    if name not in SPLITS:
        raise ValueError(f"appworld offline split {name!r} is not one of {SPLITS}")
    return list(_split(name))


def check_task(task: AppWorldTask, changes: list[Change], completed: dict | None) -> list[TaskTest]:
    """The task's tests on the end state: completed, the answer (question tasks), the template's
    own tests (action tasks) and no collateral changes."""
    t = TEMPLATES[task.type]
    tests = [TaskTest("complete_task was called with status 'success'",
                  completed is not None and completed.get("status") == "success")]
    given = completed.get("answer") if completed else None
    if task.kind == "question":
        tests.append(TaskTest("the answer", answers_match(task.answer, given),
                              f"expected {task.answer!r}, got {given!r}"))
    own, explained = t.expect(task.world, task.params, changes)
    tests += own
    extra = [c.describe() for c in changes if (c.table, c.id) not in explained]
    tests.append(TaskTest("no collateral changes", not extra, "; ".join(extra[:5])))
    return tests
