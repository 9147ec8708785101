"""Resuming a reconstruction: the earlier run checked, and its options kept.

``tomo reconstruct --resume --resume-from RUN_DIR`` goes on from the earlier run's last
checkpoint with the earlier run's volume, blocks, partition, centre and corrections, so that
the volume equals that of an uninterrupted run bit for bit: :func:`earlier_run` checks the
run, :func:`same` takes each of its options (refusing a different one given), and
:func:`check_corrections` refuses other corrections.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from outcore.errors import OutcoreError
from outcore.runs import resumed_run
from outcore.tomo.reconstruction.solvers import STATE

#: The solver's work directory in a run directory (zarr vectors, ``state.json``).
WORK = "work"


@dataclass(frozen=True)
class Earlier:
    """The run a resumed reconstruction goes on from: its directory, effective config and
    the iteration of its last checkpoint."""

    path: Path
    config: dict
    iteration: int


def earlier_run(run_dir: str, method: str, input_path: Path, iterations: int) -> Earlier:
    """The earlier run of ``--resume-from``, checked: a ``tomo reconstruct`` of the same
    input and method with a checkpoint at or before ``iterations``."""
    path, record = resumed_run(run_dir, "tomo reconstruct")
    config = record.get("config") or {}
    if config.get("method") != method:
        raise OutcoreError(f"{str(path)!r} ran --method {config.get('method')}, not {method}.",
                           f"resume it with --method {config.get('method')}.")
    if config.get("input") != str(input_path):
        raise OutcoreError(f"{str(path)!r} reconstructed {config.get('input')!r}, not "
                           f"{str(input_path)!r}.", f"resume it with --input "
                           f"{config.get('input')}, or start a new run without --resume.")
    state = path / WORK / STATE
    if not state.is_file():
        raise OutcoreError(f"{str(path)!r} has no checkpoint ({WORK}/{STATE}).",
                           "run the reconstruction again without --resume.")
    iteration = int(json.loads(state.read_text())["iteration"])
    if iteration > iterations:
        raise OutcoreError(f"{str(path)!r} is already at iteration {iteration}; --iterations "
                           f"{iterations} is the total to reach.",
                           f"pass --iterations {iteration} or more.")
    return Earlier(path, config, iteration)


def same(given: Any, earlier: Any, flag: str) -> Any:
    """The earlier run's value of an option, refusing a different explicit one."""
    if given is not None and earlier is not None and given != earlier:
        raise OutcoreError(f"{flag} {given} differs from the resumed run's {earlier}.",
                           f"drop {flag} (the resumed run's value is used) or start a new run.")
    return earlier if earlier is not None else given


def check_corrections(earlier: Earlier | None, corrections: dict[str, Any]) -> None:
    """Refuse to resume ``earlier`` with other corrections (``steps.records``) than its own."""
    old = earlier.config.get("corrections", {}) if earlier is not None else None
    if earlier is not None and old != corrections:
        raise OutcoreError("--resume needs the corrections of the earlier run "
                           f"({old}), not {corrections}.",
                           "pass the earlier run's correction options, or start a new run.")
