"""Fit stamps with cuPhoton's ``xfit`` numpy backend; run by ``bench_fit.py`` in the peer venv.

    benchmarks/peers/.venv-cuphoton/bin/python benchmarks/peers/cuphoton_runner.py \
        STAMPS_DIR OUT.npz [--runs 1] [--batch 0]

Reads ``images.npy`` and ``variance.npy`` (``(n, ny, nx)``) from ``STAMPS_DIR``, fits them
the way cuPhoton's local executor does (``cuphoton.xfit.fit_dipoles`` on the whole batch in
this one process, its own start and default tolerances; ``--batch k`` fits ``k`` stamps per
call instead), writes the fits to ``OUT.npz`` in outcore's parameter order and conventions,
and prints one JSON line: wall and CPU seconds per run, peak resident memory of this process
(sampled every 20 ms, and the kernel's high-water mark reset after the stamps are loaded),
resident memory before the fit, status counts and versions.

cuPhoton's Gaussian dipole is ``A * (g(x_pos, y_pos) - g(x_neg, y_neg))`` with ``g`` an
elliptical Gaussian of peak 1, widths ``sigma_x, sigma_y`` rotated by ``theta``, no
background, on the same centred pixel grid as outcore (``x = j - (nx - 1) / 2`` along the
last axis, ``y = i - (ny - 1) / 2``). Mapped to outcore's ``gaussian`` parameters
``(x_pos, y_pos, x_neg, y_neg, flux_pos, flux_neg, sigma, background)``:

- ``flux_pos = 2 pi A sigma_x sigma_y`` (a lobe's integral), ``flux_neg = -flux_pos``;
- when ``A < 0`` the lobes are relabelled (positions swapped, ``A -> -A``) so that the lobe
  called positive has positive flux, as in outcore's truth;
- ``sigma = sqrt(sigma_x sigma_y)`` (the circular width of equal area);
- ``background = 0`` (not a cuPhoton parameter; its error NaN).

Errors come from cuPhoton's covariance (``standard_errors``; the flux error propagated
through ``2 pi A sigma_x sigma_y`` with the full covariance). This script only uses the
standard library, numpy and cuphoton, so it runs in cuPhoton's own environment.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import threading
import time
from importlib import metadata
from pathlib import Path

import numpy as np

PAGE = os.sysconf("SC_PAGE_SIZE")
#: outcore's gaussian parameter order (outcore.fit.models.GAUSSIAN_PARAMS).
OUTCORE_PARAMS = ("x_pos", "y_pos", "x_neg", "y_neg", "flux_pos", "flux_neg", "sigma",
                  "background")


def rss() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * PAGE


def high_water() -> int:
    """The kernel's peak resident set of this process (VmHWM), bytes."""
    with open("/proc/self/status") as fh:
        for row in fh:
            if row.startswith("VmHWM:"):
                return int(row.split()[1]) * 1024
    return 0


def reset_high_water() -> bool:
    """Reset VmHWM to the current RSS (Linux >= 4.0); False where not allowed."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


class Sampler:
    """Peak RSS of this process, polled every ``interval`` seconds on a thread."""

    def __init__(self, interval: float = 0.02) -> None:
        self.peak = rss()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, args=(interval,), daemon=True)

    def _poll(self, interval: float) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, rss())
            self._stop.wait(interval)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss())


def to_outcore(names: tuple[str, ...], params: np.ndarray, errors: np.ndarray,
               covariance: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """cuPhoton gaussian fits ``(n, 8)`` -> outcore's parameters and errors ``(n, 8)``."""
    col = {name: params[:, i] for i, name in enumerate(names)}
    err = {name: errors[:, i] for i, name in enumerate(names)}
    ia, isx, isy = names.index("amplitude"), names.index("sigma_x"), names.index("sigma_y")
    amp, sx, sy = col["amplitude"], col["sigma_x"], col["sigma_y"]
    flip = amp < 0
    flux = 2 * math.pi * np.abs(amp) * sx * sy
    # d flux / d (A, sigma_x, sigma_y), then g^T C g with cuPhoton's covariance
    grad = np.zeros_like(params)
    grad[:, ia] = 2 * math.pi * sx * sy
    grad[:, isx] = 2 * math.pi * amp * sy
    grad[:, isy] = 2 * math.pi * amp * sx
    with np.errstate(invalid="ignore"):
        flux_err = np.sqrt(np.einsum("ni,nij,nj->n", grad, covariance, grad))
    sigma = np.sqrt(sx * sy)
    sigma_err = 0.5 * sigma * np.hypot(err["sigma_x"] / sx, err["sigma_y"] / sy)  # ignores cov

    def lobe(a: str, b: str, e: dict) -> tuple[np.ndarray, np.ndarray]:
        return np.where(flip, e[b], e[a]), np.where(flip, e[a], e[b])

    out = np.empty((params.shape[0], 8))
    out_err = np.empty_like(out)
    for src, dst in ((col, out), (err, out_err)):
        dst[:, 0], dst[:, 2] = lobe("x_pos", "x_neg", src)
        dst[:, 1], dst[:, 3] = lobe("y_pos", "y_neg", src)
    out[:, 4], out[:, 5], out[:, 6], out[:, 7] = flux, -flux, sigma, 0.0
    out_err[:, 4], out_err[:, 5], out_err[:, 6], out_err[:, 7] = flux_err, flux_err, sigma_err, \
        np.nan
    return out, out_err


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("stamps", type=Path,
                        help="folder with images.npy and variance.npy, (n, ny, nx) each")
    parser.add_argument("out", type=Path, help=".npz written with the fits, outcore's order")
    parser.add_argument("--runs", type=int, default=1, help="timed runs")
    parser.add_argument("--batch", type=int, default=0,
                        help="stamps per fit_dipoles call (0: all at once, as its local executor)")
    args = parser.parse_args()

    from cuphoton.xfit import fit_dipoles

    images = np.ascontiguousarray(np.load(args.stamps / "images.npy"), dtype=np.float64)
    variance = np.ascontiguousarray(np.load(args.stamps / "variance.npy"), dtype=np.float64)
    n = images.shape[0]
    batch = args.batch or n

    def fit_all() -> list:
        return [fit_dipoles(images[i:i + batch], variance=variance[i:i + batch],
                            model="gaussian", backend="numpy") for i in range(0, n, batch)]

    fit_dipoles(images[:8], variance=variance[:8], model="gaussian", backend="numpy")  # warm-up
    walls, cpus, peak, base = [], [], 0, rss()
    results = None
    for _ in range(args.runs):
        results = None  # drop the previous run's results before the next one
        base = rss()
        reset = reset_high_water()
        with Sampler() as sampler:
            t0, c0 = time.perf_counter(), time.process_time()
            results = fit_all()
            walls.append(time.perf_counter() - t0)
            cpus.append(time.process_time() - c0)
        peak = max(peak, sampler.peak, high_water() if reset else 0)

    names = results[0].parameter_names
    params, errors = to_outcore(
        names,
        np.concatenate([r.parameters for r in results]),
        np.concatenate([r.standard_errors for r in results]),
        np.concatenate([r.covariance for r in results]),
    )
    status = np.concatenate([r.status for r in results])
    converged = np.concatenate([r.converged for r in results])
    np.savez(args.out, params=params, errors=errors, converged=converged,
             evaluations=np.concatenate([r.evaluations for r in results]),
             names=np.asarray(OUTCORE_PARAMS))
    values, counts = np.unique(status, return_counts=True)
    print(json.dumps({
        "n": n, "batch": batch, "walls": walls, "cpu_s": cpus, "peak_rss_bytes": int(peak),
        "base_rss_bytes": int(base), "converged": int(converged.sum()),
        "status_counts": {str(v): int(c) for v, c in zip(values, counts, strict=True)},
        "backend": results[0].backend, "device": results[0].device,
        "model": results[0].model, "parameter_names": list(names),
        "versions": {"cuphoton": metadata.version("cuphoton"), "numpy": np.__version__,
                     "scipy": metadata.version("scipy"), "python": platform.python_version()},
    }), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
