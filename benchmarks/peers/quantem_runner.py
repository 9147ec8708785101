"""Time quantEM's ptychography per iteration on a stack written by ``bench_ptycho.py``.

Runs in quantEM's own venv (``make_quantem_venv.sh``): only the standard library, numpy,
psutil, torch and quantem. Reads an ``.npz`` with ``amplitudes`` (n, K, K) float32 (zero
frequency at K // 2, outcore's convention), ``top_left`` (n, 2) (row-major raster), ``scan``
(rows, cols), ``step`` (object pixels between positions), ``guess`` (the starting probe,
(K, K) complex64, centred), ``probe`` and ``truth`` (for the model check), and prints one JSON
line per case (the fields of ``benchmarks/common.py``'s lines, less ``machine``, which the
caller adds).

How outcore's scan becomes quantEM's (quantem 0.1.10, read from its source):

- ``PtychographyDatasetRaster.from_array`` takes the intensities as a 4D raster
  ``(rows, cols, K, K)`` with samplings ``(step, step, 1/K, 1/K)`` in ``A, A, A^-1, A^-1``, so
  that one object pixel is 1 A (``obj_sampling = 1 / (K * reciprocal_sampling)``) and the
  raster steps ``step`` pixels, as outcore's; descan and position learning are off.
- ``Ptychography.preprocess`` with ``com_fit_function="no_shift"`` (its centring shifts each
  pattern by ``-K/2`` and ``fftshift``s it back: the patterns stay as they are),
  ``force_com_rotation=0``, ``force_com_transpose=False`` and ``obj_padding_px = K/2``: the
  object is then ``(scan - 1) * step + K`` pixels a side, outcore's, and position ``j`` sits at
  the window centre ``top_left + K/2`` (quantEM cuts windows around a centre, in FFT order).
- The probe guess goes in ``ifftshift``-ed (quantEM's probes are corner-centred):
  ``ProbePixelated.from_array``; the object starts at ones, ``ObjectPixelated.from_uniform``
  (complex, one slice), as outcore's; ``DetectorPixelated`` is the far-field detector.
  ``model_check`` puts the true object and probe in and compares quantEM's predicted
  amplitudes with the data: a relative error at rounding level means the same model.
- ``Ptychography.reconstruct(num_iters, batch_size, optimizer_params, autograd)``: mode
  ``gd`` is ``autograd=False`` (its analytic gradient of the amplitude L2 loss, rescaled to
  the ePIE step) with SGD on object and probe, the closest to outcore's preconditioned step;
  mode ``adam`` is autograd with Adam (its usual route). Both update object and probe every
  batch. quantEM shifts the probe by each position's sub-pixel offset with an FFT pair
  (zero here, still computed) and applies its object constraints every step, which outcore
  does not.
- ``--ranks R``: ``reconstruct(device=[0, ..., R-1])`` spawns R processes over gloo (each
  ``batch // R`` positions, one CPU thread) for every call.

torch's CPU threads are OpenMP's: with more than one, its default wait policy spins at every
barrier, which on a shared machine (another process on the other core) costs several times
the work; the caller can start this runner with ``OMP_WAIT_POLICY=PASSIVE`` (recorded in
``case``) for the best quantEM gets here.

Per-iteration times: the Ptychography is made an instance of ``Timed``, a subclass whose
``_record_iter`` (called once at the end of each iteration, by rank 0 when there are ranks)
appends the wall clock and rank 0's CPU seconds to a file; so the ranks' iterations are timed
inside the spawned processes too, and ``fixed_s_per_call`` is the rest of a call (process
start, rendezvous, loading the state, returning it). Timed iterations follow a one-iteration
warm-up call; the first iteration of each call is not counted (it carries the start of
the call). ``setup_s`` (dataset preprocessing, model building) is outside the clock and
reported on its own.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import threading
import time
from importlib import metadata
from pathlib import Path

import numpy as np
import psutil
from quantem.diffractive_imaging import Ptychography

LR = {"gd": {"object": 0.5, "probe": 0.5}, "adam": {"object": 5e-3, "probe": 1e-3}}
#: Adam's step for the scan positions, pixels (``--learn-positions``).
POSITION_LR = 0.05


class Sampler:
    """Peak resident memory of this process and its children, polled on a thread."""

    def __init__(self, interval: float = 0.02) -> None:
        self.proc = psutil.Process()
        self.peak = 0
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _rss(self) -> int:
        total = self.proc.memory_info().rss
        for child in self.proc.children(recursive=True):
            try:
                total += child.memory_info().rss
            except psutil.Error:
                pass
        return total

    def _poll(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self._rss())
            self._stop.wait(self.interval)

    def __enter__(self) -> Sampler:
        self.peak = self._rss()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


class Timed(Ptychography):
    """quantEM's Ptychography, the end of each iteration logged to ``self._marks_path``
    (module level, so that spawned ranks unpickle it)."""

    _marks_path: str | None = None

    def _record_iter(self, iter_loss: float, autograd: bool) -> None:
        if self._marks_path:
            with open(self._marks_path, "a") as fh:
                fh.write(f"{time.time()!r} {time.process_time()!r}\n")
        super()._record_iter(iter_loss, autograd)


def build(data: dict, seed: int, obj: np.ndarray | None = None, probe: np.ndarray | None = None,
          learn_positions: bool = False):
    """quantEM's Ptychography of the stack (see the module docstring), preprocessed; the
    probe modes of ``data["guess"]`` ((K, K) or (M, K, K)); ``learn_positions``: its scan
    positions are optimised too."""
    from quantem.diffractive_imaging import (
        DetectorPixelated,
        ObjectPixelated,
        ProbePixelated,
        PtychographyDatasetRaster,
    )

    amplitudes = data["amplitudes"]
    n, k, _ = amplitudes.shape
    rows, cols = (int(v) for v in data["scan"])
    step = float(data["step"])
    intensities = (amplitudes.astype(np.float32) ** 2).reshape(rows, cols, k, k)
    dset = PtychographyDatasetRaster.from_array(
        intensities, sampling=(step, step, 1.0 / k, 1.0 / k), units=["A", "A", "A^-1", "A^-1"],
        verbose=0, learn_descan=False, learn_scan_positions=learn_positions)
    start = data["guess"] if probe is None else probe
    probe_model = ProbePixelated.from_array(
        np.fft.ifftshift(start, axes=(-2, -1)).astype(np.complex64))
    obj_model = ObjectPixelated.from_uniform(num_slices=1, obj_type="complex")
    ptycho = Ptychography.from_models(dset=dset, obj_model=obj_model, probe_model=probe_model,
                                      detector_model=DetectorPixelated(), device="cpu",
                                      verbose=0, rng=seed)
    ptycho.preprocess(obj_padding_px=(k // 2, k // 2), com_fit_function="no_shift",
                      force_com_rotation=0.0, force_com_transpose=False, plot_rotation=False,
                      plot_com=False)
    shape = tuple(int(s) for s in ptycho.obj_shape_full[-2:])
    expected = tuple(int(s) for s in data["object_shape"]) if "object_shape" in data \
        else tuple(data["truth"].shape)
    if shape != expected:
        raise SystemExit(f"quantEM's object is {shape}, outcore's {expected}: "
                         "the mapping of the scan is off")
    ptycho.__class__ = Timed
    if obj is not None:
        import torch

        with torch.no_grad():
            ptycho.obj_model._obj.data = torch.from_numpy(obj.astype(np.complex64))[None]
    return ptycho


def model_check(data: dict, seed: int, count: int = 128) -> dict:
    """quantEM's predicted amplitudes from the true object and probe against the data."""
    import torch

    truth, probe = data["truth"], data["probe"]
    ptycho = build(data, seed, obj=truth, probe=probe)  # one mode, the true one
    with torch.no_grad():
        # the true probe, unscaled (preprocess rescaled the guess to the mean intensity)
        ptycho.probe_model._probe.data = torch.from_numpy(
            np.fft.ifftshift(probe).astype(np.complex64))[None]
        index = torch.arange(min(count, len(data["amplitudes"])))
        patches, _, fractional, descan = ptycho.dset.forward(index, ptycho.obj_padding_px)
        probes = ptycho.probe_model.forward(fractional)
        _, overlap = ptycho.forward_operator(ptycho.obj_model.forward(patches), probes, descan)
        predicted = torch.sqrt(ptycho.detector_model.forward(overlap)).numpy()
    measured = data["amplitudes"][: len(index)]
    error = float(np.linalg.norm(predicted - measured) / np.linalg.norm(measured))
    return {"positions": int(len(index)), "relative_error": round(error, 8)}


def optimizer_params(mode: str, learn_positions: bool = False) -> dict:
    name = "sgd" if mode == "gd" else "adam"
    params = {key: {"name": name, "lr": lr} for key, lr in LR[mode].items()}
    if learn_positions:  # pixels; Adam's steps are about lr each
        params["dataset"] = {"name": "adam", "lr": POSITION_LR}
    return params


def marks_of(path: Path) -> list[tuple[float, float]]:
    if not path.exists():
        return []
    return [tuple(map(float, row.split())) for row in path.read_text().splitlines()]


def time_calls(data: dict, args: argparse.Namespace, mode: str, threads: int, ranks: int,
               work: Path) -> dict:
    """A warm-up call of one iteration, then one of ``1 + iterations``; walls from the marks.
    ``ranks`` > 1: quantEM's multi-process mode, ``reconstruct(device=[0..ranks-1])``."""
    import torch

    torch.set_num_threads(threads)
    t0 = time.perf_counter()
    ptycho = build(data, args.seed, learn_positions=args.learn_positions)
    setup_s = time.perf_counter() - t0
    autograd = mode == "adam"
    extra = {"device": list(range(ranks))} if ranks > 1 else {}
    calls = []
    with Sampler() as sampler:
        for i, iterations in enumerate((1, 1 + args.iterations)):
            path = work / f"marks-{mode}-{threads}-{ranks}-{i}.txt"
            ptycho._marks_path = str(path)
            start = time.time()
            ptycho.reconstruct(num_iters=iterations, batch_size=args.batch, autograd=autograd,
                               optimizer_params=optimizer_params(mode, args.learn_positions)
                               if i == 0 else None,
                               **extra)
            calls.append((start, time.time(), marks_of(path)))
    (w0, w1, _), (start, stop, marks) = calls
    if len(marks) != 1 + args.iterations:
        raise SystemExit(f"{len(marks)} iterations logged of {1 + args.iterations}")
    walls = [b[0] - a[0] for a, b in zip(marks[:-1], marks[1:], strict=True)]
    cpu = [b[1] - a[1] for a, b in zip(marks[:-1], marks[1:], strict=True)]
    case = {"threads": threads, "mode": mode, "ranks": max(ranks, 1),
            "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "default").lower()}
    if args.object_dir is not None:  # the final object, for bench_ptycho's object error
        name = f"object-{mode}-{threads}-{max(ranks, 1)}-{case['omp_wait_policy']}.npy"
        path = Path(args.object_dir) / name
        np.save(path, ptycho.obj_model._obj.detach().cpu().numpy()[0])
        case_file = str(path)
    else:
        case_file = None
    found = {"case": case, "walls": walls, "object_file": case_file,
             "setup_s": setup_s, "warmup_s": w1 - w0, "peak_rss_bytes": sampler.peak,
             "loss_first_last": [float(ptycho._iter_losses[0]), float(ptycho._iter_losses[-1])]}
    if ranks > 1:
        # the call less its timed iterations: spawn, rendezvous, state in and out
        found["fixed_s_per_call"] = round((stop - start) - sum(walls), 3)
        found["call_s"] = round(stop - start, 3)
        found["rank0_cpu_s_per_iteration"] = round(statistics.fmean(cpu), 5)
    else:
        found["cpu"] = cpu
        found["torch_threads"] = torch.get_num_threads()
    return found


def emit(found: dict, n: int, check: dict, peer: dict) -> None:
    walls = found.pop("walls")
    cpu = found.pop("cpu", None)
    median = statistics.median(walls)
    record = {"bench": "ptycho", "tool": "quantem", "case": found.pop("case"),
              "metric": "s_per_iteration", "value": round(median, 6), "runs": len(walls),
              "median_s": round(median, 6), "min_s": round(min(walls), 6),
              "max_s": round(max(walls), 6),
              "ms_per_pattern_per_iteration": round(1e3 * median / n, 5)}
    if cpu:
        record["cpu_s_per_iteration"] = round(statistics.fmean(cpu), 5)
        record["cpu_ms_per_pattern_per_iteration"] = round(1e3 * statistics.fmean(cpu) / n, 5)
    record["walls_s"] = [round(w, 4) for w in walls]
    for key in ("setup_s", "warmup_s"):
        if found.get(key) is not None:
            found[key] = round(found[key], 4)
    record.update(found)
    record.update(model_check=check, versions=peer)
    print(json.dumps(record), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data", type=Path)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--iterations", type=int, default=4, help="timed, after one warm-up")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--modes", nargs="+", default=["gd", "adam"], choices=sorted(LR))
    parser.add_argument("--ranks", type=int, default=0, help="0: no multi-process case")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--probe-modes", type=int, default=1,
                        help="probe modes (the npz's guess holds them)")
    parser.add_argument("--learn-positions", action="store_true",
                        help="optimise the scan positions too (autograd modes only)")
    parser.add_argument("--object-dir", default=None,
                        help="write each case's final object here (.npy)")
    args = parser.parse_args()

    import torch

    with np.load(args.data) as npz:
        data = {key: npz[key] for key in npz.files}
    n = len(data["amplitudes"])
    modes = np.asarray(data["guess"]).reshape(-1, *data["amplitudes"].shape[-2:]).shape[0]
    if modes != args.probe_modes:
        raise SystemExit(f"the data's guess has {modes} probe modes, not --probe-modes "
                         f"{args.probe_modes}")
    peer = {"python": platform.python_version(),
            **{name: metadata.version(name) for name in ("quantem", "torch", "numpy")}}
    torch.set_num_threads(1)
    check = model_check(data, args.seed)
    with tempfile.TemporaryDirectory(prefix="quantem-marks-") as tmp:
        for threads in args.threads:
            for mode in args.modes:
                emit(time_calls(data, args, mode, threads, 1, Path(tmp)), n, check, peer)
        if args.ranks > 1:  # multi-process: autograd only (quantEM refuses gd there)
            emit(time_calls(data, args, "adam", 1, args.ranks, Path(tmp)), n, check, peer)


if __name__ == "__main__":
    main()
