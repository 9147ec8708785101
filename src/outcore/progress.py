"""Progress of a computation, in the form the output can show: an updating bar in a terminal,
a widget in a notebook, and elsewhere (a log file, a batch job's output) a plain line at most
every ``LOG_INTERVAL_S`` seconds, never carriage-return frames; on a Dask cluster (a client's
futures) and on dask's threaded scheduler of this process (no client) alike."""

from __future__ import annotations

import contextlib
import functools
import sys
import time
from collections.abc import Iterator
from contextlib import suppress
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from dask.utils import format_time

if TYPE_CHECKING:
    import distributed

#: Whether ``compute`` shows progress; ``run_job`` sets it from ``--no-progress``.
SHOW_PROGRESS: ContextVar[bool] = ContextVar("outcore_show_progress", default=True)
#: Seconds between two progress lines when the output is not a terminal.
LOG_INTERVAL_S = 10.0


class _Lines:
    """The plain progress lines: one at the start (once there are tasks), one at most every
    ``LOG_INTERVAL_S`` seconds, one at the end."""

    _last = -float("inf")

    def _line(self, done: int, total: int, elapsed: float, last: bool) -> None:
        now = time.monotonic()
        if not last and (not total or now - self._last < LOG_INTERVAL_S):
            return
        self._last = now
        percent = int(100 * done / total) if total else 100
        with suppress(ValueError):
            print(f"progress: {done}/{total} tasks ({percent}%), {format_time(elapsed)}",
                  flush=True)


@functools.cache
def _line_progress() -> type:
    """``LineProgress``: distributed's text progress bar of futures as ``_Lines``."""
    from distributed.diagnostics.progressbar import TextProgressBar

    class LineProgress(_Lines, TextProgressBar):
        """dask's text progress bar as plain lines (``_Lines``)."""

        def __init__(self, keys: Any, **kwargs: Any) -> None:
            self._last = -float("inf")
            super().__init__(keys, **kwargs)

        def _draw_bar(self, remaining: int, all: int, **kwargs: Any) -> None:  # noqa: A002
            self._line(all - remaining, all, self.elapsed, last=not remaining)

        def _draw_stop(self, **kwargs: Any) -> None:
            pass

    return LineProgress


def __getattr__(name: str) -> Any:
    """``LineProgress``, made on first use: its base class is distributed's, which a run on
    dask's threaded scheduler never imports."""
    if name == "LineProgress":
        return _line_progress()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def follow(futures: list[distributed.Future]) -> None:
    """Show the progress of ``futures`` until they finish: in a notebook a widget where
    ipywidgets is installed (displayed: ``distributed.progress`` only returns it) and dask's
    text bar where it is not; a bar on a terminal; plain lines elsewhere. The bar watches
    the futures' own scheduler (not the default client's, which may be another one: a
    command run inside ``with Client():``)."""
    import distributed
    from distributed.utils import is_kernel

    held = distributed.client.futures_of(futures)
    where = {"scheduler": held[0].client.scheduler.address} if held else {}
    if is_kernel():
        try:  # the widget's own imports: a kernel may run without ipywidgets
            import ipywidgets  # noqa: F401
            from IPython.display import display
        except ImportError:
            distributed.progress(futures, notebook=False, multi=False, **where)
            return

        display(distributed.progress(futures, notebook=True, multi=False, **where))
    elif sys.stdout.isatty():
        distributed.progress(futures, notebook=False, multi=False, **where)
        print(flush=True)
    else:
        _line_progress()(held, **where)


def compute(client: distributed.Client | None, *collections: Any, show: bool | None = None
            ) -> list[Any]:
    """Compute dask collections on ``client``'s cluster, or without one on dask's threaded
    scheduler of this process (``dask.compute``'s default there), showing progress unless
    ``--no-progress``."""
    show = SHOW_PROGRESS.get() if show is None else show
    if client is None:
        import dask

        with local_progress() if show else contextlib.nullcontext():
            return list(dask.compute(*collections))
    futures = client.compute(list(collections))
    if show:
        follow(futures)
    return client.gather(futures)


@contextlib.contextmanager
def local_progress() -> Iterator[None]:
    """Progress of the ``dask.compute`` calls inside on dask's local schedulers: dask's bar
    on a terminal, plain lines elsewhere (``LocalLines``)."""
    from dask.diagnostics import ProgressBar

    with ProgressBar() if sys.stdout.isatty() else _local_lines():
        yield


def _local_lines() -> Any:
    """dask's local progress bar (``dask.diagnostics``) as ``_Lines``."""
    from dask.diagnostics import ProgressBar

    class LocalLines(_Lines, ProgressBar):
        def __init__(self) -> None:
            super().__init__(dt=0.5)
            self._last = -float("inf")

        def _start(self, dsk: Any) -> None:
            self._clock = time.monotonic()
            super()._start(dsk)

        def _update_bar(self, elapsed: float) -> None:
            state = self._state
            done = len(state["finished"]) if state else 0
            total = done + (sum(len(state[k]) for k in ("ready", "waiting", "running"))
                            if state else 0)
            self._line(done, total, elapsed, last=False)

        def _finish(self, dsk: Any, state: Any, errored: bool) -> None:
            self._running = False
            self._timer.join()
            if not errored:
                total = len(state["finished"]) if state else 0
                self._line(total, total, time.monotonic() - self._clock, last=True)

    return LocalLines()
