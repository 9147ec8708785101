"""Reconstruct a ptychography scan with Pty-chi on the CPU: as one process from file to object
(``bench_cli.py``), or timed per iteration (``bench_ptycho.py``).

    benchmarks/peers/.venv-ptychi/bin/python benchmarks/peers/ptychi_runner.py \
        SCAN.npz OUT.npz --iterations 20 --batch 128 [--engine lsqml|rpie|epie] [--seed 0]
    benchmarks/peers/.venv-ptychi/bin/python benchmarks/peers/ptychi_runner.py \
        SCAN.npz --object-dir DIR --iterations 4 --batch 128 --threads 1 2 \
        [--engines lsqml epie] [--probe-modes M] [--learn-positions]

Per iteration (``--object-dir``, the interface of ``bench_ptycho.py``'s peers): for each
engine and each ``--threads`` (``torch.set_num_threads``), a task of ``1 + --iterations``
epochs runs one epoch as a warm-up and then one epoch at a time, each timed (wall and this
process's CPU seconds); ``--probe-modes`` M takes the M starting modes of ``guess`` (M, K, K);
``--learn-positions`` turns on Pty-chi's position correction (its default gradient method and
step) from the first epoch. One JSON line per case (``value`` the median seconds of an
iteration, ``walls_s``, ``object_file`` a ``.npy`` of the final object in outcore's frame).

Runs in Pty-chi's own venv (``make_ptychi_venv.sh``): the standard library, numpy, torch and
ptychi only. Reads the patterns, positions and probe guess that ``bench_cli.py`` exported
from an ``outcore ptycho preprocess`` store (``amplitudes`` (n, K, K) float32, zero frequency
at K // 2; ``top_left`` (n, 2) window corners in object pixels; ``guess`` (K, K) complex64,
centred; ``object_shape``), runs ``--iterations`` epochs of batches of ``--batch`` positions
with the chosen engine (``lsqml``, Pty-chi's least-squares maximum-likelihood solver, its
usual choice; ``rpie``/``epie``, the PIE family outcore's preconditioned step comes from),
object and probe refined from the first epoch, positions fixed, and writes ``OUT.npz``:
``object`` (Ny, Nx) complex64 in outcore's frame and ``probe`` (K, K).

outcore's model mapped onto Pty-chi's (ptychi 2.2, read from its source):

- intensities: Pty-chi fits ``|fft2(probe * patch)|^2`` with an unnormalised FFT, outcore
  ``|fft2(., norm="ortho")|^2 = |fft2(.)|^2 / K^2``: the data are ``amplitudes ** 2`` as they
  are (``fft_shift=True`` moves zero frequency from K // 2 to the corner) and the probe guess
  is divided by ``K``;
- positions: Pty-chi takes each window's centre ``(y, x)`` in pixels from an origin at
  ``round(shape / 2) - 0.5`` of the object and cuts the window from ``centre + origin -
  (K - 1) / 2``; the object is given ``PAD`` pixels more on each side than outcore's (its
  sub-pixel patch extractor reads one pixel around each window), so ``centre = top_left +
  PAD + (K - 1) / 2 - origin``, an integer shift (no interpolation), and the object is
  cropped back by ``PAD`` on output;
- the object starts at ones, one slice; one probe mode, no OPR modes.

Torch keeps its default threads (all cores). Prints one JSON line: setup and reconstruction
seconds, torch threads, versions.

torchvision: PyPI's wheels of it are CUDA builds, which cannot load against the local CPU
build of torch (``libc10_cuda.so`` is missing, and its import fails registering
``torchvision::nms``). ptychi imports one name from it, ``GaussianBlur``, used only to make
random starting images, which this runner does not ask for; so when the real torchvision does
not import, ``import_ptychi`` puts a stand-in module in its place whose ``GaussianBlur``
raises, and the versions say so.
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import statistics
import sys
import time
import types
from importlib import metadata
from pathlib import Path

import numpy as np
import torch

#: Object pixels added on each side for Pty-chi's patch extractor, cropped on output.
PAD = 2
ENGINES = ("lsqml", "rpie", "epie")


def import_ptychi() -> str:
    """Import ptychi (a stand-in torchvision where the real one cannot load); torchvision's
    version, or why it was replaced."""
    try:
        import torchvision

        version = torchvision.__version__
    except (ImportError, OSError, RuntimeError) as exc:
        reason = f"{type(exc).__name__}: {exc}"
        for name in [name for name in sys.modules if name.split(".")[0] == "torchvision"]:
            del sys.modules[name]
        package = types.ModuleType("torchvision")
        transforms = types.ModuleType("torchvision.transforms")

        def unavailable(*args: object, **kwargs: object) -> None:
            raise RuntimeError(f"torchvision cannot load here ({reason}); GaussianBlur is "
                               "not available")

        transforms.GaussianBlur = unavailable
        package.transforms = transforms
        sys.modules.update({"torchvision": package, "torchvision.transforms": transforms})
        version = f"stand-in ({reason[:100]})"
    import ptychi.api.task  # noqa: F401

    return version


def options_for(engine: str, data: dict, iterations: int, batch: int, seed: int,
                learn_positions: bool = False):
    """Pty-chi's options and task data for the scan (see the module docstring)."""
    import ptychi.api as api

    amplitudes = data["amplitudes"].astype(np.float32)
    k = amplitudes.shape[-1]
    shape = data["object_shape"] if "object_shape" in data else \
        data["top_left"].max(axis=0) + k
    ny, nx = (int(s) + 2 * PAD for s in shape)
    origin = np.array([round(ny / 2) - 0.5, round(nx / 2) - 0.5])
    centres = data["top_left"].astype(np.float64) + PAD + (k - 1) / 2 - origin
    options = {"lsqml": api.LSQMLOptions, "rpie": api.RPIEOptions,
               "epie": api.EPIEOptions}[engine]()
    options.data_options.fft_shift = True
    options.data_options.wavelength_m = float(data.get("wavelength", 1e-10))
    options.object_options.pixel_size_m = float(data.get("pixel_size", 1.0))
    options.object_options.optimizable = True
    options.object_options.optimizer = api.Optimizers.SGD
    options.object_options.step_size = 1.0
    options.probe_options.optimizable = True
    options.probe_options.optimizer = api.Optimizers.SGD
    options.probe_options.step_size = 1.0
    if engine != "lsqml":
        options.object_options.alpha = 1.0 if engine == "epie" else 0.05
        options.probe_options.alpha = 1.0 if engine == "epie" else 0.05
    options.probe_position_options.optimizable = learn_positions
    options.reconstructor_options.batch_size = batch
    options.reconstructor_options.num_epochs = iterations
    options.reconstructor_options.default_device = api.Devices.CPU
    options.reconstructor_options.random_seed = seed
    task_data = {
        "diffraction_data": amplitudes ** 2,
        "object_data": np.ones((1, ny, nx), np.complex64),
        "probe_data": (data["guess"].astype(np.complex64).reshape(-1, k, k) / k)[None],
        "probe_position_y_px": centres[:, 0],
        "probe_position_x_px": centres[:, 1],
    }
    return options, task_data


def versions(torchvision: str) -> dict:
    return {"python": platform.python_version(),
            **{name: metadata.version(name) for name in ("ptychi", "torch", "numpy")},
            "torchvision": torchvision}


def per_iteration(args: argparse.Namespace, data: dict, torchvision: str) -> None:
    """One JSON line per engine and thread count: seconds per iteration (module doc)."""
    from ptychi.api.task import PtychographyTask

    n = len(data["amplitudes"])
    data = {**data, "guess": data["guess"].reshape(-1, *data["guess"].shape[-2:])[
        :args.probe_modes]}
    for engine in args.engines:
        for threads in args.threads:
            torch.set_num_threads(threads)
            t0 = time.perf_counter()
            options, task_data = options_for(engine, data, 1 + args.iterations, args.batch,
                                             args.seed, args.learn_positions)
            task = PtychographyTask(options, **task_data)
            setup = time.perf_counter() - t0
            t0 = time.perf_counter()
            task.run(n_epochs=1)
            warmup = time.perf_counter() - t0
            walls, cpu = [], []
            for _ in range(args.iterations):
                t0, c0 = time.perf_counter(), time.process_time()
                task.run(n_epochs=1, reset_timer_globals=False)
                walls.append(time.perf_counter() - t0)
                cpu.append(time.process_time() - c0)
            obj = task.get_data_to_cpu("object", as_numpy=True)[0][PAD:-PAD, PAD:-PAD]
            name = args.object_dir / f"{engine}-{threads}.npy"
            np.save(name, obj.astype(np.complex64))
            median = statistics.median(walls)
            print(json.dumps({
                "bench": "ptycho", "tool": "ptychi",
                "case": {"engine": engine, "threads": threads, "batch": args.batch,
                         "probe_modes": args.probe_modes,
                         "learn_positions": args.learn_positions},
                "metric": "s_per_iteration", "value": round(median, 6),
                "runs": len(walls), "median_s": round(median, 6),
                "min_s": round(min(walls), 6), "max_s": round(max(walls), 6),
                "ms_per_pattern_per_iteration": round(1e3 * median / n, 5),
                "cpu_s_per_iteration": round(statistics.fmean(cpu), 5),
                "walls_s": [round(w, 4) for w in walls], "setup_s": round(setup, 4),
                "warmup_s": round(warmup, 4), "torch_threads": torch.get_num_threads(),
                "object_file": str(name), "versions": versions(torchvision)}), flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data", type=Path, help=".npz exported by bench_cli.py or "
                        "bench_ptycho.py")
    parser.add_argument("out", type=Path, nargs="?",
                        help=".npz written with the object and probe (whole-process mode)")
    parser.add_argument("--iterations", type=int, default=20, help="epochs")
    parser.add_argument("--batch", type=int, default=128, help="positions per update")
    parser.add_argument("--engine", choices=ENGINES, default="lsqml")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--object-dir", type=Path, default=None,
                        help="time each iteration instead (bench_ptycho.py), objects here")
    parser.add_argument("--engines", nargs="+", choices=ENGINES, default=["lsqml", "epie"],
                        help="per-iteration mode: the engines to time")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2],
                        help="per-iteration mode: torch threads of each case")
    parser.add_argument("--probe-modes", type=int, default=1)
    parser.add_argument("--learn-positions", action="store_true")
    args = parser.parse_args()
    logging.getLogger("ptychi").setLevel(logging.WARNING)
    if args.object_dir is not None:
        torchvision = import_ptychi()
        with np.load(args.data) as npz:
            data = {key: npz[key] for key in npz.files}
        per_iteration(args, data, torchvision)
        return 0
    if args.out is None:
        parser.error("give OUT.npz, or --object-dir for the per-iteration mode")
    if args.out.exists():
        raise SystemExit(f"{args.out} exists; give a new output path")
    torchvision = import_ptychi()
    from ptychi.api.task import PtychographyTask

    with np.load(args.data) as npz:
        data = {key: npz[key] for key in npz.files}
    t0 = time.perf_counter()
    options, task_data = options_for(args.engine, data, args.iterations, args.batch, args.seed)
    task = PtychographyTask(options, **task_data)
    t1 = time.perf_counter()
    task.run()
    t2 = time.perf_counter()
    obj = task.get_data_to_cpu("object", as_numpy=True)[0][PAD:-PAD, PAD:-PAD]
    probe = task.get_data_to_cpu("probe", as_numpy=True)[0, 0]
    partial = args.out.with_name(args.out.stem + ".partial.npz")
    np.savez(partial, object=obj.astype(np.complex64), probe=probe.astype(np.complex64))
    partial.rename(args.out)
    print(json.dumps({"engine": args.engine, "iterations": args.iterations,
                      "batch": args.batch, "setup_s": round(t1 - t0, 4),
                      "reconstruct_s": round(t2 - t1, 4),
                      "torch_threads": torch.get_num_threads(),
                      "versions": versions(torchvision)}),
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
