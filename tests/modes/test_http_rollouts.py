"""Training rollouts from a separate server (`rollout.backend=http_tokens`): the project's own `serve`
in a process of its own samples the run's episodes, gets the run's weights pushed after each update
(`POST /update_weights_from_disk`), and the run trains synchronously and one step off."""
import json

import httpx
import numpy as np
import pytest

from hsjax.infra import experiments
from hsjax.infra.errors import UserError
from hsjax.modes import train
from hsjax.policies.base import PolicyError
from tests.serve_process import tiny_server

pytestmark = pytest.mark.filterwarnings("ignore:Some donated buffers were not usable")
testbed = experiments.load("testbed")


@pytest.fixture(scope="module")
def weights_root(tmp_path_factory):
    return tmp_path_factory.mktemp("pushed")


@pytest.fixture(scope="module")
def server(tmp_path_factory, weights_root):
    # It starts from the warm start's weights; every run pushes its own at its start.
    with tiny_server(tmp_path_factory.mktemp("serve") / "serve", f"--config.serve.hf_dir={testbed.NAMES_V3_WARMSTART}",
                     "--config.serve.model_name=policy", f"--config.serve.weights_root={weights_root}",
                     "--config.serve.max_batch=32") as proc:
        yield f"http://127.0.0.1:{proc.port}"


def http_config(url, weights_dir, staleness, total_steps=3):
    config = experiments.get_config("testbed", "names_tables_first,smoke,v3")
    config.total_steps = total_steps
    config.rollout.backend = "http_tokens"
    config.rollout.http.base_urls = (url + "/v1",)
    config.rollout.http.model = "policy"
    config.rollout.http.weights_dir = str(weights_dir)
    config.rollout.staleness = staleness
    config.optim.warmup_steps = 0  # every update moves the params
    config.eval.every = 0
    config.rollout.groups, config.rollout.max_new_tokens = 4, 64
    return config


def rows(workdir):
    return [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]


def test_synchronous_rollouts_sample_the_pushed_weights(server, weights_root, tmp_path):
    train.main(http_config(server, weights_root / "sync", staleness=0), str(tmp_path / "run"))
    got = rows(tmp_path / "run")
    assert [r["rollout/staleness"] for r in got] == [0, 0, 0]
    assert all(np.isfinite(r["loss/pg"]) for r in got)
    # The server's logprobs are the trainer's own up to float error at every step: it sampled the
    # params of that step, pushed after each update (the warm start alone would drift from step 2 on).
    assert all(r["logprob_gap/abs_max"] < 1e-3 for r in got), [r["logprob_gap/abs_max"] for r in got]
    assert httpx.get(server + "/health").json()["weight_version"] == "2"
    assert [p.name for p in (weights_root / "sync").iterdir()] == ["v000002"]  # older versions removed


def test_one_step_off_trains_on_rollouts_of_the_previous_weights(server, weights_root, tmp_path):
    train.main(http_config(server, weights_root / "async", staleness=1), str(tmp_path / "run"))
    got = rows(tmp_path / "run")
    assert [r["rollout/staleness"] for r in got] == [0, 1, 1]
    assert all(np.isfinite(r["loss/pg"]) and np.isfinite(r["logprob_gap/abs_mean"]) for r in got)
    # Steps 2 and 3 sampled one update behind: the gap holds that update, step 1's float error only.
    assert got[0]["logprob_gap/abs_max"] < 1e-3 < max(r["logprob_gap/abs_max"] for r in got[1:])


def test_the_server_loads_weights_only_from_under_its_root(server, weights_root, tmp_path):
    reply = httpx.post(server + "/update_weights_from_disk", json={"model_path": str(tmp_path)})
    assert reply.status_code == 400 and "outside serve.weights_root" in reply.text
    (weights_root / "escape").symlink_to(tmp_path)  # a link under the root to a directory outside it
    reply = httpx.post(server + "/update_weights_from_disk", json={"model_path": str(weights_root / "escape")})
    assert reply.status_code == 400 and "outside serve.weights_root" in reply.text
    (weights_root / "empty").mkdir()
    reply = httpx.post(server + "/update_weights_from_disk", json={"model_path": str(weights_root / "empty")})
    assert reply.status_code == 400 and "not an HF model directory" in reply.text
    reply = httpx.post(server + "/update_weights_from_disk", json={"model_path": "../../etc"})
    assert reply.status_code == 400
    reply = httpx.post(server + "/update_weights_from_disk", json={"weight_version": "1"})
    assert reply.status_code == 400 and "model_path" in reply.text
    reply = httpx.post(server + "/update_weights_from_disk", json=[str(weights_root)])
    assert reply.status_code == 400 and "JSON object" in reply.text
    # /health shows the version to anyone: a long one is refused before anything loads
    reply = httpx.post(server + "/update_weights_from_disk",
                       json={"model_path": str(weights_root / "empty"), "weight_version": "v" * 65})
    assert reply.status_code == 400 and "at most 64" in reply.text


def test_a_server_that_takes_no_weights_stops_the_run_before_a_rollout(tmp_path):
    with tiny_server(tmp_path / "plain", f"--config.serve.hf_dir={testbed.NAMES_V3_WARMSTART}",
                     "--config.serve.model_name=policy") as proc:
        config = http_config(f"http://127.0.0.1:{proc.port}", tmp_path / "weights", staleness=0, total_steps=1)
        with pytest.raises(PolicyError, match="refused weight version 0"):
            train.main(config, str(tmp_path / "run"))
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_http_tokens_needs_a_server(tmp_path):
    config = http_config("", tmp_path / "weights", staleness=0)
    config.rollout.http.base_urls = ("",)
    with pytest.raises(UserError, match="rollout.http.base_urls"):
        train.main(config, str(tmp_path / "run"))
