"""The ptychography verbs, one thin module each (``add_arguments(p)``, ``make_job(args,
resources) -> Job``): they parse and check the options, then call the public functions of
``outcore.ptycho`` (``simulate``, ``preprocess``, ``reconstruct``, ``frc``) with the plan
the runner printed and write the run directory. ``outcore.ptycho.cli`` lists them."""

from __future__ import annotations

import argparse

from outcore.errors import OutcoreError
from outcore.settings import in_flags


def in_flag_words(notes: list[str], args: argparse.Namespace) -> list[str]:
    """The warnings ``notes`` (in Python's words: keywords) with each keyword the verb has
    written as its flag, as the command line says them."""
    flags = getattr(args, "flags", None) or {}
    return [in_flags(OutcoreError(note, ""), flags).problem for note in notes]  # type: ignore[attr-defined]
