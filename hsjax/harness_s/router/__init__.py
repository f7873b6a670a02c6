"""Harness-S router: behavior profiles, LLM voters over HTTP, aggregation and re-anchoring."""
from hsjax.harness_s.router.aggregation import AGGREGATIONS, aggregate, combine, ranked
from hsjax.harness_s.router.profiles import Profiles, SiblingProfile
from hsjax.harness_s.router.rescuer import HarnessSRescuer
from hsjax.harness_s.router.router import Decision, Router
from hsjax.harness_s.router.voters import (LLMVoter, VoteCache, VoteOutcome, VoteRequest, VoterSpec, parse_ranking,
                                           vote_all)

__all__ = ["AGGREGATIONS", "Decision", "HarnessSRescuer", "LLMVoter", "Profiles", "Router", "SiblingProfile",
           "VoteCache", "VoteOutcome", "VoteRequest", "VoterSpec", "aggregate", "combine", "parse_ranking",
           "ranked", "vote_all"]
