"""Device mesh and logical-axis sharding rules.

Model code names array dimensions with logical axes ('embed', 'heads', 'batch', ...); a list of
rules maps each logical name to zero or more mesh axes, so one model runs unchanged on one CPU,
one GPU, or a pod. Rules are plain data, set from the experiment config:

    rules = [('batch', ('data', 'fsdp')), ('embed', 'fsdp'), ('heads', 'tensor'), ...]

A dimension stays replicated when its size is not divisible by the mesh axes it maps to (a tiny
model on 8 devices), when the mesh lacks the axis, or when an earlier dimension of the same array
already uses that mesh axis.
"""
from __future__ import annotations

import logging
import math
from typing import Any, Iterable, Mapping, Sequence

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from hsjax.models.model import init_params, param_logical_axes

log = logging.getLogger(__name__)

MeshAxes = tuple[str, ...]
Rules = Sequence[tuple[str, Any]]

DEFAULT_MESH = (("data", -1), ("fsdp", 1), ("tensor", 1))

DEFAULT_RULES: tuple[tuple[str, Any], ...] = (
    ("batch", ("data", "fsdp")),
    ("embed", "fsdp"),
    ("heads", "tensor"),
    ("kv_heads", "tensor"),
    ("mlp", "tensor"),
    ("vocab", "tensor"),
    ("layers", None),
    ("head_dim", None),
    ("length", None),
)


# ----------------------------------------------------------------------------- mesh


def make_mesh(mesh_shape: Mapping[str, int] | Iterable[tuple[str, int]] = DEFAULT_MESH,
              devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A mesh over `devices` (default: all), e.g. `[('data', -1), ('fsdp', 2), ('tensor', 1)]`.

    One size may be -1, meaning "all remaining devices".
    """
    pairs = list(mesh_shape.items()) if isinstance(mesh_shape, Mapping) else [tuple(p) for p in mesh_shape]
    if not pairs or any(len(p) != 2 for p in pairs):
        raise ValueError(f"mesh_shape {mesh_shape!r} must be (axis_name, size) pairs, e.g. "
                         "[('data', -1), ('fsdp', 1), ('tensor', 1)].")
    names = [str(name) for name, _ in pairs]
    sizes = [int(size) for _, size in pairs]
    if len(set(names)) != len(names):
        raise ValueError(f"mesh_shape {mesh_shape!r} repeats an axis name.")
    devices = list(jax.devices() if devices is None else devices)
    n = len(devices)
    if sizes.count(-1) > 1:
        raise ValueError(f"mesh_shape {mesh_shape!r}: at most one axis may have size -1.")
    if any(s == 0 or s < -1 for s in sizes):
        raise ValueError(f"mesh_shape {mesh_shape!r}: sizes must be positive or -1.")
    known = math.prod(s for s in sizes if s != -1)
    if -1 in sizes:
        if n % known:
            raise ValueError(
                f"mesh_shape {mesh_shape!r}: the fixed axes need a multiple of {known} devices, "
                f"but there are {n}; change the sizes so their product divides {n}.")
        sizes[sizes.index(-1)] = n // known
    elif known != n:
        raise ValueError(
            f"mesh_shape {mesh_shape!r} covers {known} devices but there are {n}; make the sizes "
            f"multiply to {n}, or set one size to -1.")
    return jax.make_mesh(tuple(sizes), tuple(names), axis_types=(AxisType.Auto,) * len(names),
                         devices=devices)


# ----------------------------------------------------------------------------- rules


def normalize_rules(rules: Rules | None) -> dict[str, MeshAxes]:
    """Rules (pairs, possibly lists from a JSON/ConfigDict) as {logical name: tuple of mesh axes}."""
    rules = DEFAULT_RULES if rules is None else rules
    out: dict[str, MeshAxes] = {}
    for rule in rules:
        if len(rule) != 2:
            raise ValueError(f"Sharding rule {rule!r} must be (logical_name, mesh_axis | tuple | None).")
        name, axes = rule
        if name in out:
            continue  # first rule wins, as in MaxText
        if axes is None:
            out[name] = ()
        elif isinstance(axes, str):
            out[name] = (axes,)
        else:
            out[name] = tuple(str(a) for a in axes)
    return out


def logical_to_spec(names: Sequence[str | None], mesh: Mesh, rules: Rules | None = None,
                    shape: Sequence[int] | None = None) -> PartitionSpec:
    """PartitionSpec of one array whose dimensions carry logical `names`.

    With `shape`, mesh axes that do not divide a dimension are dropped (replicated there).
    """
    table = normalize_rules(rules)
    if shape is not None and len(shape) != len(names):
        raise ValueError(f"Logical axes {tuple(names)} do not match array shape {tuple(shape)}.")
    used: set[str] = set()
    spec = []
    for i, name in enumerate(names):
        if name is None:
            spec.append(None)
            continue
        if name not in table:
            raise ValueError(
                f"Logical axis {name!r} has no sharding rule; add ({name!r}, None) to replicate it "
                f"or map it to a mesh axis. Known: {sorted(table)}.")
        kept, product = [], 1
        for axis in table[name]:
            if axis not in mesh.shape:
                continue  # a rule may name axes this mesh does not have
            size = mesh.shape[axis]
            if axis in used:
                log.info("Logical axis %r: mesh axis %r already used by another dimension; "
                         "replicating over it.", name, axis)
                continue
            if shape is not None and shape[i] % (product * size):
                log.info("Logical axis %r (size %d) is not divisible by mesh axis %r x%d; "
                         "replicating over it.", name, shape[i], axis, product * size)
                continue
            kept.append(axis)
            product *= size
        used.update(kept)
        spec.append(None if not kept else kept[0] if len(kept) == 1 else tuple(kept))
    return PartitionSpec(*spec)


def _is_axes_leaf(x) -> bool:
    return isinstance(x, tuple) and all(a is None or isinstance(a, str) for a in x)


def _is_shape_leaf(x) -> bool:
    return isinstance(x, tuple) and all(isinstance(d, int) for d in x)


def _shape_of(x) -> tuple[int, ...]:
    if _is_shape_leaf(x):
        return x
    return tuple(x.shape) if hasattr(x, "shape") else tuple(np.shape(x))


def logical_to_sharding(logical_axes_tree, mesh: Mesh, rules: Rules | None = None, shapes=None):
    """NamedSharding tree for a tree of logical-axis tuples.

    `shapes`, when given, is a same-structure tree of arrays, ShapeDtypeStructs or shape tuples;
    it enables the divisibility fallback.
    """
    if shapes is None:
        return jax.tree.map(lambda names: NamedSharding(mesh, logical_to_spec(names, mesh, rules)),
                            logical_axes_tree, is_leaf=_is_axes_leaf)
    shape_tree = jax.tree.map(_shape_of, shapes, is_leaf=_is_shape_leaf)
    flat_axes, treedef = jax.tree.flatten(logical_axes_tree, is_leaf=_is_axes_leaf)
    flat_shapes = treedef.flatten_up_to(shape_tree)
    return treedef.unflatten([
        NamedSharding(mesh, logical_to_spec(names, mesh, rules, shape))
        for names, shape in zip(flat_axes, flat_shapes)])


# ----------------------------------------------------------------------------- helpers


def param_shardings(cfg, mesh: Mesh, rules: Rules | None = None, params=None):
    """NamedShardings of the model params of `cfg` (shapes from `params` or `jax.eval_shape`)."""
    if params is None:
        params = jax.eval_shape(lambda: init_params(cfg, jax.random.key(0)))
    return logical_to_sharding(param_logical_axes(cfg), mesh, rules, shapes=params)


def shard_params(params, cfg, mesh: Mesh, rules: Rules | None = None):
    """`params` placed on `mesh` by the logical axes of `cfg` and `rules`."""
    return jax.device_put(params, param_shardings(cfg, mesh, rules, params))


def batch_sharding(mesh: Mesh, rules: Rules | None = None) -> NamedSharding:
    """Sharding of a batch array: leading dimension over the 'batch' rule's mesh axes."""
    axes = tuple(a for a in normalize_rules(rules).get("batch", ()) if a in mesh.shape)
    if not axes:
        return NamedSharding(mesh, PartitionSpec())
    return NamedSharding(mesh, PartitionSpec(axes[0] if len(axes) == 1 else axes))


def with_logical_constraint(x: jax.Array, names: Sequence[str | None], mesh: Mesh,
                            rules: Rules | None = None) -> jax.Array:
    """`jax.lax.with_sharding_constraint` by logical names (e.g. activations inside `jit`)."""
    spec = logical_to_spec(names, mesh, rules, x.shape)
    return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec))
