"""Progress of a computation, in the form the output can show: an updating bar in a terminal,
a widget in a notebook, and elsewhere (a log file, a batch job's output) a plain line at most
every ``LOG_INTERVAL_S`` seconds, never carriage-return frames."""

from __future__ import annotations

import sys
import time
from contextlib import suppress
from contextvars import ContextVar
from typing import Any

import distributed
from dask.utils import format_time
from distributed.diagnostics.progressbar import TextProgressBar
from distributed.utils import is_kernel

#: Whether ``compute`` shows progress; ``run_job`` sets it from ``--no-progress``.
SHOW_PROGRESS: ContextVar[bool] = ContextVar("outcore_show_progress", default=True)
#: Seconds between two progress lines when the output is not a terminal.
LOG_INTERVAL_S = 10.0


class LineProgress(TextProgressBar):
    """dask's text progress bar as plain lines: one at the start, one at most every
    ``LOG_INTERVAL_S`` seconds, one at the end."""

    def __init__(self, keys: Any, **kwargs: Any) -> None:
        self._last = -float("inf")
        super().__init__(keys, **kwargs)

    def _draw_bar(self, remaining: int, all: int, **kwargs: Any) -> None:  # noqa: A002
        now = time.monotonic()
        if remaining and now - self._last < LOG_INTERVAL_S:
            return
        self._last = now
        done = all - remaining
        percent = int(100 * done / all) if all else 100
        with suppress(ValueError):
            print(f"progress: {done}/{all} tasks ({percent}%), {format_time(self.elapsed)}",
                  flush=True)

    def _draw_stop(self, **kwargs: Any) -> None:
        pass


def follow(futures: list[distributed.Future]) -> None:
    """Show the progress of ``futures`` until they finish: in a notebook a widget where
    ipywidgets is installed (displayed: ``distributed.progress`` only returns it) and dask's
    text bar where it is not; a bar on a terminal; plain lines elsewhere. The bar watches
    the futures' own scheduler (not the default client's, which may be another one: a
    command run inside ``with Client():``)."""
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
        LineProgress(held, **where)


def compute(client: distributed.Client, *collections: Any, show: bool | None = None
            ) -> list[Any]:
    """Compute dask collections on the cluster, showing progress unless ``--no-progress``."""
    futures = client.compute(list(collections))
    if SHOW_PROGRESS.get() if show is None else show:
        follow(futures)
    return client.gather(futures)
