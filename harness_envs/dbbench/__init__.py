"""DBBench (AgentBench's database task): data, database backends and the evaluator."""
from harness_envs.dbbench.backend_kinds import BACKEND_KINDS, make_backend
from harness_envs.dbbench.backends import Backend, EpisodeDB, ExecResult, Limits, TableLoadError
from harness_envs.dbbench.data import (
    MODIFY_TYPES,
    SELECT_TYPES,
    DBTask,
    Table,
    is_modification,
    load_split,
)
from harness_envs.dbbench.evaluator import is_correct, summarize

__all__ = [
    "BACKEND_KINDS", "Backend", "EpisodeDB", "ExecResult", "Limits", "TableLoadError", "make_backend",
    "MODIFY_TYPES", "SELECT_TYPES", "DBTask", "Table", "is_modification", "load_split",
    "is_correct", "summarize",
]
