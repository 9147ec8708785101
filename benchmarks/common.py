"""Shared pieces of the benchmark scripts: the JSON line, machine facts, memory sampling.

Every script prints one JSON object per line and case (DESIGN.md "Benchmark lines"), so runs
compare with a few lines of Python. Quote medians and ratios from the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psutil

import outcore
from outcore.backend import devices, namespace, resolve
from outcore.errors import OutcoreError
from outcore.runs import versions


def machine() -> dict[str, Any]:
    gpus = devices()
    return {"cpus": os.cpu_count(), "gpu": gpus[0]["name"] if gpus else None}


def add_backend(parser: argparse.ArgumentParser, help: str) -> None:
    """The ``--backend`` option of a benchmark: ``numpy`` (default) or ``cupy``."""
    parser.add_argument("--backend", choices=["numpy", "cupy"], default="numpy", help=help)


def check_backend(parser: argparse.ArgumentParser, name: str) -> str:
    """``name`` when it is usable here, else exit with outcore's one-line error and its fix."""
    try:
        return resolve(name)
    except OutcoreError as err:
        parser.exit(2, f"{parser.prog}: {err}\n")


def synchronize(backend: str) -> None:
    """Wait until the GPU has finished the work queued so far (nothing to wait for on numpy)."""
    if backend == "cupy":
        namespace("cupy").cuda.get_current_stream().synchronize()


def timed(run: Callable[[], object], runs: int, setup: Callable[[], object] | None = None
          ) -> list[float]:
    """Wall seconds of ``runs`` calls of ``run`` (``setup`` before each, outside the clock)."""
    walls = []
    for _ in range(runs):
        if setup is not None:
            setup()
        t0 = time.perf_counter()
        run()
        walls.append(time.perf_counter() - t0)
    return walls


@contextmanager
def sample_memory(pids: list[int], interval: float = 0.02) -> Iterator[dict[str, int]]:
    """Peak resident memory of ``pids`` while open: the largest process and all summed."""
    procs = [psutil.Process(pid) for pid in pids]
    peaks = {"one": 0, "all": 0}
    stop = threading.Event()

    def poll() -> None:
        while not stop.is_set():
            sizes = [proc.memory_info().rss for proc in procs]
            peaks["one"] = max(peaks["one"], max(sizes))
            peaks["all"] = max(peaks["all"], sum(sizes))
            stop.wait(interval)

    thread = threading.Thread(target=poll, daemon=True)
    thread.start()
    try:
        yield peaks
    finally:
        stop.set()
        thread.join()


def line(bench: str, tool: str, case: dict, metric: str, value: float, walls: list[float],
         **extra: Any) -> dict[str, Any]:
    """Print and return one benchmark line."""
    record = {
        "bench": bench, "tool": tool, "case": case, "metric": metric,
        "value": round(value, 6), "runs": len(walls),
        "median_s": round(statistics.median(walls), 6),
        "min_s": round(min(walls), 6), "max_s": round(max(walls), 6),
        **extra,
        "machine": machine(),
        "versions": {"outcore": outcore.__version__, **versions()},
    }
    print(json.dumps(record), flush=True)
    return record


def skipped(bench: str, tool: str, case: dict, metric: str, note: str,
            **extra: Any) -> dict[str, Any]:
    """Print and return the line of a tool that could not run: ``value`` null and why."""
    record = {"bench": bench, "tool": tool, "case": case, "metric": metric, "value": None,
              "note": note, **extra, "machine": machine(),
              "versions": {"outcore": outcore.__version__, **versions()}}
    print(json.dumps(record), flush=True)
    return record
