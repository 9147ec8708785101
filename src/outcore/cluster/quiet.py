"""The quieting of the logs of the clusters outcore starts: failed tasks (the client reports
them in one line) and the comms' deliberate size probe. Imported only where a Dask cluster
starts (``outcore.cluster.start``): its plugin is one of distributed's."""

from __future__ import annotations

import logging
import os

import distributed


class _NoComputeFailed(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Compute Failed")


class _NoSizeProbe(logging.Filter):
    """Drops distributed's "Sizeof calculation ... failed. Defaulting to -1 B": before a
    message is sent, its comm estimates the size with a default of -1 only to choose whether
    to serialise it in a thread, and dask's estimate gives up (RecursionError) on a deeply
    nested message such as the profile a performance report collects; the message is then
    serialised in a thread and sent whole. Other size failures (another default) still log."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = str(record.msg)
        return not ("Sizeof calculation" in text and "Defaulting to -1 B" in text)


def quiet_size_probes() -> None:
    """Keep this process's comms from logging their deliberate size probe (``_NoSizeProbe``),
    unless ``OUTCORE_LOG_LEVEL`` is INFO or DEBUG."""
    if os.environ.get("OUTCORE_LOG_LEVEL", "WARNING").upper() in ("INFO", "DEBUG"):
        return
    log = logging.getLogger("distributed.sizeof")
    if not any(isinstance(f, _NoSizeProbe) for f in log.filters):
        log.addFilter(_NoSizeProbe())


class QuietTaskErrors(distributed.WorkerPlugin):
    """Keeps the workers of the clusters outcore starts from logging every failed task with
    its traceback ("Compute Failed"): the client raises the same error, which outcore reports
    in one line (and with ``--debug`` with that traceback); and from logging their comms'
    size probe (``quiet_size_probes``). ``OUTCORE_LOG_LEVEL=INFO`` or ``DEBUG`` keeps these
    logs."""

    name = "outcore-quiet-task-errors"

    def setup(self, worker: distributed.Worker) -> None:
        if os.environ.get("OUTCORE_LOG_LEVEL", "WARNING").upper() in ("INFO", "DEBUG"):
            return
        log = logging.getLogger("distributed.worker")
        if not any(isinstance(f, _NoComputeFailed) for f in log.filters):
            log.addFilter(_NoComputeFailed())
        quiet_size_probes()
