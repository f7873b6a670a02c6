"""Local LLM voters the training run starts itself: OpenAI-compatible servers on 127.0.0.1.

    with start_local_voters(("rule", "tiny"), workdir=workdir) as local:
        voters = [*config_voters, *local.specs]      # VoterSpec field dicts

The train mode calls `start_for_run(config, workdir)`, which reads `config.router.local_voters`.
The router (`hsjax.harness_s.router`) only votes over HTTP: it starts no process and knows no model.

Kinds (each one `hsjax.llm.server.BackgroundServer` on an ephemeral port of 127.0.0.1):

    rule    `RuleVoterPolicy`: ranks by the profile cards' rescue rates (hsjax/harness_s/router/rule_voter.py)
    tiny    a random tiny model written with `write_tiny_model` (a smoke voter: its replies are
            counted, most likely as `malformed`)
    policy  the HF directory `policy_hf_dir` as it is on disk (the starting checkpoint; the served
            copy does not follow training)

Voter names are fixed per kind (`local-rule`, `local-tiny`, `local-policy`): the router keys its
per-voter records and pending decisions by name, and those are checkpointed, while the port
changes with every start. Nothing the router checkpoints holds a URL; only its in-memory vote
cache does, so after a restart it simply asks again.
"""
from __future__ import annotations

import logging
import pathlib
import shutil
import tempfile
from typing import Sequence

from hsjax import builders
from hsjax.harness_s.router.rule_voter import RuleVoterPolicy
from hsjax.infra import paths
from hsjax.infra.errors import UserError
from hsjax.llm.server import BackgroundServer, build_app
from hsjax.models.tiny import write_tiny_model
from hsjax.policies.jax_policy import JaxPolicy

log = logging.getLogger(__name__)

KINDS = ("rule", "tiny", "policy")
VOTER_NAMES = {"rule": "local-rule", "tiny": "local-tiny", "policy": "local-policy"}
MODEL_NAMES = {"rule": "rule-voter", "tiny": "tiny-random", "policy": "policy"}
# Reply budgets: the rule voter's answer is a short JSON line whatever it is allowed; the tiny
# model's text is noise, so a short budget keeps its decode (and the decision) quick.
MAX_TOKENS = {"rule": 256, "tiny": 32, "policy": 256}


def _parse_kinds(kinds: Sequence[str] | str) -> list[str]:
    if isinstance(kinds, str):  # a command-line override such as --config.router.local_voters=rule,tiny
        kinds = [k for k in kinds.split(",") if k.strip()]
    kinds = [str(k).strip() for k in kinds]
    unknown = [k for k in kinds if k not in KINDS]
    if unknown:
        raise ValueError(f"local voter kinds {unknown} are unknown; choose from {list(KINDS)}")
    if len(set(kinds)) != len(kinds):
        raise ValueError(f"local voter kinds {kinds} repeat a kind; each kind is one voter")
    return kinds


class LocalVoters:
    """The started servers and their voter specs. `close()` stops them (idempotent); a context manager."""

    def __init__(self, timeout_s: float, max_retries: int = 1):
        self.timeout_s, self.max_retries = float(timeout_s), int(max_retries)
        self._servers: dict[str, object] = {}  # kind -> BackgroundServer, in start order
        self._tmpdir: str | None = None
        self.closed = False

    def _add(self, kind: str, server) -> None:
        self._servers[kind] = server
        log.info("local voter %s (%s) at %s", VOTER_NAMES[kind], MODEL_NAMES[kind], server.base_url)

    @property
    def kinds(self) -> list[str]:
        return list(self._servers)

    @property
    def names(self) -> list[str]:
        return [VOTER_NAMES[k] for k in self._servers]

    @property
    def servers(self) -> dict[str, object]:
        """BackgroundServers by voter name (each has `.base_url`, `.host`, `.port`)."""
        return {VOTER_NAMES[k]: s for k, s in self._servers.items()}

    @property
    def specs(self) -> list[dict]:
        """`VoterSpec` field dicts, ready for `Router(voters=[VoterSpec(**s) ...])` or
        `config.router.voters`-style lists."""
        if self.closed:
            raise RuntimeError("these local voters are closed; start new ones with start_local_voters")
        return [{"name": VOTER_NAMES[k], "base_url": s.base_url, "model": MODEL_NAMES[k],
                 "timeout_s": self.timeout_s, "max_retries": self.max_retries,
                 "max_tokens": MAX_TOKENS[k], "temperature": 0.0}
                for k, s in self._servers.items()]

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for kind, server in reversed(list(self._servers.items())):
            try:
                server.close()
            except Exception:  # the others must still be stopped
                log.exception("local voter %s did not close cleanly", VOTER_NAMES[kind])
        if self._tmpdir is not None:
            shutil.rmtree(self._tmpdir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        state = "closed" if self.closed else ", ".join(f"{VOTER_NAMES[k]}@{s.base_url}"
                                                       for k, s in self._servers.items())
        return f"LocalVoters({state})"


def _model_dir(voters: LocalVoters, workdir) -> pathlib.Path:
    if workdir is not None:
        return pathlib.Path(workdir) / "voters" / "tiny_model"
    voters._tmpdir = tempfile.mkdtemp(prefix="hsjax_voters_")
    return pathlib.Path(voters._tmpdir) / "tiny_model"


def _start(kind: str, voters: LocalVoters, *, workdir, policy_hf_dir, seed: int):
    if kind == "rule":
        return BackgroundServer(build_app(RuleVoterPolicy(), MODEL_NAMES[kind]))
    if kind == "tiny":
        hf_dir = write_tiny_model(_model_dir(voters, workdir), seed=seed)
    else:
        hf_dir = pathlib.Path(policy_hf_dir)
        if not (hf_dir / "config.json").is_file():
            raise FileNotFoundError(f"local voter 'policy': {hf_dir} is not an HF directory (no "
                                    "config.json); pass policy_hf_dir=<the model's HF directory>")
    policy = JaxPolicy.from_pretrained(str(hf_dir), seed=seed)
    return BackgroundServer(build_app(policy, MODEL_NAMES[kind]))


def start_local_voters(kinds: Sequence[str] | str, *, workdir=None, policy_hf_dir=None, seed: int = 0,
                       timeout_s: float = 30.0) -> LocalVoters:
    """Starts one server per kind (`rule`, `tiny`, `policy`; module doc) on 127.0.0.1.

    The tiny model is written to `<workdir>/voters/tiny_model` (or a temporary directory removed
    on close). If any server fails to start, those already started are stopped and the error is
    raised. No kinds gives an empty `LocalVoters`.
    """
    kinds = _parse_kinds(kinds)
    if "policy" in kinds and not policy_hf_dir:
        raise ValueError("local voter 'policy' serves an HF directory: pass policy_hf_dir "
                         "(e.g. config.model.hf_dir), or drop 'policy' from the kinds")
    if timeout_s <= 0:
        raise ValueError(f"start_local_voters timeout_s={timeout_s}: must be > 0")
    voters = LocalVoters(timeout_s)
    try:
        for kind in kinds:
            voters._add(kind, _start(kind, voters, workdir=workdir, policy_hf_dir=policy_hf_dir,
                                     seed=seed))
    except BaseException:
        voters.close()
        raise
    return voters


def start_for_run(config, workdir: str, *, start: bool = True) -> LocalVoters:
    """Starts the voter servers a Harness-S run asks for (`config.router.local_voters`); none when
    `start` is false (the processes of a multi-process run that make no router decisions)."""
    kinds = config.router.local_voters if config.rescue.kind == "harness_s" and "router" in config else ()
    if not kinds or not start:
        return start_local_voters(())
    hf_dir = str(paths.resolve(config.model.hf_dir)) if config.model.hf_dir else None
    if "policy" in kinds and hf_dir and not builders.is_hf_dir(pathlib.Path(hf_dir)):
        raise UserError(f"router.local_voters 'policy' serves model.hf_dir as an HF directory, and "
                        f"{config.model.hf_dir!r} is not one; export it first (run.py mode export, docs/models.md)")
    return start_local_voters(kinds, workdir=workdir, policy_hf_dir=hf_dir, seed=config.seed,
                              timeout_s=config.router.local_timeout_s)
