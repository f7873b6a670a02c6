"""The names regime of the testbed (v2): every task draws its own table, column and value names.

In the first regime each domain had a fixed table name, so a warm policy could memorise `games`
instead of reading it from the prompt, and held-out domains were unreachable (docs/results.md).
Here a task's table name, column names and key/category values are drawn from word lists of its
split; the held-out lists share no word with the training lists, and the held-out templates differ
from the training ones only in words that do not set the operator ("Tell me the maximum ..." for
"What is the maximum ...?").

Half of the tasks hide the table name ("The name of this table is not given; its headers are ...").
The policy can find it with `SHOW TABLES`, which every harness accepts: that is the behaviour a
sibling (`tables_first`, a hint line) induces and the base harness should come to show by itself.
Every episode database is called `main`, so no error message leaks the table name.

Splits:
    names_train     training word lists and wording
    names_heldout   disjoint word lists, reworded templates
    coined_train    every name coined per task from syllables (2-3 of 70), training wording
    coined_heldout  coined names of the held-out kind, reworded templates
    distinct_train, distinct_heldout
                    the coined splits, but no syllable serves two names of one task (nor twice in
                    one name), so in a task's text every syllable is followed by one syllable only
    varied_train    distinct_train with three wordings a family (questions.NAMES_VARIED), so
                    no one mark ends every value; its held-out split is distinct_heldout
    shared_leads_train
                    varied_train plus wordings whose lead-in ("Give the", "Find the", "What is
                    the") another family uses too (questions.NAMES_SHARED_LEADS), so the lead-in
                    does not tell the family; held out: distinct_heldout
A coined word is of the held-out kind iff its CRC-32 is divisible by 5, so the two kinds never share
a word while they share every token. Why the distinct splits: with a token a syllable (the
`tiny_words` tokenizer), a task's 20 names hold about 50 syllables drawn from 70, so most syllables
occur in several names and "copy the token that followed this one last time" — the copy a small
transformer learns first — is ambiguous: an SFT run on the coined splits had learnt every other
token by step 1,500 of 3,000 yet still spent 3.3 nats on each syllable of a copied name
(docs/results.md). With distinct syllables that copy is exact once the first syllable is chosen. The word-list splits let a 1.05M-parameter policy memorise each
word instead of copying it (docs/results.md, "Testbed v2: the first warm start fails the gates"):
with coined names no name repeats often enough to be memorised.
Task i depends only on (split, seed, i); its type is NAMES_TYPES[i % 6] and it hides the name when
(i // 6) is odd, so every type is hidden in half of its tasks.
"""
from __future__ import annotations

import dataclasses
import random
import re
import zlib

from harness_envs.dbbench.data import Table
from harness_envs.dbbench.sqlite_backend import SQLiteBackend
from harness_envs.synth.questions import description, make_question
from harness_envs.synth.tables import Column, Domain, make_table
from harness_envs.synth.tasks import GenerationError, SynthTask, generated, label_task, split_of_size

NAMES_TYPES = ("other", "counting", "ranking", "aggregation-SUM", "aggregation-MIN", "aggregation-MAX")
DATABASE = "main"
HIDDEN_DESCRIPTION = "The name of this table is not given; its headers are {headers}."
# Testbed v4: the sentence that withholds the name, in wordings disjoint between training and
# held-out tasks (the first training one is v2/v3's), so a held-out success shows that the lookup
# answers what the sentence means, not its words.
TRIGGERS = {
    "train": (HIDDEN_DESCRIPTION,
              "This table's name is withheld; its headers are {headers}.",
              "No name is given for this table; its headers are {headers}."),
    "heldout": ("The table is unnamed here; its headers are {headers}.",
                "You are not told what this table is called; its headers are {headers}.",
                "Nobody says which table this is; its headers are {headers}."),
}


def _words(text: str) -> tuple[str, ...]:
    return tuple(text.split())


@dataclasses.dataclass(frozen=True)
class WordLists:
    tables: tuple[str, ...]
    columns: tuple[str, ...]
    values: tuple[str, ...]


# Short words, no SQL keyword, no word in two lists of a split or in both splits.
WORDS = {
    "train": WordLists(
        tables=_words("birds fruit tools ships coins cards lakes rocks songs films gems hats boats maps "
                      "toys dogs cars vans shoes bells kites drums pens cups nets poems farms parks roads tents"),
        columns=_words("color size owner speed weight price stock score width height depth power mood "
                       "grade team zone tier kind shape age cost fee rate heat tone style brand region "
                       "club crew label model batch stage phase"),
        values=_words("red blue green pink gray gold tan lime navy teal oak elm ash fir pine yew bay fig "
                      "kiwi lemon mango melon olive peach pear plum apple grape berry cherry north south "
                      "east west alpha beta gamma omega sigma echo bravo tango oscar mike zulu amber coral "
                      "ivory jade ruby onyx opal pearl flint slate steel iron brass tin zinc nova luna sol")),
    "heldout": WordLists(
        tables=_words("moths herbs nails rafts beads chips ponds caves tunes plays rings caps sleds flags "
                      "dolls cats buses jeeps boots horns harps flutes inks jars webs odes mills yards lanes huts"),
        columns=_words("hue scale keeper amount pace mass tariff supply tally girth bulk vigor temper mark "
                       "squad area sector genre span charge ratio warmth pitch flavor maker district guild "
                       "band tag make lot era venue"),
        values=_words("cyan mauve beige khaki azure ochre sepia umber maple cedar birch larch alder hazel "
                      "rowan lotus tulip lily daisy poppy iris aster basil thyme sage mint dill clove anise "
                      "ginger nutmeg pepper rose fern moss reed kelp vine ivy palm dune mesa ridge cliff "
                      "harbor canyon glacier meadow prairie tundra marsh bayou fjord atoll islet inlet cove "
                      "bluff crest knoll vale glen dell heath moor brook creek")),
}


@dataclasses.dataclass(frozen=True)
class NamesSplit:
    words: str  # train | heldout
    phrasing: str
    coined: bool = False
    distinct_syllables: bool = False  # coined names of one task share no syllable
    trigger: str = ""  # v4: TRIGGERS' wordings of this kind; empty: HIDDEN_DESCRIPTION alone
    tables: tuple[int, int] = (1, 1)  # v4: tables in the episode database (the task's + distractors)


NAMES_SPLITS = {"names_train": NamesSplit("train", "names_train"),
                "names_heldout": NamesSplit("heldout", "names_heldout"),
                "coined_train": NamesSplit("train", "names_train", coined=True),
                "coined_heldout": NamesSplit("heldout", "names_heldout", coined=True),
                "distinct_train": NamesSplit("train", "names_train", coined=True, distinct_syllables=True),
                "distinct_heldout": NamesSplit("heldout", "names_heldout", coined=True, distinct_syllables=True),
                "varied_train": NamesSplit("train", "names_train_varied", coined=True, distinct_syllables=True),
                "shared_leads_train": NamesSplit("train", "names_train_shared_leads", coined=True,
                                                 distinct_syllables=True),
                "v4_train": NamesSplit("train", "names_train_shared_leads", coined=True, distinct_syllables=True,
                                       trigger="train", tables=(2, 3)),
                "v4_heldout": NamesSplit("heldout", "names_heldout", coined=True, distinct_syllables=True,
                                         trigger="heldout", tables=(2, 3))}
DEFAULT_SIZES = {"names_train": 3000, "names_heldout": 600, "coined_train": 3000, "coined_heldout": 600,
                 "distinct_train": 3000, "distinct_heldout": 600, "varied_train": 3000,
                 "shared_leads_train": 3000, "v4_train": 3000, "v4_heldout": 600}
SYLLABLES = tuple(c + v for c in "bdfgklmnprstvz" for v in "aeiou")
HELDOUT_MODULUS = 5
# Coinable words that are SQL words or the expert's guessed table.
RESERVED = frozenset({"data", "date", "like", "time", "zone", "sale", "role", "file", "mode", "note"})
KEY_VALUES = 8  # rows per table: 5..8
CATEGORY_VALUES = 3
INT_RANGES = ((10, 99), (100, 999))
_MAX_ATTEMPTS = 100


def _check_word_lists() -> None:
    for name, lists in WORDS.items():
        seen = [w for field in dataclasses.fields(lists) for w in getattr(lists, field.name)]
        if len(seen) != len(set(seen)):
            raise AssertionError(f"word lists of {name!r} repeat a word")
    a = {w for f in dataclasses.fields(WordLists) for w in getattr(WORDS["train"], f.name)}
    b = {w for f in dataclasses.fields(WordLists) for w in getattr(WORDS["heldout"], f.name)}
    if a & b:
        raise AssertionError(f"training and held-out word lists share {sorted(a & b)}")


_check_word_lists()


def random_domain(words: WordLists, rng: random.Random) -> Domain:
    """A one-task domain: a table name, a key column, two category and two integer columns, and
    their values, all drawn from `words`."""
    table = rng.choice(words.tables)
    key, cat1, cat2, int1, int2 = rng.sample(words.columns, 5)
    values = rng.sample(words.values, KEY_VALUES + 2 * CATEGORY_VALUES)
    keys, pool1, pool2 = (values[:KEY_VALUES], values[KEY_VALUES:KEY_VALUES + CATEGORY_VALUES],
                          values[KEY_VALUES + CATEGORY_VALUES:])
    (lo1, hi1), (lo2, hi2) = rng.choice(INT_RANGES), rng.choice(INT_RANGES)
    return Domain(name="names", table=table, key=Column(key, "key", tuple(keys)), columns=(
        Column(cat1, "category", tuple(pool1)), Column(cat2, "category", tuple(pool2)),
        Column(int1, "int", low=lo1, high=hi1), Column(int2, "int", low=lo2, high=hi2)))


def is_heldout_word(word: str) -> bool:
    return zlib.crc32(word.encode()) % HELDOUT_MODULUS == 0


def coin(rng: random.Random, kind: str, taken: set[str], used: set[str] | None = None) -> str:
    """A word of 2-3 syllables of the `kind` (train | heldout) not in `taken` (which it joins).
    With `used`, the word's syllables are distinct and none is in `used` (they join it)."""
    while True:
        if used is None:
            parts = [rng.choice(SYLLABLES) for _ in range(rng.randint(2, 3))]
        else:
            parts = rng.sample([s for s in SYLLABLES if s not in used], rng.randint(2, 3))
        word = "".join(parts)
        if word not in taken and word not in RESERVED and is_heldout_word(word) == (kind == "heldout"):
            taken.add(word)
            if used is not None:
                used.update(parts)
            return word


def coined_words(kind: str, rng: random.Random, distinct_syllables: bool = False) -> WordLists:
    """One task's word lists, every word coined: a table name, 5 columns, 14 values; with
    `distinct_syllables`, no syllable in two of them (20 words use at most 60 of the 70)."""
    taken: set[str] = set()
    used: set[str] | None = set() if distinct_syllables else None
    words = [coin(rng, kind, taken, used) for _ in range(1 + 5 + KEY_VALUES + 2 * CATEGORY_VALUES)]
    return WordLists(tables=tuple(words[:1]), columns=tuple(words[1:6]), values=tuple(words[6:]))


def is_hidden(index: int) -> bool:
    return (index // len(NAMES_TYPES)) % 2 == 1


def task_index(task_id: str) -> int:
    """The index of a task from its id (`names_train-s0-00012` -> 12)."""
    return int(task_id.rsplit("-", 1)[1])


_SHOW_TABLES = re.compile(r"\bSHOW\s+TABLES\b", re.IGNORECASE)


def opens_with_show_tables(replies) -> bool:
    """Whether an episode's first reply runs SHOW TABLES."""
    return bool(replies) and bool(_SHOW_TABLES.search(replies[0]))


def describe(table: Table, hidden: bool, wording: str = HIDDEN_DESCRIPTION) -> str:
    """DBBench's table description line, or the one (`wording`) that withholds the table name."""
    return wording.format(headers=",".join(table.columns)) if hidden else description(table)


def distractor_tables(spec: NamesSplit, rng: random.Random, table: Table, taken: set[str]) -> tuple[Table, ...]:
    """v4: the other tables of a task's database, each with its own coined name, headers and rows;
    none is named like a word of the task (`taken`) or shares the task table's headers."""
    out = []
    for _ in range(rng.randint(*spec.tables) - 1):
        for _ in range(_MAX_ATTEMPTS):
            other, _ = make_table(random_domain(coined_words(spec.words, rng, spec.distinct_syllables), rng), rng)
            if other.name not in taken and not set(other.columns) & set(table.columns):
                taken.add(other.name)
                out.append(other)
                break
        else:
            raise GenerationError(f"no distractor table for {table.name} in {_MAX_ATTEMPTS} draws")
    return tuple(out)


def task_words(table: Table) -> set[str]:
    return {table.name, *table.columns, *(cell for row in table.rows for cell in row)}


def make_task(split: str, seed: int, index: int, backend: SQLiteBackend | None = None) -> SynthTask:
    if split not in NAMES_SPLITS:
        raise ValueError(f"unknown names split {split!r}; choose one of {sorted(NAMES_SPLITS)}")
    spec = NAMES_SPLITS[split]
    task_type = NAMES_TYPES[index % len(NAMES_TYPES)]
    rng = random.Random(f"{split}/{seed}/{index}")
    for _ in range(_MAX_ATTEMPTS):
        words = coined_words(spec.words, rng, spec.distinct_syllables) if spec.coined else WORDS[spec.words]
        domain = random_domain(words, rng)
        table, columns = make_table(domain, rng)
        question = make_question(task_type, table, columns, rng, spec.phrasing)
        if question is not None:
            break
    else:
        raise GenerationError(f"{split} seed {seed} task {index}: no {task_type} question in {_MAX_ATTEMPTS} tables")
    hidden = is_hidden(index)
    # v4 draws its wording and distractors after the table, so v2/v3 splits draw what they drew.
    wording = rng.choice(TRIGGERS[spec.trigger]) if spec.trigger else HIDDEN_DESCRIPTION
    extra = distractor_tables(spec, rng, table, task_words(table)) if spec.tables[1] > 1 else ()
    task = SynthTask(
        task_id=f"{split}-s{seed}-{index:05d}", split=split, index=index, type=task_type,
        question=question.text, add_description=describe(table, hidden, wording), table=table, label=(),
        answer_md5=None, source=f"synth:names:{question.template}", gold_sql=question.sql,
        domain="names", template=question.template, hidden=hidden, database=DATABASE, extra_tables=extra)
    return label_task(task, backend or SQLiteBackend())


def make_tasks(split: str, n: int, seed: int = 0) -> list[SynthTask]:
    """The first `n` tasks of (split, seed); deterministic and cached in memory."""
    return generated(make_task, split, n, seed)


def load_split(name: str, n: int | None = None, seed: int = 0) -> list[SynthTask]:
    return split_of_size(make_task, DEFAULT_SIZES, name, n, seed)
