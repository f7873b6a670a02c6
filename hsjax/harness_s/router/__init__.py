"""Harness-S router: behavior profiles, LLM voters over HTTP, aggregation and re-anchoring."""
from hsjax.harness_s.router.profiles import Profiles, SiblingProfile
from hsjax.harness_s.router.router import (AGGREGATIONS, Decision, HarnessSRescuer, Router, aggregate, build_rescuer,
                                 combine, ranked)
from hsjax.harness_s.router.voters import (LLMVoter, VoteCache, VoteOutcome, VoteRequest, VoterSpec, parse_ranking,
                                 vote_all)

__all__ = ["AGGREGATIONS", "Decision", "HarnessSRescuer", "LLMVoter", "Profiles", "Router", "SiblingProfile",
           "VoteCache", "VoteOutcome", "VoteRequest", "VoterSpec", "aggregate", "build_rescuer", "combine",
           "parse_ranking", "ranked", "vote_all"]
