"""The testbed's lookup regimes, side by side: who plays which part (docs/testbed.md).

In each regime half of the tasks withhold a name the answer needs, a sibling's hint asks the policy
to look it up first (the behaviour that can transfer), and another sibling repairs a guess by showing
the name in its own observation (the negative control). `names` is the SQL regime (SHOW TABLES
finds a hidden table), `apis` the AppWorld-protocol regime (the app's API list finds a hidden API).
The warm start's SFT mix and the gates read the parts from here.
"""
from __future__ import annotations

import dataclasses
from types import ModuleType
from typing import Callable, Mapping

from harness_envs.synth import apis, apis_expert, names
from harness_envs.synth import expert as names_expert


@dataclasses.dataclass(frozen=True)
class LookupRoles:
    hint: str  # the sibling whose hint line asks for the lookup
    reminder: str  # the sibling whose observation shows the name after a failed guess
    look_up: str  # the expert style that looks the name up
    guess: str  # the expert style that guesses, gives up after a bare error, recovers under `reminder`
    expert: ModuleType  # the expert module (`acts_on_hidden_name`)
    opens: Callable  # opens(replies) -> whether an episode's first reply looks the name up
    metric: str  # the benchmark's slice metric of that opening (`hidden/<metric>`)
    label: str  # the opening's column title in tables


ROLES = {
    "names": LookupRoles("tables_first", "schema_reminder", "show_tables", "guess_table", names_expert,
                         names.opens_with_show_tables, "opens_show_tables", "SHOW TABLES first %"),
    "apis": LookupRoles("docs_first", "api_list", "docs_first", "guess_api", apis_expert,
                        apis.opens_with_docs, "opens_docs", "API list first %"),
}


def regime_of(config: Mapping) -> str:
    """The lookup regime (a key of ROLES) a run trains or is measured in, read off its config's
    benchmark (the `apis` arm modifier selects `synth_apis`; every other testbed config the SQL
    names regime)."""
    return "apis" if (config.get("benchmark") or {}).get("name") == "synth_apis" else "names"


def roles_of(config: Mapping) -> LookupRoles:
    """The roles of the run's regime (`regime_of`)."""
    return ROLES[regime_of(config)]
