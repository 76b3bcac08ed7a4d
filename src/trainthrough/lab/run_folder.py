"""Reading a run folder: is there a run in it, in what state, and may it be reused.

A folder holds a run if the project wrote one there: ``status.json``, or (folders from
before it existed) ``config.toml`` with a log or a summary. The run is complete if and
only if ``summary.json`` exists (written last, atomically: lab/recorder.py); otherwise
``status.json`` says how far it got. A ``running`` status whose process is gone (same
host, pid no longer alive) is a run that was killed without a word (SIGKILL, power).

Reuse rules, for ``trainthrough run --out DIR``:

- an empty or missing folder is used as is;
- a folder holding a run is refused unless ``--overwrite`` (replace it) or ``--resume``
  (continue it) is given; a run still running is refused either way;
- a non-empty folder that holds no run is refused, even with ``--overwrite``: its files
  are not the project's to delete.

``--overwrite`` removes only what a run writes: the names in
:data:`~trainthrough.lab.recorder.RUN_FILES` and their temp files, and the old run's
checkpoints in its own location ``<checkpoint dir>/run-<id>/`` (checkpoint folders
only; the location and a default ``checkpoints/`` folder go if that leaves them empty).
Any other file in the folder, or in the checkpoint folder, stays.
"""

from __future__ import annotations

import json
import os
import re
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainthrough.config import RunConfig
from trainthrough.engines.signals import ProcessIdentity, alive, identify
from trainthrough.errors import UserError
from trainthrough.ft.checkpoint import absolute_base, run_location
from trainthrough.ft.checkpoint.manifest import MANIFEST
from trainthrough.lab.recorder import RUN_FILES, STATUS, SUMMARY, TEMP_FILES

# A complete checkpoint's folder as the store names it (``<tag>-<step>``).
_COMPLETE_CHECKPOINT = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_-]*-([0-9]{1,20})")
# A checkpoint folder as the store names it (``<tag>-<step>``) or its writer's temp folder.
_CHECKPOINT_DIR = re.compile(r"^[A-Za-z0-9_-]+-[0-9]+(\.tmp-[0-9a-f]+)?$")


@dataclass(frozen=True)
class Spelling:
    """How the caller names the settings of a run's folder, for the messages that ask
    to change one: the command line's flags (:data:`CLI`) or the arguments of
    ``trainthrough.loop.launch`` and :func:`trainthrough.lab.runner.run` (:data:`PYTHON`).
    A message that says ``--out`` to a Python caller names nothing it can change."""

    out: str = "--out"
    overwrite: str = "--overwrite"
    resume: str = "--resume"
    checkpoint_dir: str = "--checkpoint-dir"
    max_iterations: str = "--max-iterations"


CLI = Spelling()
PYTHON = Spelling(out="out", overwrite="overwrite=True", resume="resume=True",
                  checkpoint_dir="checkpoint_dir", max_iterations="max_iterations")


@dataclass(frozen=True)
class FolderRun:
    """The run a folder holds, as far as its files tell."""

    folder: Path
    state: str  # complete, running, failed, interrupted, or unknown (no status.json)
    reason: str | None
    run_id: str | None
    alive: bool  # a ``running`` status whose process still exists on this host
    pid: int | None = None  # the process that wrote the status

    @property
    def complete(self) -> bool:
        return self.state == "complete"

    def describe(self) -> str:
        """The run's state in a few words (for one-line messages)."""
        if self.complete:
            return "a complete run"
        if self.alive:
            return (f"a run that is still running (pid {self.pid}; if that process is not "
                    f"trainthrough, delete {self.folder / STATUS})")
        if self.state == "running":
            return "an incomplete run (its process ended without a word: killed?)"
        why = f" ({self.reason})" if self.reason else ""
        return {"failed": f"a failed run{why}", "interrupted": f"an interrupted run{why}"}.get(
            self.state, "an incomplete run (no summary.json)")


def _read_json(path: Path) -> dict[str, Any]:
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def _alive(status: dict[str, Any]) -> bool:
    pid = status.get("pid")
    if status.get("state") != "running" or status.get("host") != socket.gethostname() \
            or not isinstance(pid, int) or pid <= 0 or pid == os.getpid():
        return False
    # Looked up in /proc, never probed with a signal (engines/signals.py); with the
    # recorded start time a reused pid is not taken for the run's process.
    start = status.get("pid_start")
    if isinstance(start, int):
        return alive(ProcessIdentity(pid, start))
    return identify(pid) is not None


def inspect(folder: Path) -> FolderRun | None:
    """The run ``folder`` holds, or None if it holds none (missing, empty, or not a run)."""
    status = _read_json(folder / STATUS)
    summary = folder / SUMMARY
    if not status and not ((folder / "config.toml").is_file() and any(
            (folder / n).is_file() for n in ("metrics.jsonl", "events.jsonl", SUMMARY))):
        return None
    run_id = status.get("run_id")
    if summary.is_file():
        run_id = run_id or _read_json(summary).get("run_id")
        return FolderRun(folder, "complete", None, run_id, False)
    recorded = status.get("state")
    state = recorded if recorded in ("running", "failed", "interrupted") else "unknown"
    pid = status.get("pid")
    return FolderRun(folder, state, status.get("reason"), run_id, _alive(status),
                     pid if isinstance(pid, int) else None)


def check_out(out: Path, overwrite: bool = False, resume: bool = False,
              names: Spelling = CLI) -> FolderRun | None:
    """Check that a run may write ``out``; return the run already there, if any.

    Args:
        names: how the caller spells ``out``, ``overwrite`` and ``resume`` (messages).

    Raises:
        UserError: ``out`` cannot be a run folder (a file, under a file, unreadable,
            not writable), holds files that are not a run, holds a run and neither
            ``overwrite`` nor ``resume`` is set, holds a run still running, or (with
            ``resume``) holds no incomplete run.
    """
    check_creatable(out, names.out)
    try:
        used = out.is_dir() and any(out.iterdir())
    except OSError as e:
        raise UserError(f"{names.out} {out}: cannot read the folder ({e.strerror})") from None
    previous = inspect(out) if used else None
    if resume:
        _check_resumable(out, previous, names)
    elif used and previous is None:
        raise UserError(f"run folder {out} already exists and holds files that are not a "
                        f"trainthrough run; choose another {names.out}")
    elif previous is not None and previous.alive:
        raise UserError(f"run folder {out} holds {previous.describe()}; "
                        f"choose another {names.out}")
    elif previous is not None and not overwrite:
        more = "" if previous.complete else f", or {names.resume} to continue it"
        raise UserError(f"run folder {out} already exists and holds {previous.describe()}; "
                        f"add {names.overwrite} to replace it{more}")
    return previous


def check_creatable(path: Path, label: str) -> None:
    """Check that ``path`` is a folder, or one this process can create.

    Raises:
        UserError: ``path`` is a file, lies under a file, or its nearest existing
            ancestor is not writable; ``label`` names the option that gave it.
    """
    if path.exists() and not path.is_dir():
        raise UserError(f"{label} {path} is a file, not a folder; choose another {label}")
    # The nearest existing ancestor decides whether the folder can be made at all.
    base = next((p for p in path.absolute().parents if p.exists()), None)
    if base is not None and not base.is_dir():
        raise UserError(f"{label} {path} lies under {base}, which is a file; "
                        f"choose another {label}")
    if base is not None and not path.exists() and not os.access(base, os.W_OK | os.X_OK):
        raise UserError(f"{label} {path}: no permission to create folders in {base}")


def check_checkpoint_dir(base: str, names: Spelling = CLI) -> None:
    """A local ``--checkpoint-dir`` must be a folder a run can create and write in. A
    remote URL's store is only known when it writes (it raises then).

    Raises:
        UserError: as :func:`check_creatable`, or the folder is not writable.
    """
    if "://" in base and not base.startswith("file://"):
        return
    path = Path(base.removeprefix("file://"))
    check_creatable(path, names.checkpoint_dir)
    if path.is_dir() and not os.access(path, os.W_OK | os.X_OK):
        raise UserError(f"--checkpoint-dir {path}: no permission to write in it")


def _check_resumable(out: Path, run: FolderRun | None, names: Spelling) -> None:
    r, o = names.resume, names.overwrite
    if run is None:
        raise UserError(f"{r}: {out} holds no trainthrough run to continue; "
                        f"drop {r} to start one")
    if run.complete:
        raise UserError(f"{r}: the run in {out} is complete (it has a summary.json); "
                        f"nothing to continue (add {o} instead to run it again)")
    if run.alive:
        raise UserError(f"{r}: {out} holds {run.describe()}; wait for it or stop it")
    if not run.run_id:
        raise UserError(f"{r}: {out} records no run id (no status.json), so its "
                        f"checkpoints cannot be found; use {o} to run it again")


@dataclass(frozen=True)
class ResumePoint:
    """What ``--resume`` continues: the recorded config and the run's id."""

    config: RunConfig
    run_id: str


def resume_point(out: Path, names: Spelling = CLI) -> ResumePoint:
    """The incomplete run in ``out`` and where its checkpoints are.

    Raises:
        UserError: no incomplete run in ``out`` (see :func:`check_out`), an unreadable
            ``config.toml``, or no complete checkpoint in the run's location.
    """
    run = check_out(out, resume=True, names=names)
    assert run is not None and run.run_id is not None
    cfg = RunConfig.from_toml(out / "config.toml")
    url = _location(out, cfg.checkpoint_dir, run.run_id)
    require_checkpoint(out, url, names)
    return ResumePoint(cfg, run.run_id)


def require_checkpoint(out: Path, url: str, names: Spelling = CLI) -> int:
    """Refuse to resume the run in ``out`` if its location ``url`` holds no complete
    checkpoint (a folder ``<tag>-<step>`` with its manifest, which is written last).

    Returns:
        The step of the newest complete checkpoint (the one a resume starts from, unless
        it proves corrupt when loaded).

    Raises:
        UserError: naming the location.
    """
    from fsspec.core import url_to_fs

    steps: list[int] = []
    try:
        fs, root = url_to_fs(url)
        for m in fs.glob(f"{root.rstrip('/')}/*/{MANIFEST}"):
            # A temp folder holds its manifest before its rename: not complete yet.
            name = _COMPLETE_CHECKPOINT.fullmatch(m.rstrip("/").rsplit("/", 2)[-2])
            if name is not None:
                steps.append(int(name.group(1)))
    except (OSError, ValueError):
        steps = []
    if not steps:
        raise UserError(f"{names.resume}: the run in {out} saved no checkpoint (none in "
                        f"{url}); add {names.overwrite} instead to run it again")
    return max(steps)


def _location(out: Path, checkpoint_dir: str | None, run_id: str) -> str:
    try:
        return run_location(checkpoint_dir or str(out / "checkpoints"), run_id)
    except ValueError as e:
        raise UserError(f"{out}/{STATUS}: {e}") from None


def clear(run: FolderRun, names: Spelling = CLI) -> None:
    """Remove what the run in ``run.folder`` wrote, and nothing else (``--overwrite``).

    Raises:
        UserError: a file cannot be removed.
    """
    folder = run.folder
    # Read before the run's files go: config.toml is one of them.
    recorded = _recorded_checkpoint_dir(folder) if run.run_id else None
    try:
        for name in (*RUN_FILES, *TEMP_FILES):
            p = folder / name
            if p.is_file() or p.is_symlink():
                p.unlink()
    except OSError as e:
        raise UserError(f"{names.overwrite}: cannot remove {e.filename} ({e.strerror})") \
            from None
    if run.run_id:
        default = str(folder / "checkpoints")
        _remove_checkpoints(_location(folder, recorded or default, run.run_id), names)
        if recorded is None or absolute_base(recorded) == absolute_base(default):
            _remove_if_empty(Path(default))


def _recorded_checkpoint_dir(folder: Path) -> str | None:
    try:
        return RunConfig.from_toml(folder / "config.toml").checkpoint_dir
    except UserError:
        return None


def _remove_checkpoints(url: str, names: Spelling) -> None:
    """Delete the checkpoint folders in one run's location, then the location if empty."""
    from fsspec.core import url_to_fs

    try:
        fs, root = url_to_fs(url)
        if not fs.isdir(root):
            return
        for entry in fs.ls(root, detail=False):
            if _CHECKPOINT_DIR.fullmatch(entry.rstrip("/").rsplit("/", 1)[-1]) and fs.isdir(entry):
                fs.rm(entry, recursive=True)
        if not fs.ls(root, detail=False):
            fs.rmdir(root)
    except OSError as e:
        raise UserError(f"{names.overwrite}: cannot remove the old run's checkpoints in "
                        f"{url} ({e.strerror or e})") from None


def _remove_if_empty(path: Path) -> None:
    try:
        if path.is_dir() and not any(path.iterdir()):
            path.rmdir()
    except OSError:
        pass  # not ours to insist on
