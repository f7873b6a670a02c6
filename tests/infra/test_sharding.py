import json
import logging
import os
import subprocess
import sys
import textwrap

import jax
import pytest
from jax.sharding import AbstractMesh, PartitionSpec as P

from hsjax.infra import paths, sharding

REPO_ROOT = paths.REPO_ROOT

# 2 x 2 x 2 without real devices: the rules only read the axis sizes.
MESH_222 = AbstractMesh((2, 2, 2), ("data", "fsdp", "tensor"))


def test_default_rules_map_logical_axes():
    spec = sharding.logical_to_spec(("layers", "embed", "heads", "head_dim"), MESH_222,
                                    shape=(4, 128, 4, 32))
    assert spec == P(None, "fsdp", "tensor", None)
    assert sharding.logical_to_spec(("batch", "length"), MESH_222, shape=(8, 16)) == P(("data", "fsdp"), None)
    assert sharding.logical_to_spec(("vocab", "embed"), MESH_222) == P("tensor", "fsdp")


def test_indivisible_dimension_falls_back_to_replicated(caplog):
    with caplog.at_level(logging.INFO, logger="hsjax.infra.sharding"):
        spec = sharding.logical_to_spec(("layers", "kv_heads", "head_dim"), MESH_222, shape=(2, 3, 8))
    assert spec == P(None, None, None)
    assert any("'kv_heads' (size 3)" in r.getMessage() for r in caplog.records)
    # A batch of 2 keeps 'data' and drops 'fsdp' rather than replicating entirely.
    assert sharding.logical_to_spec(("batch",), MESH_222, shape=(2,)) == P("data")


def test_rules_from_config_lists_and_missing_mesh_axes():
    rules = [["batch", ["data"]], ["embed", "fsdp"], ["mlp", ["tensor", "expert"]], ["heads", None]]
    mesh = AbstractMesh((4,), ("data",))
    assert sharding.logical_to_spec(("batch", "embed", "mlp"), mesh, rules) == P("data", None, None)
    assert sharding.logical_to_spec(("embed", "mlp"), MESH_222, rules) == P("fsdp", "tensor")
    # A mesh axis is used at most once per array.
    same = [("a", "fsdp"), ("b", "fsdp")]
    assert sharding.logical_to_spec(("a", "b"), MESH_222, same) == P("fsdp", None)


def test_unknown_logical_axis_is_an_error():
    with pytest.raises(ValueError, match="'experts' has no sharding rule"):
        sharding.logical_to_spec(("experts", "embed"), MESH_222)
    with pytest.raises(ValueError, match="do not match array shape"):
        sharding.logical_to_spec(("embed",), MESH_222, shape=(4, 4))


def test_logical_to_sharding_tree_with_shapes():
    mesh = sharding.make_mesh([("data", -1), ("fsdp", 1), ("tensor", 1)])
    axes = {"w": ("embed", "mlp"), "b": ("mlp",), "scalar": ()}
    shapes = {"w": (8, 6), "b": (6,), "scalar": ()}
    tree = sharding.logical_to_sharding(axes, mesh, shapes=shapes)
    assert tree["w"].spec == P("fsdp", "tensor") and tree["scalar"].spec == P()
    assert tree["w"].mesh.shape == {"data": len(jax.devices()), "fsdp": 1, "tensor": 1}


def test_make_mesh_errors():
    n = len(jax.devices())
    with pytest.raises(ValueError, match="at most one axis may have size -1"):
        sharding.make_mesh([("data", -1), ("fsdp", -1)])
    with pytest.raises(ValueError, match=f"covers {n + 1} devices but there are {n}"):
        sharding.make_mesh({"data": n + 1})
    with pytest.raises(ValueError, match="multiple of 3 devices"):
        sharding.make_mesh([("data", -1), ("tensor", 3)], devices=jax.devices()[:1])


# Runs with 8 host CPU devices in its own interpreter, so the rest of the suite keeps one device.
SCRIPT = textwrap.dedent("""
    import json, os, sys, tempfile
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P
    from hsjax.infra import sharding
    from hsjax.infra import checkpoint
    from hsjax.models import forward, get_preset, init_params

    out = {"devices": len(jax.devices())}
    out["mesh_minus_one"] = dict(sharding.make_mesh([("data", -1), ("fsdp", 2), ("tensor", 2)]).shape)
    try:
        sharding.make_mesh([("data", -1), ("tensor", 3)])
    except ValueError as e:
        out["mesh_error"] = str(e)
    mesh = sharding.make_mesh({"data": 2, "fsdp": 2, "tensor": 2})

    cfg = get_preset("tiny")
    params = init_params(cfg, jax.random.key(0))
    sharded = sharding.shard_params(params, cfg, mesh)
    specs = jax.tree.map(lambda x: str(x.sharding.spec), sharded)
    out["specs"] = {"embed": specs["embed"], "q_proj": specs["layers"]["q_proj"],
                    "k_proj": specs["layers"]["k_proj"], "down_proj": specs["layers"]["down_proj"],
                    "final_norm": specs["final_norm"]}
    q = sharded["layers"]["q_proj"]
    out["q_proj_shard_shape"] = list(q.addressable_shards[0].data.shape)
    out["q_proj_num_shards"] = len({tuple((s.start, s.stop) for s in sh.index) for sh in q.addressable_shards})

    B, T = 8, 16
    tokens = jax.random.randint(jax.random.key(1), (B, T), 0, cfg.vocab_size)
    positions = jnp.broadcast_to(jnp.arange(T), (B, T))
    ref, _ = jax.jit(lambda p, t, s: forward(cfg, p, t, s))(params, tokens, positions)
    bsh = sharding.batch_sharding(mesh)
    tokens_s, positions_s = jax.device_put(tokens, bsh), jax.device_put(positions, bsh)
    out["batch_spec"] = str(tokens_s.sharding.spec)

    @jax.jit
    def sharded_forward(p, t, s):
        logits, _ = forward(cfg, p, t, s)
        return sharding.with_logical_constraint(logits, ("batch", "length", "vocab"), mesh)

    logits = sharded_forward(sharded, tokens_s, positions_s)
    out["logits_spec"] = str(logits.sharding.spec)
    out["max_abs_diff"] = float(jnp.max(jnp.abs(logits - ref)))
    out["ref_scale"] = float(jnp.max(jnp.abs(ref)))

    # Save sharded, restore into a different layout: the template decides shardings and dtypes.
    with tempfile.TemporaryDirectory() as d:
        ckpt = checkpoint.Checkpointer(d, keep=1)
        ckpt.save(1, {"params": sharded}, {"pos": 1})
        replicated = NamedSharding(mesh, P())
        template = {"params": jax.tree.map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=replicated), params)}
        template["params"]["embed"] = jax.ShapeDtypeStruct(
            params["embed"].shape, params["embed"].dtype, sharding=NamedSharding(mesh, P("data", None)))
        restored = ckpt.restore_latest(template)
        out["restored_embed_spec"] = str(restored.state["params"]["embed"].sharding.spec)
        out["restored_q_spec"] = str(restored.state["params"]["layers"]["q_proj"].sharding.spec)
        out["restored_equal"] = all(jax.tree.leaves(jax.tree.map(
            lambda a, b: bool((np.asarray(a) == np.asarray(b)).all()), restored.state["params"], params)))
    print("RESULT " + json.dumps(out))
""")


@pytest.fixture(scope="module")
def eight_device_run():
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               XLA_FLAGS="--xla_force_host_platform_device_count=8",
               PYTHONPATH=str(REPO_ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", SCRIPT], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"8-device script failed:\n{proc.stderr[-4000:]}"
    line = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):])


def test_mesh_with_eight_devices(eight_device_run):
    r = eight_device_run
    assert r["devices"] == 8
    assert r["mesh_minus_one"] == {"data": 2, "fsdp": 2, "tensor": 2}
    assert "multiple of 3 devices, but there are 8" in r["mesh_error"]


def test_params_are_sharded_by_rules(eight_device_run):
    r = eight_device_run
    assert r["specs"]["embed"] == str(P("tensor", "fsdp"))
    assert r["specs"]["q_proj"] == str(P(None, "fsdp", "tensor", None))
    assert r["specs"]["k_proj"] == str(P(None, "fsdp", "tensor", None))
    assert r["specs"]["down_proj"] == str(P(None, "tensor", "fsdp"))
    assert r["specs"]["final_norm"] == str(P("fsdp"))
    # tiny: q_proj is 4 x 128 x 4 x 32, split 2-way on embed and 2-way on heads.
    assert r["q_proj_shard_shape"] == [4, 64, 2, 32]
    assert r["q_proj_num_shards"] == 4


def test_sharded_forward_matches_unsharded(eight_device_run):
    r = eight_device_run
    assert r["batch_spec"] == str(P(("data", "fsdp")))
    assert r["logits_spec"] == str(P(("data", "fsdp"), None, "tensor"))
    assert r["ref_scale"] > 0.01
    assert r["max_abs_diff"] < 1e-5


def test_checkpoint_restores_into_template_sharding(eight_device_run):
    r = eight_device_run
    assert r["restored_embed_spec"] == str(P("data", None))
    assert r["restored_q_spec"] == str(P())
    assert r["restored_equal"]
