"""Errors a user can meet. Each names the problem and the fix, and is raised before compute."""

from __future__ import annotations

from os import PathLike
from pathlib import Path


class OutcoreError(Exception):
    """Base of outcore's user-facing errors: ``problem`` says what is wrong, ``fix`` what to do."""

    def __init__(self, problem: str, fix: str = "") -> None:
        self.problem = problem
        self.fix = fix
        super().__init__(f"{problem} Fix: {fix}" if fix else problem)


class LayoutError(OutcoreError, ValueError):
    """A dataset or file does not match the layout it claims (dims, dtype, attrs, values)."""


class BackendError(OutcoreError, RuntimeError):
    """The requested array backend cannot be used here (no GPU, cupy missing)."""


class ClusterError(OutcoreError, ValueError):
    """A cluster cannot be started or joined as asked, or an option does not apply to it."""


class PlanError(OutcoreError, MemoryError):
    """A plan does not fit the memory given."""


class RunExistsError(OutcoreError, FileExistsError):
    """The run directory or an output already exists; outcore never overwrites."""


class InputNotFoundError(OutcoreError, FileNotFoundError):
    """An input path (store, file, directory or glob) does not exist."""


def refuse_existing(path: str | PathLike[str]) -> Path:
    """Return ``path`` when nothing exists there, else ``RunExistsError``: never overwrite."""
    path = Path(path)
    if path.exists():
        raise RunExistsError(
            f"{str(path)!r} already exists; outcore never overwrites a run or an output.",
            "choose another --name, --output-dir or output path, or move the old one away.",
        )
    return path
