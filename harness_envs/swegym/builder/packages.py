"""The packages the offline SWE-Gym instances are made from: exact sdists from PyPI, pinned by sha256.

Chosen for: a permissive licence (MIT or BSD), an sdist that ships its test suite, a pure-Python
package with no runtime dependency and no test dependency beyond pytest, and a suite that passes on
Python 3.11 in seconds (the builder runs it once per mutation candidate). `tests`: the tests that
pass twice on the pristine tree and have shell-safe ids (the builder's universe); `suite`: one plain
`pytest -q` of the whole suite here (pytest 8.3.5, Python 3.11, one core):

| package    | version | licence | tests | suite | split |
|------------|---------|---------|-------|-------|-------|
| toolz      | 1.2.0   | BSD-3   |   192 | 0.8 s | train |
| cachetools | 8.0.2   | MIT     |   476 | 1.2 s | train |
| inflection | 0.5.1   | MIT     |   407 | 0.4 s | train |
| boltons    | 26.2.0  | BSD-3   |   468 | 2.9 s | train |
| tabulate   | 0.10.0  | MIT     |   280 | 1.4 s | train |
| sqlparse   | 0.6.1   | BSD-3   |   336 | 3.6 s | train |
| isodate    | 0.7.2   | BSD-3   |   230 | 0.3 s | test  |
| xmltodict  | 1.0.4   | MIT     |   119 | 0.9 s | test  |

Split by repository: `isodate` and `xmltodict` are held out (`split="test"`), so no test
repository's code is ever trained on; the benchmark's split names are `train` and `test`.

Looked at and left out: more-itertools (a 23 s suite, 12 s of it one prime test), humanize
(freezegun), python-slugify (text-unidecode), parse and semver (coverage options in their pytest
configuration that the scorer's plain pytest line would trip on), jmespath (its tests do not
collect from the sdist), sortedcontainers and wcwidth (no Python tests in the sdist), funcy
(collection errors), bidict (its sdist needs build dependencies to download).

Fields: `source` are the directories or files (tree-relative) whose functions are mutated, minus
`exclude` prefixes; `tests` what pytest runs for the whole suite; `pythonpath` the import root
("" = the tree, "src" for src layouts; becomes `instance.extra["pythonpath"]`); `import_name` the
top-level module a base tree must import.
"""
from __future__ import annotations

import dataclasses

PYTEST_PIN = "pytest==8.3.5"
SPLITS = ("train", "test")


@dataclasses.dataclass(frozen=True)
class Package:
    name: str
    version: str
    sha256: str
    licence: str
    sdist: str
    import_name: str
    source: tuple[str, ...]
    tests: tuple[str, ...]
    split: str
    pythonpath: str = ""
    exclude: tuple[str, ...] = ()
    test_deps: tuple[str, ...] = ()

    @property
    def key(self) -> str:
        """The cache's name: `pypi__<name>` (`repos/<key>.git`, `venvs/<key>`)."""
        return f"pypi__{self.name}"

    @property
    def repo(self) -> str:
        return f"pypi/{self.name}"

    @property
    def requirement(self) -> str:
        return f"{self.name}=={self.version}"

    @property
    def root(self) -> str:
        """The top directory inside the sdist archive."""
        return self.sdist.removesuffix(".tar.gz")


PACKAGES: tuple[Package, ...] = (
    Package("toolz", "1.2.0", "9667a038e9d6ecba37995e26cb2f59ec6420b6ad8dd9677de59db9b956b08490", "BSD-3-Clause",
            "toolz-1.2.0.tar.gz", "toolz", source=("toolz",), tests=("toolz/tests", "toolz/sandbox/tests"),
            split="train", exclude=("toolz/tests", "toolz/sandbox/tests")),
    Package("cachetools", "8.0.2", "30ac523adfc118b51d2b2e7bad8a0ddb31370dfe2700c7f10ca224f36ccf81e0", "MIT",
            "cachetools-8.0.2.tar.gz", "cachetools", source=("src/cachetools",), tests=("tests",), split="train",
            pythonpath="src"),
    Package("inflection", "0.5.1", "1a29730d366e996aaacffb2f1f1cb9593dc38e2ddd30c91250c6dde09ea9b417", "MIT",
            "inflection-0.5.1.tar.gz", "inflection", source=("inflection",), tests=("test_inflection.py",),
            split="train"),
    Package("boltons", "26.2.0", "d39cfd15c1a1c3bd4d705c82252fa9edb8e4f5e8cc039f8e39afac7b1b47e92c", "BSD-3-Clause",
            "boltons-26.2.0.tar.gz", "boltons", source=("boltons",), tests=("tests",), split="train"),
    Package("tabulate", "0.10.0", "e2cfde8f79420f6deeffdeda9aaec3b6bc5abce947655d17ac662b126e48a60d", "MIT",
            "tabulate-0.10.0.tar.gz", "tabulate", source=("tabulate",), tests=("test",), split="train"),
    Package("sqlparse", "0.6.1", "ca722573f848ff2d30e40ea30f53a104b7dea7635ea9285891263eb2c58fb6e7", "BSD-3-Clause",
            "sqlparse-0.6.1.tar.gz", "sqlparse", source=("sqlparse",), tests=("tests",), split="train"),
    Package("isodate", "0.7.2", "4cd1aa0f43ca76f4a6c6c0292a85f40b35ec2e43e315b59f06e6d32171a953e6", "BSD-3-Clause",
            "isodate-0.7.2.tar.gz", "isodate", source=("src/isodate",), tests=("tests",), split="test",
            pythonpath="src"),
    Package("xmltodict", "1.0.4", "6d94c9f834dd9e44514162799d344d815a3a4faec913717a9ecbfa5be1bb8e61", "MIT",
            "xmltodict-1.0.4.tar.gz", "xmltodict", source=("xmltodict.py",), tests=("tests",), split="test"),
)

BY_NAME = {p.name: p for p in PACKAGES}


def select(names: str | list[str] | None) -> list[Package]:
    """The packages named (comma-separated or a list), in PACKAGES order; all when None or empty."""
    if not names:
        return list(PACKAGES)
    wanted = [n.strip() for n in (names.split(",") if isinstance(names, str) else names) if n.strip()]
    unknown = [n for n in wanted if n not in BY_NAME]
    if unknown:
        raise ValueError(f"unknown package(s) {unknown}; known: {', '.join(BY_NAME)}")
    return [p for p in PACKAGES if p.name in wanted]
