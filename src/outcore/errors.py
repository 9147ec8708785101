"""Errors a user can meet. Each names the problem and the fix, and is raised before compute
where it can be known then.

Errors name options in the caller's words. Outside the command line's own modules (``cli.py``,
the families' ``cli`` and ``verbs``, ``settings``, ``runner``) a message names a keyword as a
Python caller writes it, ``name=`` or ``name=value`` (``memory_limit=``, ``block=64``), never a
``--flag``; the command line rewrites each keyword its verb has as that flag when it reports
the error (``settings.in_flags``).

This module is also the one place where library exceptions become user errors: ``reading``
turns what a reader library raises on an unreadable file (``zipfile.BadZipFile``, h5py's
``OSError``, astropy's and tifffile's errors, a ``JSONDecodeError`` in zarr metadata, a
chunk that fails to decode) into ``InputDamagedError``; ``translate`` turns a failed write
(no space left, file too large, a read-only or forbidden place) into ``OutputWriteError``.
"""

from __future__ import annotations

import contextlib
import errno
import traceback
import uuid
from collections.abc import Iterator, Sequence
from os import PathLike
from pathlib import Path


class OutcoreError(Exception):
    """Base of outcore's user-facing errors: ``problem`` says what is wrong, ``fix`` what to do."""

    def __init__(self, problem: str, fix: str = "") -> None:
        self.problem = problem
        self.fix = fix
        super().__init__(f"{problem} Fix: {fix}" if fix else problem)

    def __reduce__(self) -> tuple:
        # raised inside dask tasks too: keep problem and fix apart on the way to the client
        return type(self), (self.problem, self.fix)


class ArgumentError(OutcoreError, TypeError):
    """A public function was called with an argument it does not take, or of the wrong kind
    (an unknown keyword, a numpy array where it needs dims, a missing argument)."""


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


class InputDamagedError(OutcoreError, ValueError):
    """An input file or store cannot be read: empty, truncated, corrupted, or another format."""


class OutputWriteError(OutcoreError, OSError):
    """An output cannot be written: no space left, a file too large, a read-only or forbidden
    place."""


#: errno of a failed write, and what it means for the user: (problem, fix).
_WRITE_ERRNOS = {
    errno.ENOSPC: ("No space left on the device", "free space there, or write to another"
                   " place (output_dir=, or the output path)."),
    errno.EDQUOT: ("The disk quota is exceeded", "free space in your quota, or write to another"
                   " place (output_dir=, or the output path)."),
    errno.EFBIG: ("A file grew too large (over the filesystem's or the process's file size"
                  " limit, see ulimit -f)", "raise the limit (ulimit -f unlimited), or write"
                  " to another filesystem."),
    errno.EROFS: ("The filesystem is read-only", "write to another place (output_dir=, or"
                  " the output path)."),
    errno.EACCES: ("Permission denied", "write where you may (output_dir=, or the output"
                   " path), or fix the permissions."),
}


#: Where in a traceback a chunk of a zarr store is decoded.
_DECODERS = ("/numcodecs/", "/zarr/codecs/", "/zarr/core/codec_pipeline")


def translate(error: BaseException, inputs: Sequence[str | PathLike[str]] = ()
              ) -> OutcoreError | None:
    """The user error that ``error`` stands for, or None when it is not one (a bug): an
    ``OutcoreError`` itself; an ``OSError`` of a failed write (ENOSPC, EDQUOT, EFBIG, EROFS,
    EACCES) as ``OutputWriteError`` naming the file; dask's ``KilledWorker`` (a task whose
    workers all died, mostly for memory); a chunk that a zarr codec failed to decode, read
    outside ``outcore.open`` (which names the chunk itself), as the ``InputDamagedError`` of
    the job's ``inputs``."""
    if isinstance(error, OutcoreError):
        return error
    if type(error).__name__ == "KilledWorker":  # distributed's, known by name: no import here
        return OutcoreError(f"Every worker that ran a task died ({error}); usually the task"
                            " needs more memory than a worker has.", "use a smaller chunk size"
                            " or a higher memory_limit=, and compare the summary's"
                            " peak_worker_rss_bytes with the plan.")
    if isinstance(error, OSError) and error.errno in _WRITE_ERRNOS:
        problem, fix = _WRITE_ERRNOS[error.errno]
        where = f"{error.filename!r}: " if error.filename else ""
        return OutputWriteError(f"{problem} ({where}[Errno {error.errno}] {error.strerror});"
                                " the run did not complete.", fix)
    frames = traceback.extract_tb(error.__traceback__)
    if not isinstance(error, MemoryError) and any(
            decoder in frame.filename for frame in frames for decoder in _DECODERS):
        stores = ", ".join(repr(str(path)) for path in inputs) or "an input store"
        return unreadable(f"a chunk of {stores}", error, "restore the store from a good copy,"
                          " or write it again from its source.")
    return None


def unreadable(subject: str, error: BaseException, fix: str) -> InputDamagedError:
    """The ``InputDamagedError`` of ``subject`` (e.g. "the NPZ file 'x.npz'"), which a
    library could not read, raising ``error``."""
    detail = f"{type(error).__name__}: {error}".replace("\n", " ").strip()
    return InputDamagedError(f"{subject[:1].upper()}{subject[1:]} cannot be read ({detail}):"
                             " the input is damaged (empty, truncated or corrupted) or not in"
                             " that format.", fix)


@contextlib.contextmanager
def reading(subject: str, fix: str) -> Iterator[None]:
    """Turn any exception a reader library raises inside the block into the
    ``InputDamagedError`` of ``subject`` with ``fix`` (an ``OutcoreError`` passes as it is).

    Keep the block to the library calls that read the input, so that nothing else is taken
    for damage; the original exception is kept in the message and as ``__cause__``.
    """
    try:
        yield
    except (OutcoreError, MemoryError):
        raise
    except Exception as err:
        raise unreadable(subject, err, fix) from err


def refuse_existing(path: str | PathLike[str]) -> Path:
    """Return ``path`` when nothing exists there, else ``RunExistsError``: never overwrite."""
    path = Path(path)
    if path.exists():
        raise RunExistsError(
            f"{str(path)!r} already exists; outcore never overwrites a run or an output.",
            "choose another name=, output_dir= or output path, or move the old one away.",
        )
    return path


def partial_path(path: str | PathLike[str], token: str | None = None) -> Path:
    """Where ``path`` is written until it is complete: ``<name>.partial-<token>`` beside it
    (a new 12-hex token by default), renamed to ``path`` when done, so that nothing half
    written stands under the name of a finished output."""
    path = Path(path)
    return path.with_name(f"{path.name}.partial-{token or uuid.uuid4().hex[:12]}")
