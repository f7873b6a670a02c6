"""The SWE-Gym benchmark class: options and their errors, splits of both backends, the scores, the
config keys run.py checks, and (on the built offline cache, when there is one) the oracle resolving
every offline instance under the base harness."""
import json

import pytest

from harness_envs.registry import make_benchmark
from harness_envs.swegym import evaluator
from harness_envs.swegym.benchmark import SWEGym
from hsjax import builders
from hsjax.infra import experiments
from hsjax.policies.base import SamplingParams
from hsjax.rollout.runner import EpisodeRunner, Job
from tests.harness_envs.swegym.tiny_cache import built_cache_or_skip, make_cache


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return make_cache(tmp_path_factory.mktemp("swegym_cache"))


def test_options_and_their_errors(tmp_path):
    assert SWEGym().backend.kind == "offline" and SWEGym().backend.runtime == "local"  # nothing read from disk yet
    with pytest.raises(ValueError, match=r"unknown swegym backend option\(s\) \['cache'\]"):
        SWEGym(backend={"cache": "x"})
    with pytest.raises(ValueError, match="kind 'docker' is not one of"):
        SWEGym(backend={"kind": "docker"})
    with pytest.raises(ValueError, match="runtime 'vm' is not one of"):
        SWEGym(backend={"runtime": "vm"})
    with pytest.raises(ValueError, match="no container images; use runtime=local"):
        SWEGym(backend={"runtime": "container"})
    with pytest.raises(ValueError, match="needs backend.instances"):
        SWEGym(backend={"kind": "swegym"})
    with pytest.raises(ValueError, match="takes no task seed"):
        SWEGym().load_split("train", seed=1)


def test_a_missing_cache_says_what_to_run(tmp_path):
    bench = SWEGym(backend={"cache_dir": str(tmp_path / "none")})
    with pytest.raises(FileNotFoundError) as err:
        bench.load_split("train")
    assert "scripts/setup_swegym.sh" in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(FileNotFoundError, match="scripts/setup_swegym.sh"):
        bench.runtime


def test_offline_splits_are_by_repository_and_limited(cache):
    bench = SWEGym(backend={"cache_dir": str(cache)})
    assert bench.splits == ("train", "test")
    assert [t.task_id for t in bench.load_split("train")] == ["tiny__textkit-1"]
    assert [t.type for t in bench.load_split("test")] == ["mathkit"] and len(bench.load_split("test", limit=1)) == 1
    with pytest.raises(ValueError, match="has no split 'dev'"):
        bench.load_split("dev")


def test_a_real_swegym_file_is_all_train_unless_a_split_file_says_otherwise(cache, tmp_path):
    instances = str(cache / "instances" / "offline.jsonl")
    bench = SWEGym(backend={"kind": "swegym", "instances": instances, "runtime": "container"})
    assert bench.splits == ("train",) and len(bench.load_split("train")) == 2
    assert bench.agent_root(bench.load_split("train")[0]) == "/testbed"
    split_file = tmp_path / "splits.json"
    split_file.write_text(json.dumps({"lite": ["tiny__mathkit-1"], "rest": ["tiny__textkit-1"]}))
    bench = SWEGym(backend={"kind": "swegym", "instances": instances, "split_file": str(split_file)})
    assert bench.splits == ("lite", "rest") and [t.type for t in bench.load_split("lite")] == ["mathkit"]


def test_scores_tables_and_slices():
    records = [{"task_id": "a", "type": "x", "success": True, "patch": "p", "failure_mode": "success",
                "status": "finished", "format_retries": 0},
               {"task_id": "a", "type": "x", "success": False, "patch": "", "failure_mode": "no_edit",
                "status": "finished", "format_retries": 1},
               {"task_id": "b", "type": "y", "success": False, "patch": "", "failure_mode": "iteration_limit",
                "status": "iteration_limit", "format_retries": 0}]
    s = evaluator.summarize(records)
    assert s["resolved"] == 0.25 and s["x_resolved"] == 0.5 and s["y_resolved"] == 0.0 and s["instances"] == 2
    assert s["patch_rate"] == pytest.approx(1 / 3) and s["failure_modes"]["no_edit"] == 1
    table = SWEGym().format_table({"base": s, "sib": s})
    assert table.splitlines()[-1].split() == ["resolved", "25.0", "25.0"] and "x" in table
    assert SWEGym().slice_metrics(records) == pytest.approx(
        {"patch_rate": 1 / 3, "finish_rate": 2 / 3, "format_retry_rate": 1 / 3})


def test_misspelt_backend_keys_are_errors_run_py_reports():
    config = experiments.get_config("swegym", "eval")
    assert builders.benchmark_unread(config) == {
        "benchmark.backend.container_cli": "benchmark.backend with kind='offline', runtime='local' never reads it",
        "benchmark.backend.split_file": "benchmark.backend with kind='offline', runtime='local' never reads it"}
    config.benchmark.backend.kind, config.benchmark.backend.runtime = "swegym", "container"
    assert set(builders.benchmark_unread(config)) == {f"benchmark.backend.{k}" for k in (
        "repos_dir", "venvs_dir", "isolation", "cpu_s", "memory_mb")}
    config = experiments.get_config("appworld", "eval")  # AppWorld's `offline` kind keeps its own table
    assert set(builders.benchmark_unread(config)) == {"benchmark.backend.python", "benchmark.backend.root"}
    options = dict(experiments.get_config("swegym", "eval").benchmark.backend)
    assert repr(make_benchmark("swegym", backend=options)) == "SWEGym(backend='offline', runtime='local')"


def test_the_oracle_resolves_every_built_offline_instance():
    cache = built_cache_or_skip()
    with SWEGym(backend={"cache_dir": str(cache)}) as bench:
        tasks = [t for split in bench.splits for t in bench.load_split(split)]
        assert tasks and {t.extra.get("split") for t in tasks} == {"train", "test"}
        train_repos = {t.repo for t in bench.load_split("train")}
        assert not train_repos & {t.repo for t in bench.load_split("test")}  # split by repository
        runner = EpisodeRunner(bench.make_episode, bench.make_agent("oracle"), SamplingParams(), env_workers=4,
                               max_context_chars=100_000)
        results = runner.results([Job(bench.load_pool().base, t) for t in tasks])
        failed = [(r["task_id"], r["failure_mode"], r["error"]) for r in results if not r["success"]]
        assert not failed


def test_a_missing_built_cache_skips_or_fails_as_asked(tmp_path, monkeypatch):
    monkeypatch.setenv("HSJAX_SWEGYM_CACHE", str(tmp_path / "none"))
    monkeypatch.delenv("HSJAX_REQUIRE_SWEGYM", raising=False)
    with pytest.raises(pytest.skip.Exception, match="scripts/setup_swegym.sh"):
        built_cache_or_skip()
    monkeypatch.setenv("HSJAX_REQUIRE_SWEGYM", "1")
    with pytest.raises(pytest.fail.Exception, match="HSJAX_REQUIRE_SWEGYM=1"):
        built_cache_or_skip()
    assert SWEGym().cache_dir == tmp_path / "none"  # the builder's variable is the benchmark's default too
