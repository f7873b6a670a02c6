"""Orbax checkpoints of the whole train state, with an integrity manifest and corruption fallback.

Layout of one checkpoint directory (see docs/checkpoints.md):

    <ckpt_dir>/<step>/state/...            orbax PyTree (params, optimizer state, step, RNG keys)
    <ckpt_dir>/<step>/host/metadata        JSON host state (data position, router state, ...)
    <ckpt_dir>/<step>/hsjax_manifest.json  size + sha256 of every file above, written last

Orbax writes each step into a temporary directory and renames it when complete, so a crash
mid-save never leaves a step directory that looks finished. The manifest covers what orbax does
not check: a finished step whose files were later truncated, zeroed or deleted, and a crash after
orbax's rename but before the save returned. A step without a valid manifest is never restored;
`restore_latest` logs why and falls back to the previous step.

Saving is synchronous: the manifest can only be written once every byte is on disk, and a
train loop that checkpoints every few hundred steps loses little by waiting. A save refuses NaN or
inf and a disk without room, each as one line (`checkpoint_guards.py`); when no step is usable,
`restore_latest` says so in one line too.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import pathlib
import shutil
from typing import Any, NamedTuple

import jax
import orbax.checkpoint as ocp

from hsjax.infra.checkpoint_guards import (DiskFull, NonFiniteState, directory_bytes,  # noqa: F401
                                           is_disk_full, quiet_abandoned_writes, refuse_nonfinite)
from hsjax.infra.errors import RunStopped

log = logging.getLogger(__name__)

MANIFEST_NAME = "hsjax_manifest.json"
_STATE, _HOST = "state", "host"
_HASH_CHUNK = 1 << 22


class CheckpointError(RuntimeError):
    """A checkpoint step is missing, incomplete or corrupt."""


class NoUsableCheckpoint(CheckpointError, RunStopped):
    """Every step of a checkpoint directory failed verification or restore: one line for run.py."""


class Restored(NamedTuple):
    step: int
    state: Any
    host_state: dict


def resolve_ckpt_dir(workdir_or_ckpt_dir: str | os.PathLike) -> pathlib.Path:
    """A directory named `checkpoints`, or one already holding step directories, is used as is;
    any other path is a workdir whose checkpoints live in `<workdir>/checkpoints`."""
    path = pathlib.Path(workdir_or_ckpt_dir).absolute()
    if path.name == "checkpoints":
        return path
    if path.is_dir() and any(p.is_dir() and p.name.isdigit() for p in path.iterdir()):
        return path
    return path / "checkpoints"


# ----------------------------------------------------------------------------- manifest


def _sha256(path: pathlib.Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _data_files(step_dir: pathlib.Path) -> list[pathlib.Path]:
    return sorted(p for p in step_dir.rglob("*") if p.is_file() and p.name != MANIFEST_NAME)


def write_manifest(step_dir: pathlib.Path, step: int) -> None:
    files = {
        str(p.relative_to(step_dir)): {"size": p.stat().st_size, "sha256": _sha256(p)}
        for p in _data_files(step_dir)
    }
    tmp = step_dir / (MANIFEST_NAME + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump({"step": step, "files": files}, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, step_dir / MANIFEST_NAME)


def verify_manifest(step_dir: pathlib.Path, step: int) -> None:
    """Raises CheckpointError naming the step, directory and first bad file."""
    manifest_path = step_dir / MANIFEST_NAME
    if not manifest_path.is_file():
        raise CheckpointError(
            f"Checkpoint step {step} at {step_dir} has no {MANIFEST_NAME}: the save did not "
            "finish (crash mid-save?) or was not written by hsjax.infra.checkpoint.Checkpointer.")
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
        files = manifest["files"]
    except (ValueError, KeyError) as e:
        raise CheckpointError(
            f"Checkpoint step {step} at {step_dir}: {MANIFEST_NAME} is unreadable ({e}).") from e
    if not files:
        raise CheckpointError(f"Checkpoint step {step} at {step_dir}: manifest lists no files.")
    for rel, expected in files.items():
        path = step_dir / rel
        if not path.is_file():
            raise CheckpointError(f"Checkpoint step {step} at {step_dir} is corrupt: {rel} is missing.")
        size = path.stat().st_size
        if size != expected["size"]:
            raise CheckpointError(
                f"Checkpoint step {step} at {step_dir} is corrupt: {rel} has {size} bytes, "
                f"{expected['size']} were written (truncated or overwritten).")
        if _sha256(path) != expected["sha256"]:
            raise CheckpointError(
                f"Checkpoint step {step} at {step_dir} is corrupt: {rel} does not match the "
                "sha256 recorded at save time (bytes changed on disk).")


# ----------------------------------------------------------------------------- abstract targets


def _abstract_leaf(x):
    """Concrete jax arrays become ShapeDtypeStructs keeping their sharding; the rest stays."""
    if isinstance(x, jax.Array):
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding)
    return x


def abstract_state(template_state):
    return jax.tree.map(_abstract_leaf, template_state)


def _restore_args_as_saved(metadata_tree, device):
    """Restore arguments and a target tree that load every saved array onto one device."""
    sharding = jax.sharding.SingleDeviceSharding(device)

    def target(m):
        if isinstance(m, ocp.metadata.ArrayMetadata):
            return jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=sharding)
        return m

    def restore_arg(m):
        if isinstance(m, ocp.metadata.ArrayMetadata):
            return ocp.ArrayRestoreArgs(sharding=sharding, dtype=m.dtype)
        return ocp.RestoreArgs()

    is_leaf = lambda m: isinstance(m, (ocp.metadata.ArrayMetadata, ocp.metadata.ScalarMetadata))
    return (jax.tree.map(target, metadata_tree, is_leaf=is_leaf),
            jax.tree.map(restore_arg, metadata_tree, is_leaf=is_leaf))


# ----------------------------------------------------------------------------- checkpointer


class Checkpointer:
    """Saves and restores (state pytree, JSON host state) per step, keeping the last `keep`."""

    def __init__(self, workdir_or_ckpt_dir: str | os.PathLike, keep: int | None = 3,
                 read_only: bool = False):
        if keep is not None and keep < 1:
            raise ValueError(f"keep={keep}: keep at least 1 checkpoint, or None to keep all.")
        self.directory = resolve_ckpt_dir(workdir_or_ckpt_dir)
        options = ocp.CheckpointManagerOptions(
            max_to_keep=keep,
            enable_async_checkpointing=False,
            create=not read_only,
            read_only=read_only,
            cleanup_tmp_directories=not read_only,
        )
        self._manager = ocp.CheckpointManager(self.directory, options=options)

    def all_steps(self) -> list[int]:
        """Steps orbax finalized, oldest first (a step may still fail verification)."""
        self._manager.reload()
        return sorted(self._manager.all_steps())

    def step_dir(self, step: int) -> pathlib.Path:
        return self.directory / str(step)

    def save(self, step: int, state_pytree, host_state: dict | None = None) -> None:
        host_state = {} if host_state is None else host_state
        try:
            json.dumps(host_state, allow_nan=False)
        except (TypeError, ValueError) as e:
            raise TypeError(
                f"host_state for step {step} must be plain JSON (dict/list/str/int/float/bool/None, "
                f"finite floats): {e}. Convert arrays with hsjax.infra.metrics.to_python first.") from e
        step = int(step)
        if step in self.all_steps():
            try:
                verify_manifest(self.step_dir(step), step)
            except CheckpointError as e:
                log.warning("Replacing invalid checkpoint: %s", e)
                self._manager.delete(step)
            else:
                raise CheckpointError(
                    f"Checkpoint step {step} already exists at {self.step_dir(step)}; "
                    "delete it or save under a new step.")
        refuse_nonfinite(step, state_pytree)
        self._check_space(step)
        args = ocp.args.Composite(**{
            _STATE: ocp.args.StandardSave(state_pytree),
            _HOST: ocp.args.JsonSave(host_state),
        })
        try:
            with quiet_abandoned_writes():
                self._manager.save(step, args=args, force=True)
                self._manager.wait_until_finished()
            if jax.process_index() == 0:
                write_manifest(self.step_dir(step), step)
        except Exception as e:  # orbax and tensorstore wrap ENOSPC in ValueError, OSError, ...
            if not is_disk_full(e):
                raise
            self._discard_partial(step)
            raise DiskFull(self._disk_full_message(step, "ran out of space while writing (its partial files are removed)")) from e
        if jax.process_count() > 1:
            from jax.experimental import multihost_utils
            multihost_utils.sync_global_devices(f"hsjax_checkpoint_manifest_{step}")

    # ------------------------------------------------------------------------- a full disk
    # orbax writes a step's arrays as concurrent tensorstore writes; when one fails (ENOSPC) the
    # others are left pending on an event loop orbax has already closed, and they print "Event
    # loop is closed" tracebacks as they finish and at exit. So a save that cannot fit is refused
    # before orbax starts, when the run's newest step shows how much one takes; the first save of a
    # run, or a disk filled by someone else meanwhile, still ends in DiskFull, with that noise after it.

    def _free_bytes(self) -> int:
        path = self.directory
        while not path.exists():
            path = path.parent
        return shutil.disk_usage(path).free

    def _check_space(self, step: int) -> None:
        """DiskFull before writing anything when the newest saved step would not fit again."""
        steps = [s for s in self.all_steps() if s != step]
        if not steps:
            return
        needed = directory_bytes(self.step_dir(steps[-1]))
        if needed > self._free_bytes():
            raise DiskFull(self._disk_full_message(step, f"would need about {needed / 2**20:.1f} MiB",
                                                   steps))

    def _disk_full_message(self, step: int, what: str, steps=None) -> str:
        steps = steps if steps is not None else [s for s in self.all_steps() if s != step]
        kept = (f"the latest checkpoint, step {steps[-1]}, is intact" if steps
                else "no earlier checkpoint exists")
        return (f"No space left on device for checkpoint step {step} in {self.directory}: the save "
                f"{what}, {self._free_bytes() / 2**20:.1f} MiB are free; {kept}. Free space there or "
                "pass a --workdir on a larger disk, then rerun the same command to resume")

    def _discard_partial(self, step: int) -> None:
        """Removes what the failed save wrote (orbax's temporary directory, or a step without its
        manifest), so the space is free again; neither would ever be restored."""
        for path in self.directory.glob(f"{step}.orbax-checkpoint-tmp*"):
            shutil.rmtree(path, ignore_errors=True)
        if not (self.step_dir(step) / MANIFEST_NAME).exists():
            shutil.rmtree(self.step_dir(step), ignore_errors=True)
            self._manager.reload()

    def wait_until_finished(self) -> None:
        self._manager.wait_until_finished()

    def restore(self, step: int, template_state) -> Restored:
        """Restores `step` into the structure, dtypes and shardings of `template_state`.

        The template may hold concrete arrays or `jax.ShapeDtypeStruct`s with shardings.
        """
        step = int(step)
        step_dir = self.step_dir(step)
        if not step_dir.is_dir():
            raise CheckpointError(
                f"No checkpoint step {step} in {self.directory}; saved steps: {self.all_steps()}.")
        verify_manifest(step_dir, step)
        args = ocp.args.Composite(**{
            _STATE: ocp.args.StandardRestore(abstract_state(template_state)),
            _HOST: ocp.args.JsonRestore(),
        })
        try:
            restored = self._manager.restore(step, args=args)
        except Exception as e:  # orbax/tensorstore raise many types; all mean "unusable here".
            raise CheckpointError(
                f"Checkpoint step {step} at {step_dir} could not be restored into the template "
                f"({type(e).__name__}: {e}). Check that the template has the saved structure, "
                "shapes and dtypes.") from e
        return Restored(step, restored[_STATE], restored[_HOST] or {})

    def restore_latest(self, template_state) -> Restored | None:
        """The newest step that verifies and restores; None when there is no checkpoint at all.

        Corrupt steps are skipped with a warning; if every step is corrupt, raises
        `NoUsableCheckpoint` (a `CheckpointError` that run.py prints as one line) listing each
        step's problem and the fix.
        """
        steps = self.all_steps()
        if not steps:
            return None
        errors = []
        for step in reversed(steps):
            try:
                restored = self.restore(step, template_state)
            except CheckpointError as e:
                errors.append(" ".join(str(e).split())[:300])
                continue
            for error in errors:  # said only on a fallback: with none usable, the error says it all
                log.warning("Skipping checkpoint: %s", error)
            return restored
        raise NoUsableCheckpoint(
            f"All {len(steps)} checkpoints in {self.directory} are unusable ({'; '.join(errors)}). "
            f"Move or delete {self.directory} to start this run from step 0, or pass another --workdir")

    def load_params(self, step: int | None = None, subtree: str | None = "params"):
        """Restores the saved state (or its `subtree`, e.g. params) as saved, with no template.

        Arrays land on the first local device; use for evaluation and export scripts.
        """
        if step is None:
            steps = self.all_steps()
            if not steps:
                raise CheckpointError(f"No checkpoints in {self.directory}.")
            step = steps[-1]
        step_dir = self.step_dir(step)
        if not step_dir.is_dir():
            raise CheckpointError(
                f"No checkpoint step {step} in {self.directory}; saved steps: {self.all_steps()}.")
        verify_manifest(step_dir, step)
        reader = ocp.CheckpointManager(
            self.directory,
            item_handlers={_STATE: ocp.PyTreeCheckpointHandler()},
            options=ocp.CheckpointManagerOptions(read_only=True),
        )
        metadata = reader.item_metadata(step)[_STATE]
        tree = metadata.tree if hasattr(metadata, "tree") else metadata
        partial = subtree is not None
        if partial:
            if not isinstance(tree, dict) or subtree not in tree:
                keys = sorted(tree) if isinstance(tree, dict) else type(tree).__name__
                raise CheckpointError(
                    f"Checkpoint step {step} at {step_dir} has no '{subtree}' in its state "
                    f"(top level: {keys}); pass subtree=None to load everything.")
            tree = {subtree: tree[subtree]}
        target, restore_args = _restore_args_as_saved(tree, jax.local_devices()[0])
        try:
            restored = reader.restore(step, args=ocp.args.Composite(**{
                _STATE: ocp.args.PyTreeRestore(
                    item=target, restore_args=restore_args, partial_restore=partial)}))
        except Exception as e:
            raise CheckpointError(
                f"Checkpoint step {step} at {step_dir} could not be read: "
                f"{type(e).__name__}: {e}") from e
        finally:
            reader.close()
        state = restored[_STATE]
        return state[subtree] if partial else state

    def close(self) -> None:
        self._manager.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def restore_latest(workdir_or_ckpt_dir, template_state) -> Restored | None:
    """Module-level shortcut: `Checkpointer(dir).restore_latest(template_state)`."""
    ckpt_dir = resolve_ckpt_dir(workdir_or_ckpt_dir)
    if not ckpt_dir.is_dir():
        return None
    with Checkpointer(ckpt_dir, keep=None, read_only=True) as ckpt:
        return ckpt.restore_latest(template_state)


def load_params(ckpt_dir, step: int | None = None, subtree: str | None = "params"):
    """The saved params (or whole state with subtree=None) of `step` (default latest), as saved."""
    with Checkpointer(ckpt_dir, keep=None, read_only=True) as ckpt:
        return ckpt.load_params(step, subtree)
