"""SFT mode: streams laid out as the rollout engine lays them out, an exact shared-prefix loss, and a
short run that lowers the loss and writes a loadable HF directory."""
import json
import os
import signal

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from harness_envs.dbbench.benchmark import KNOBS
from harness_envs.dbbench.env import DBBenchEpisode
from harness_envs.dbbench.sqlite_backend import SQLiteBackend
from harness_envs.synth.expert import ScriptedExpert
from harness_envs.synth.tasks import by_type, make_tasks
from harness_envs.synth.benchmark import Synth
from hsjax import builders
from hsjax.infra import checkpoint as ckpt_lib
from hsjax.infra.checkpoint import load_params
from hsjax.infra.errors import UserError
from hsjax.policies.base import SamplingParams
from hsjax.policies.recording import RecordingChatPolicy
from hsjax.policies.scripted import ScriptedTokenPolicy
from hsjax.rl import sft as sft_math
from hsjax.rollout.segments import render_segments
from studies.testbed import sft_data
from studies.testbed import warmstart as sft
from hsjax.models import forward, get_preset, init_params, load_pretrained
from hsjax.models.tokenizer import build_tiny_tokenizer
from hsjax.rollout.engine import collect

from experiments import testbed
from tests.rollout.test_runner import FlakyEnvironments

BASE = KNOBS.base()


@pytest.fixture(scope="module")
def tokenizer():
    return build_tiny_tokenizer()


@pytest.fixture(scope="module")
def expert_run(tokenizer):
    """Expert conversations in all three styles (the premature one has three turns)."""
    tasks = by_type(make_tasks("synth_train", 40, seed=5), 1)
    styles = {"counting": "format_slip", "UPDATE": "format_slip", "other": "premature_answer",
              "INSERT": "premature_answer"}
    harness = {"format_slip": "lenient_parse", "premature_answer": "verify_answer"}
    pool = {"base": BASE, "lenient_parse": BASE.with_knobs(name="lenient_parse", parse_mode="lenient"),
            "verify_answer": BASE.with_knobs(name="verify_answer", verify_before_answer=True)}
    backend = SQLiteBackend()
    episodes = [DBBenchEpisode(t, pool[harness.get(styles.get(t.type), "base")], backend) for t in tasks]
    recorder = RecordingChatPolicy(ScriptedExpert(styles))
    trajs = collect(episodes, recorder, SamplingParams())
    assert all(t.result["success"] for t in trajs)
    eos = sft_data.end_of_turn_id(tokenizer)
    segments = [render_segments(tokenizer, recorder.turns[ep.info["episode_id"]], eos) for ep in episodes]
    return tasks, pool, styles, harness, recorder, episodes, segments


def test_streams_equal_the_rollout_engine_streams(tokenizer, expert_run):
    tasks, pool, styles, harness, recorder, episodes, segments = expert_run
    replies = {}  # prompt ids -> reply ids, read off the rendered streams
    for segs in segments:
        for seg in segs:
            starts = np.nonzero(np.diff(np.r_[0, seg.loss_mask]) == 1)[0]
            ends = np.nonzero(np.diff(np.r_[seg.loss_mask, 0]) == -1)[0] + 1
            for s, e in zip(starts, ends):
                replies[tuple(seg.tokens[:s].tolist())] = seg.tokens[s:e].tolist()
    policy = ScriptedTokenPolicy(lambda prompt: replies[tuple(prompt)], tokenizer=tokenizer,
                                 eos_id=sft_data.end_of_turn_id(tokenizer))
    backend = SQLiteBackend()
    again = [DBBenchEpisode(ep.task, ep.spec, backend) for ep in episodes]
    trajs = collect(again, policy, SamplingParams(max_new_tokens=256))
    assert all(t.result["success"] for t in trajs)
    for traj, segs in zip(trajs, segments):
        assert len(traj.segments) == len(segs) == 1
        np.testing.assert_array_equal(traj.segments[0].tokens, segs[0].tokens)
        np.testing.assert_array_equal(traj.segments[0].loss_mask, segs[0].loss_mask)


def test_loss_mask_covers_exactly_the_replies(tokenizer, expert_run):
    *_, recorder, episodes, segments = expert_run
    for ep, segs in zip(episodes, segments):
        (seg,) = segs
        replies = [reply for _, reply in recorder.turns[ep.info["episode_id"]]]
        trained = tokenizer.decode(seg.tokens[seg.loss_mask == 1].tolist(), skip_special_tokens=False)
        assert trained == "".join(r + "<|im_end|>" for r in replies)
        untrained = tokenizer.decode(seg.tokens[seg.loss_mask == 0].tolist(), skip_special_tokens=False)
        assert "Ok." in untrained and ep.task.question in untrained  # prompt tokens: mask 0
    assert {len(recorder.turns[ep.info["episode_id"]]) for ep in episodes} == {2, 3}


def test_shared_prefix_loss_equals_full_rows(tokenizer, expert_run):
    segments = [s for segs in expert_run[-1] for s in segs][:3]
    cfg = get_preset("tiny", vocab_size=len(tokenizer), num_layers=1)
    params = init_params(cfg, jax.random.PRNGKey(0))
    shared = sft_math.pack(segments, pad_id=0)
    assert len(shared.prefix_P) > 400  # the instruction
    full = sft_math.SFTData(shared.prefix_P[:0], *_unshare(shared))

    def loss(data, p):
        total, count = sft_math.sft_loss(p, jnp.asarray(data.prefix_P), jnp.asarray(data.tokens_NxU),
                                    jnp.asarray(data.mask_NxU), jnp.asarray(data.length_N), cfg=cfg)
        return total / count

    # jit: op by op, the backward pass dispatched (and compiled) hundreds of small programs
    a, ga = jax.jit(jax.value_and_grad(lambda p: loss(shared, p)))(params)
    b, gb = jax.jit(jax.value_and_grad(lambda p: loss(full, p)))(params)
    np.testing.assert_allclose(a, b, rtol=1e-5)
    for x, y in zip(jax.tree.leaves(ga), jax.tree.leaves(gb)):
        np.testing.assert_allclose(x, y, rtol=2e-3, atol=2e-6)


def _unshare(data):
    p, n = len(data.prefix_P), len(data.length_N)
    tokens = np.zeros((n, p + data.tokens_NxU.shape[1]), np.int32)
    mask = np.zeros_like(tokens)
    tokens[:, :p], tokens[:, p:], mask[:, p:] = data.prefix_P, data.tokens_NxU, data.mask_NxU
    return tokens, mask, data.length_N + p


def test_regime_plan_rejects_overlap():
    c = testbed.get_config("sft")
    c.regime.families_b = ("other",)
    with pytest.raises(ValueError, match="both"):
        sft_data.regime_plan(c)
    assert sft_data.regime_plan(testbed.get_config("sft"))["UPDATE"] == ("schema_recovery", "schema_reminder")
    assert sft_data.regime_plan(testbed.get_config("sft,format_slip"))["UPDATE"] == ("format_slip", "lenient_parse")


def test_schema_recovery_regime_demonstrates_giving_up_under_base(tokenizer):
    """Families B run under schema_reminder (recovering) and, for a stable share, under the base
    harness (the expert gives up after the bare error); both kinds become streams."""
    c = testbed.get_config("sft")
    tasks = [t for t in make_tasks("synth_train", 200, seed=0) if t.type in c.regime.families_b][:40]
    plan = sft_data.regime_plan(c)
    harnesses = [sft_data.episode_harness(t, plan, c) for t in tasks]
    assert harnesses == [sft_data.episode_harness(t, plan, c) for t in tasks]  # stable
    share = harnesses.count("base") / len(harnesses)
    assert 0.3 < share < 0.7 and set(harnesses) == {"base", "schema_reminder"}
    bench = Synth()
    pool = bench.load_pool()
    jobs = sft_data.sft_jobs(tasks, c)
    assert [h for _, h, _ in jobs] == harnesses
    segments, records = sft_data.expert_streams(jobs, pool, tokenizer, c, bench)
    assert [r["harness"] for r in records] == harnesses and len(segments) == len(tasks)
    assert {r["style"] for r in records} == {"schema_recovery"}
    with c.unlocked():
        c.regime.b_base_share = 0.0
    assert {sft_data.episode_harness(t, plan, c) for t in tasks} == {"schema_reminder"}


def test_short_run_lowers_loss_and_saves_a_loadable_model(tmp_path, tokenizer):
    c = testbed.get_config("sft,smoke")
    c.model.overrides.num_layers = 1
    c.sft.steps = 12
    c.sft.batch_size = 4
    c.sft.num_tasks = 8  # the same few streams again and again: the loss must fall
    c.optim.learning_rate = 1e-2
    c.eval.harnesses = ("base",)
    c.eval.max_new_tokens = 8
    workdir = str(tmp_path)
    out = sft.main(c, workdir)

    rows = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
    assert [r["step"] for r in rows] == list(range(1, 13))
    assert all("loss/sft" in r for r in rows)
    assert rows[-1]["loss/sft"] < 0.7 * rows[0]["loss/sft"]

    cfg, params, tok = load_pretrained(os.path.join(workdir, "hf"))
    assert tok.get_vocab() == tokenizer.get_vocab()
    saved = load_params(workdir)
    tokens = jnp.asarray([tokenizer.encode("Action: Operation\nSELECT 1")], jnp.int32)
    pos = jnp.arange(tokens.shape[1])[None]
    a, _ = forward(cfg, params, tokens, pos)
    b, _ = forward(cfg, saved, tokens, pos)
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # The SFT workdir itself is a checkpoint path: the preset with the run's overrides, its tokenizer.
    w_cfg, w_params, w_tok, _ = builders.load_model(workdir)
    assert w_cfg.num_layers == 1 and w_tok.get_vocab() == tokenizer.get_vocab()
    c2, _ = forward(w_cfg, w_params, tokens, pos)
    np.testing.assert_array_equal(np.asarray(a), np.asarray(c2))

    ev = json.load(open(os.path.join(workdir, "eval", "sft.json")))
    assert set(ev["summary"]) == {"synth_heldout/greedy", "synth_train/greedy"}
    assert set(ev["summary"]["synth_heldout/greedy"]["base"]["by_type"]) == set(testbed.FAMILIES_A + testbed.FAMILIES_B)
    assert out["sft"]["steps"] == 12


class _Killed(Exception):
    pass


def _tiny_sft_config():
    c = testbed.get_config("sft,smoke")
    c.model.overrides.num_layers = 1
    c.sft.steps = 6
    c.sft.batch_size = 4
    c.sft.num_tasks = 12
    c.sft.save_every = 2
    c.eval.per_type = 0  # no eval: this test is about the loop
    return c


def test_a_run_killed_mid_loop_resumes_exactly(tmp_path, monkeypatch):
    """Killed after step 3 (last checkpoint: step 2), or sent SIGTERM in step 3, the same command
    finishes with the params and metrics of an uninterrupted run: optimizer state and batch stream
    are restored, not restarted."""
    whole = str(tmp_path / "whole")
    sft.main(_tiny_sft_config(), whole)

    resumed = str(tmp_path / "resumed")
    real_step = sft.make_train_step

    def dying_train_step(cfg, tx):
        step_fn, calls = real_step(cfg, tx), []

        def step(*args):
            if len(calls) == 3:
                raise _Killed
            calls.append(1)
            return step_fn(*args)
        return step

    monkeypatch.setattr(sft, "make_train_step", dying_train_step)
    with pytest.raises(_Killed):
        sft.main(_tiny_sft_config(), resumed)
    monkeypatch.setattr(sft, "make_train_step", real_step)
    assert ckpt_lib.Checkpointer(resumed, read_only=True).all_steps() == [2]
    sft.main(_tiny_sft_config(), resumed)

    # SIGTERM during step 3 (a scheduler ending the job): step 3 finishes, is saved though
    # save_every is 2, and the run ends with exit status 143; the same command resumes from it.
    termed = str(tmp_path / "termed")

    def signalled_train_step(cfg, tx):
        step_fn, calls = real_step(cfg, tx), []

        def step(*args):
            if len(calls) == 2:
                os.kill(os.getpid(), signal.SIGTERM)
            calls.append(1)
            return step_fn(*args)
        return step

    monkeypatch.setattr(sft, "make_train_step", signalled_train_step)
    handler = signal.getsignal(signal.SIGTERM)
    with pytest.raises(SystemExit) as stopped:
        sft.main(_tiny_sft_config(), termed)
    assert stopped.value.code == 143 and stopped.value.step == 3
    assert signal.getsignal(signal.SIGTERM) == handler  # the loop's handler is gone with it
    monkeypatch.setattr(sft, "make_train_step", real_step)
    assert ckpt_lib.Checkpointer(termed, read_only=True).all_steps() == [3]
    sft.main(_tiny_sft_config(), termed)

    rows = lambda w: [json.loads(line) for line in open(os.path.join(w, "metrics.jsonl"))]
    for other in (resumed, termed):
        assert [r["step"] for r in rows(other)] == [r["step"] for r in rows(whole)]
        assert [r["loss/sft"] for r in rows(other)] == [r["loss/sft"] for r in rows(whole)]
        a, b = load_params(whole), load_params(other)
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
            np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_resuming_with_other_sft_data_is_refused(tmp_path):
    workdir = str(tmp_path)
    c = _tiny_sft_config()
    c.sft.steps = 2
    sft.main(c, workdir)
    c = _tiny_sft_config()
    c.sft.num_tasks = 16
    with pytest.raises(UserError, match="fresh --workdir"):
        sft.main(c, workdir)


class _Bar:
    """A progress bar that keeps its count and total (tqdm's interface as the runner uses it)."""
    made = []

    def __init__(self, total, **kwargs):
        self.total, self.n = total, 0
        self.made.append(self)

    def update(self, n):
        self.n += n

    def close(self):
        pass


def test_expert_streams_re_roll_an_environment_failure_and_name_one_that_persists(tokenizer, monkeypatch):
    c = testbed.get_config("sft")
    tasks = make_tasks("synth_train", 6, seed=0)
    jobs = sft_data.sft_jobs(tasks, c)
    bench = Synth()
    pool = bench.load_pool()
    clean, _ = sft_data.expert_streams(jobs, pool, tokenizer, c, bench)
    flaky = FlakyEnvironments(bench, sft_data.ENV_RETRIES)
    monkeypatch.setattr(sft_data.tqdm, "tqdm", _Bar)
    segments, records = sft_data.expert_streams(jobs, pool, tokenizer, c, flaky)
    assert set(flaky.opened.values()) == {sft_data.ENV_RETRIES + 1}
    # The bar counts every episode it ran, the re-rolls too, and ends full.
    bar = _Bar.made[-1]
    assert bar.n == bar.total == len(jobs) * (sft_data.ENV_RETRIES + 1)
    assert len(segments) == len(clean) and all(np.array_equal(a.tokens, b.tokens) for a, b in zip(segments, clean))
    with pytest.raises(RuntimeError, match="env_error: .*the sandbox did not start"):
        sft_data.expert_streams(jobs, pool, tokenizer, c, FlakyEnvironments(bench, sft_data.ENV_RETRIES + 1))


def test_expert_streams_open_at_most_a_bounded_batch_of_episodes_and_do_not_depend_on_it(tokenizer, monkeypatch):
    """A sandboxed episode holds one of 4,096 uids while open: the expert's episodes go in bounded
    batches, and the streams are those of one batch."""
    from hsjax.rollout import runner as runner_lib
    c = testbed.get_config("sft")
    jobs = sft_data.sft_jobs(make_tasks("synth_train", 10, seed=0), c)
    bench = Synth()
    pool = bench.load_pool()
    monkeypatch.setattr(sft_data, "EXPERT_BATCH", len(jobs))
    whole, _ = sft_data.expert_streams(jobs, pool, tokenizer, c, bench)
    sizes, collect = [], runner_lib.engine.collect
    monkeypatch.setattr(runner_lib.engine, "collect", lambda episodes, *a, **k: sizes.append(len(episodes))
                        or collect(episodes, *a, **k))
    monkeypatch.setattr(sft_data, "EXPERT_BATCH", 3)
    batched, _ = sft_data.expert_streams(jobs, pool, tokenizer, c, bench)
    assert max(sizes) == 3 and sum(sizes) == len(jobs)
    assert len(batched) == len(whole) and all(np.array_equal(a.tokens, b.tokens) for a, b in zip(batched, whole))


def test_a_resumed_warm_start_reads_its_expert_streams_instead_of_rolling_out_again(tmp_path, tokenizer):
    c = testbed.get_config("sft")
    tasks = make_tasks("synth_train", 8, seed=0)
    bench = Synth()
    pool = bench.load_pool()
    jobs = sft_data.sft_jobs(tasks, c)
    first, records = sft_data.cached_expert_streams(jobs, pool, tokenizer, c, bench, str(tmp_path))
    assert (tmp_path / sft_data.STREAMS_FILE).exists()
    # A benchmark whose environment never opens: the streams can only come from the file.
    again, records_again = sft_data.cached_expert_streams(jobs, pool, tokenizer, c, FlakyEnvironments(bench, 99),
                                                     str(tmp_path))
    assert records_again == records and len(again) == len(first)
    for a, b in zip(again, first):
        assert np.array_equal(a.tokens, b.tokens) and np.array_equal(a.loss_mask, b.loss_mask)
        assert a.tokens.dtype == b.tokens.dtype and a.loss_mask.dtype == b.loss_mask.dtype
        assert not a.logprobs.any() and not b.logprobs.any()
    # Other jobs make other streams: the file is not read for them.
    with pytest.raises(RuntimeError, match="the sandbox did not start"):
        sft_data.cached_expert_streams(jobs[:-1], pool, tokenizer, c, FlakyEnvironments(bench, 99), str(tmp_path))
