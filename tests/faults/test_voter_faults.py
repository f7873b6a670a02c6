"""LLM voters against hostile endpoints: a decision is bounded by the voters' worst case, a brace
bomb costs no CPU to speak of, and abandoned voter threads never hold up the process's exit."""
import pathlib
import subprocess
import sys
import textwrap
import time

from hsjax.harness_s.router.voters import LLMVoter, VoteRequest, VoterSpec, default_deadline_s, vote_all
from tests.fake_openai import completion
from tests.faults.hostile import drip, hostile, status  # noqa: F401 (hostile: a fixture)

REPO = pathlib.Path(__file__).resolve().parents[2]
REQUEST = VoteRequest(task={"task_id": "t1", "type": "select", "question": "q?"}, group_summary="all failed",
                      cards={"a": "card a", "b": "card b"}, candidates=("a", "b"))


def vote(server, **spec):
    voter = LLMVoter(VoterSpec(name="v", base_url=server.base_url, model="m", **spec))
    try:
        return vote_all([voter], REQUEST)
    finally:
        voter.close()


def test_a_dripping_voter_times_out_by_itself_within_its_worst_case(hostile):
    server = hostile(drip(completion('{"ranking": ["a"]}'), every_s=0.1))
    spec = dict(timeout_s=0.5, max_retries=1, backoff_s=0.01, max_backoff_s=0.1)
    out = vote(server, **spec)
    (result,) = out.results.values()
    # The voter's own attempts time out (2 of them), well before the decision deadline.
    assert (result.status, result.attempts) == ("timeout", 2), result
    worst = VoterSpec(name="v", base_url="http://x/v1", model="m", **spec).client_settings().worst_case_s
    assert result.latency_s <= worst + 0.5 and out.latency_s < default_deadline_s([VoterSpec(
        name="v", base_url="http://x/v1", model="m", **spec)])


def test_a_brace_bomb_reply_is_dropped_quickly(hostile):
    # 3 MB of "{" inside the reply: read (under 4 MiB), then JSON extraction gives up in bounded time.
    server = hostile(status(200, completion("{" * 3_000_000)))
    t0 = time.monotonic()
    out = vote(server, timeout_s=10.0)
    assert out.failures == {"v": "malformed"} and time.monotonic() - t0 < 3
    # 5 MB: past max_reply_bytes, never read whole.
    server = hostile(status(200, completion("{" * 5_000_000)))
    out = vote(server, timeout_s=10.0)
    assert out.failures == {"v": "too_large"} and out.results["v"].attempts == 1


SCRIPT = textwrap.dedent("""
    import sys, time
    from hsjax.harness_s.router.voters import LLMVoter, VoteRequest, VoterSpec, vote_all
    from tests.faults.hostile import Hostile, never

    server = Hostile(never())
    voters = [LLMVoter(VoterSpec(name=f"v{i}", base_url=server.base_url, model="m", timeout_s=60.0))
              for i in range(3)]
    request = VoteRequest(task={"task_id": "t"}, group_summary="", cards={}, candidates=("a",))
    out = vote_all(voters, request, deadline_s=0.3)
    print(sorted(out.failures.values()), flush=True)
""")


def test_abandoned_voters_never_hold_up_exit():
    """The servers never answer and each voter would wait 60 s; the process exits as soon as its
    main thread is done (ThreadPoolExecutor's workers would be joined at exit: a minute)."""
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT], cwd=REPO, stdout=subprocess.PIPE, text=True,
                            env={"PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu", "PATH": "/usr/bin:/bin"})
    try:
        line = proc.stdout.readline()  # after the imports and the 0.3 s decision
        t0 = time.monotonic()
        rc = proc.wait(timeout=40)
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert line.strip() == "['timeout', 'timeout', 'timeout']" and rc == 0
    # The defect is a wait of 60 s (a voter's time-out); an interpreter's teardown on a loaded
    # two-core CI machine took 2.2 s once, so the bound leaves room for load, not for a voter.
    assert took < 20.0, took
