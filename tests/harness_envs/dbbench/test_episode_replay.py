"""Gold replay through the real episode path: OracleAgent -> hsjax.rollout.engine.collect -> DBBenchEpisode
(base harness) -> backend -> evaluator, on SQLite and (when `mariadbd` is installed) MariaDB.

Known bad items, asserted exactly so that a regression or a silent fix shows:
- standard-0225 (UPDATE): the stored answer_md5 matches no replay of the gold statement on SQLite or
  MariaDB; the stored hash is probably wrong upstream.
- dev-0005 (counting), MariaDB only: a column with an empty name; MariaDB (like MySQL) refuses to create
  the table (error 1166), so the item cannot run upstream either. SQLite accepts it.
"""
import collections

import pytest

from harness_envs.dbbench.benchmark import KNOBS
from harness_envs.dbbench.agents import OracleAgent
from harness_envs.dbbench import make_backend
from harness_envs.dbbench.data import category, load_split
from harness_envs.dbbench.env import DBBenchEpisode
from hsjax.policies.base import SamplingParams
from hsjax.rollout.engine import collect

BASE = KNOBS.base()

KNOWN_BAD = {
    "sqlite": {"standard-0225": "stored hash wrong upstream"},
    "mariadb": {"standard-0225": "stored hash wrong upstream",
                "dev-0005": "empty column name: MariaDB/MySQL cannot create the table (1166)"},
}
FLOORS = {  # minimum solved per category of `standard` (100 items each)
    "sqlite": {"SELECT": 100, "INSERT": 98, "UPDATE": 98},
    "mariadb": {"SELECT": 100, "INSERT": 99, "UPDATE": 99},
}


def replay(split, backend):
    tasks = load_split(split)
    trajs = collect([DBBenchEpisode(t, BASE, backend) for t in tasks], OracleAgent(), SamplingParams(),
                    env_workers=4)
    return [tr.result for tr in trajs]


def check(kind, backend):
    std = replay("standard", backend)
    solved = collections.Counter(category(r["type"]) for r in std if r["success"])
    for cat, floor in FLOORS[kind].items():
        assert solved[cat] >= floor, (kind, cat, solved[cat])
    dev = replay("dev", backend)
    failed = {r["task_id"]: r["failure_mode"] for r in std + dev if not r["success"]}
    assert set(failed) == set(KNOWN_BAD[kind]), failed
    return std, dev, failed


def test_gold_replay_sqlite():
    backend = make_backend("sqlite")
    std, dev, failed = check("sqlite", backend)
    assert failed == {"standard-0225": "wrong_modification"}
    assert len(dev) == 60 and len(std) == 300
    # the oracle needs one reply per SELECT item and two per modification
    assert all(r["num_turns"] == (2 if r["type"] in ("INSERT", "UPDATE") else 1) for r in std + dev)


def _mariadb_available():
    try:
        from harness_envs.dbbench.mariadb_server import is_available
    except ImportError:
        return False
    return is_available()


@pytest.mark.skipif(not _mariadb_available(), reason="mariadbd is not installed (.ci/install_mariadb.sh installs it)")
def test_gold_replay_mariadb():
    backend = make_backend("mariadb")
    try:
        std, dev, failed = check("mariadb", backend)
    finally:
        backend.close()
    assert failed["standard-0225"] == "wrong_modification"
    assert failed["dev-0005"] == "env_error"  # the table cannot be created: a clean episode failure
