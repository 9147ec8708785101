"""Benchmark: outcore on measured data (../shared/real), whole processes next to the peer a
user would run instead on the same files.

Prints one JSON line per tool and case (DESIGN.md, "Benchmark lines", ``"path": "cli"``):
each contender a process from the files a user holds to its finished outputs, the runs
alternating between them (A B, B A, ...), ``--repeats`` each, medians and ratios from the same
run (bench_cli.py's machinery: ``Contender``, ``alternate``, ``emit``; the fields of its lines:
``cpu_s`` of the process tree, ``peak_rss_bytes`` polled every 50 ms, ``quality``,
``outcore_speedup`` on the peer's line). The data and their references are described in
``../shared/real/README.md``; where ``--real-data`` is absent the script prints one
``"skipped"`` line with the reason, and a case whose files are missing likewise.

Cases (``--cases``):

- ``tooth``: ``outcore tomo reconstruct --input tomo/aps_tooth/tooth.h5 --center auto`` (the raw
  Data Exchange file, 181 views of 2 rows x 640 columns) against algotom 1.7.0 in its venv
  (``peers/make_algotom_venv.sh``; ``peers/algotom_runner.py path``: flat-field,
  ``find_center_vo`` on both rows, ASTRA's CPU FBP with the same ``ram-lak`` filter). Both read
  the file's stored angles (180/181-degree steps). ``quality``: the centre found and its
  distance from the README's 295.5 (projection 0 against the mirror of projection 180), and
  the correlation of each slice with an FBP at 295.5 written here (``reference_fbp``: the ramp
  filter by FFT and a linear interpolation back-projection, as tests/test_real_tomo.py writes
  one) at the same stored angles (``slice_correlation``: what the centre and the tool's
  algorithm change) and at the README's 0-180 degrees in 1-degree steps, which the
  projections match better (``slice_correlation_1deg``: the distance from the best image).
- ``decam``: ``outcore diffim --reference 4check/Stack-DEC-OBS18.fits --target
  4check/Stack-DEC-OBS04.fits`` against SFFT 1.7.3's numpy backend on the same two files
  (``peers/diffim_runner.py sfft``, bench_diffim.py's runner, its venv from
  ``peers/make_diffim_venvs.sh``). ``quality``: each tool's difference correlated with
  SFFT's shipped ``4check/FinalDifference.fits`` over outcore's searched area (the finite
  pixels of its score; ``_clipped``: without the 1 % of those pixels where the shipped
  difference is largest, the brightest stars' residuals), and the robust spread (IQR / 1.349)
  of outcore's score in empty sky (searched pixels 7 px or more from any source sep finds at
  2 sigma in either stack, as tests/test_real_diffim.py masks it; 1 is the goal).
- ``emmi``: ``outcore.diffim.image_sources`` on ``astro/eso_ntt_emmi/image.fits`` as a
  process (``python -c``: the FITS in, ``sources.parquet`` out) against a plain sep script
  (``peers/sep_sources_runner.py``: ``sep.Background``, ``sep.extract`` at 1.5 sigma over
  5 pixels, FLUX_AUTO by ``kron_radius`` and ``sum_ellipse``; sep is one of outcore's
  dependencies, so it runs on outcore's Python). ``quality``: the fraction of SExtractor's
  FLAGS 0 objects (``image.cat``) with a source within 1 px, and for those matched above
  S/N 20 in the catalogue the median and largest ``|FLUX_AUTO / SExtractor's - 1|``.

    benchmarks/peers/make_algotom_venv.sh; benchmarks/peers/make_diffim_venvs.sh
    .venv/bin/python benchmarks/bench_real.py                  # about 5 minutes on 2 cores
    .venv/bin/python benchmarks/bench_real.py --cases emmi --no-peers --repeats 1
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
from bench_cli import (
    PEERS,
    Contender,
    Measured,
    add_harness_options,
    alternate,
    check_harness_options,
    emit,
    outcore_command,
    progress,
    runner_report,
    summary_of,
)
from bench_diffim import RUNNER as DIFFIM_RUNNER
from bench_diffim import VENVS as DIFFIM_VENVS
from bench_tomo_raw import cluster_options, found_center, outcore_volume, peer_python_algotom
from common import skipped

REPO = Path(__file__).resolve().parents[1]
CASES = ("tooth", "decam", "emmi")
#: The tooth's rotation axis, column 0-based: projection 0 against the mirror of 180 (README).
TOOTH_CENTRE = 295.5
FILES = {"tooth": ("tomo/aps_tooth/tooth.h5",),
         "decam": tuple(f"astro/decam_i_mini_stacks/4check/{name}.fits" for name in
                        ("Stack-DEC-OBS18", "Stack-DEC-OBS04", "FinalDifference")),
         "emmi": ("astro/eso_ntt_emmi/image.fits", "astro/eso_ntt_emmi/image.cat")}
#: outcore's side of ``emmi``: what a user of the library types, as a process.
OUTCORE_SOURCES = """\
import sys, warnings
from astropy.io import fits
from outcore.diffim import image_sources
with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # the ESO-LOG cards astropy cannot parse
    image = fits.getdata(sys.argv[1])
image_sources(image).to_parquet(sys.argv[2])
"""


def robust_spread(values: np.ndarray) -> float:
    q1, q3 = np.percentile(values, [25, 75])
    return round(float((q3 - q1) / 1.349), 4)


def significant(value: float, digits: int = 3) -> float:
    return float(f"{float(value):.{digits}g}")


def correlation(a: np.ndarray, b: np.ndarray) -> float:
    return round(float(np.corrcoef(a.ravel(), b.ravel())[0, 1]), 5)


# --- tooth ----------------------------------------------------------------------------------


def reference_fbp(sinogram: np.ndarray, theta: np.ndarray, centre: float, n: int) -> np.ndarray:
    """FBP of ``sinogram (views, nu)`` at ``theta`` (rad) about column ``centre``, on an
    ``n x n`` grid centred on the axis: the ramp filter by FFT (zero-padded to a power of two),
    each filtered view spread along its lines by linear interpolation (tests/test_real_tomo.py's
    approach, apart from outcore's and algotom's), in attenuation per pixel."""
    views, nu = sinogram.shape
    pad = 2 ** int(np.ceil(np.log2(2 * nu)))
    ramp = np.fft.rfftfreq(pad)  # |f|, cycles per pixel
    filtered = np.fft.irfft(np.fft.rfft(sinogram, pad, axis=1) * ramp, pad, axis=1)[:, :nu]
    axis = np.arange(n) - (n - 1) / 2
    x, y = np.meshgrid(axis, axis, indexing="xy")
    out = np.zeros((n, n))
    for row, angle in zip(filtered, theta, strict=True):
        out += np.interp(x * np.cos(angle) + y * np.sin(angle) + centre, np.arange(nu), row,
                         left=0, right=0)
    return out * np.pi / views


def tooth_references(tooth: Path) -> dict[str, np.ndarray]:
    """``(rows, nu, nu)`` each: every row's FBP at 295.5 of ``-log((raw - dark) / (flat -
    dark))`` (mean flat and dark), at the file's stored angles (``stored``) and at 0, 1, ...,
    180 degrees (``1deg``, the README's)."""
    import h5py

    with h5py.File(tooth, "r") as f:
        raw = f["/exchange/data"][()].astype(np.float64)
        flat = f["/exchange/data_white"][()].mean(axis=0)
        dark = f["/exchange/data_dark"][()].mean(axis=0)
        stored = np.deg2rad(f["/exchange/theta"][()].astype(np.float64))
    line_integrals = -np.log(np.clip((raw - dark) / (flat - dark), 1e-6, None))
    nu = raw.shape[2]
    angles = {"stored": stored, "1deg": np.deg2rad(np.arange(raw.shape[0], dtype=np.float64))}
    return {name: np.stack([reference_fbp(line_integrals[:, row], theta, TOOTH_CENTRE, nu)
                            for row in range(raw.shape[1])]) for name, theta in angles.items()}


def tooth_quality(centre: float | None, volume: np.ndarray,
                  references: dict[str, np.ndarray]) -> dict:
    out = {"center_px": centre, "reference_center_px": TOOTH_CENTRE,
           "center_error_px": None if centre is None else round(centre - TOOTH_CENTRE, 4)}
    for name, reference in references.items():
        if volume.shape != reference.shape:
            raise ValueError(f"volume {volume.shape}, reference {reference.shape}")
        key = "slice_correlation" + ("" if name == "stored" else f"_{name}")
        out[key] = [correlation(v.astype(np.float64), r) for v, r in zip(volume, reference,
                                                                          strict=True)]
    return out


def case_tooth(args: argparse.Namespace, work: Path, real: Path) -> list[dict]:
    tooth = real / FILES["tooth"][0]
    progress("tooth: the reference FBP at 295.5")
    references = tooth_references(tooth)
    base = {"data": "tomo/aps_tooth/tooth.h5", "shape": [181, 2, 640], "center": "auto",
            "angles": "stored"}

    def judge_outcore(run: Path, _: Measured) -> dict:
        centre = found_center(summary_of(run / "out"))
        return {"quality": tooth_quality(centre, outcore_volume(run), references)}

    def judge_algotom(run: Path, measured: Measured) -> dict:
        report = runner_report(measured)
        return {"quality": tooth_quality(report.get("center"), np.load(run / "volume.npy"),
                                         references),
                "steps_s": {k: v for k, v in report.items() if k.endswith("_s")},
                "peer_versions": report.get("versions")}

    contenders = [Contender(
        "outcore", "outcore", {**base, "window": "ram-lak (default)"},
        lambda run: [*outcore_command(), "tomo", "reconstruct", "--input", str(tooth),
                     "--center", "auto", *cluster_options(args), "--output-dir", str(run),
                     "--name", "out", "--no-progress"],
        judge_outcore)]
    if args.peers:
        python, note = peer_python_algotom()
        contenders.append(Contender(
            "algotom", "algotom", {**base, "window": "ram-lak", "center_method":
                                   "find_center_vo, 2 rows", "fbp": "astra FBP (CPU)",
                                   "threads": args.peer_threads},
            lambda run: [python, str(PEERS / "algotom_runner.py"), "path", str(tooth),
                         str(run / "volume.npy"), "--center", "auto", "--rows", "2",
                         "--rings", "none", "--ratio", "none", "--window", "ram-lak",
                         "--threads", str(args.peer_threads)],
            judge_algotom, note=note))
    alternate("real-tooth", contenders, args, work)
    return emit("real-tooth", contenders)


# --- decam ----------------------------------------------------------------------------------


def empty_sky(*images: np.ndarray) -> np.ndarray:
    """True on pixels 7 px or more from every source sep finds at 2 sigma in any of
    ``images`` (tests/test_real_diffim.py's mask)."""
    import sep
    from scipy.ndimage import binary_dilation

    sky = np.ones(images[0].shape, bool)
    for image in images:
        data = np.ascontiguousarray(image, dtype=np.float64)
        background = sep.Background(data)
        _, segments = sep.extract(data - background.back(), 2.0, err=background.globalrms,
                                  segmentation_map=True)
        sky &= ~binary_dilation(segments > 0, iterations=7)
    return sky


def decam_quality(difference: np.ndarray, shipped: np.ndarray, searched: np.ndarray | None
                  ) -> dict:
    """The correlation with SFFT's shipped difference over outcore's searched area (or the
    whole image where outcore gave none), and the same without the 1 % of those pixels where
    the shipped difference is largest (the residuals of the brightest stars, which dominate
    a correlation)."""
    area = np.isfinite(difference) & (np.ones(shipped.shape, bool) if searched is None
                                      else searched)
    calm = area & (np.abs(shipped) < np.percentile(np.abs(shipped[area]), 99))
    return {"correlation_with_shipped_sfft": correlation(difference[area], shipped[area]),
            "correlation_with_shipped_sfft_clipped": correlation(difference[calm],
                                                                 shipped[calm]),
            "area": "outcore's searched pixels" if searched is not None else "whole image",
            "area_pixels": int(area.sum())}


def case_decam(args: argparse.Namespace, work: Path, real: Path) -> list[dict]:
    import xarray as xr
    from astropy.io import fits

    reference, target, final = (real / name for name in FILES["decam"])
    shipped = fits.getdata(final).astype(np.float64)
    sky = empty_sky(fits.getdata(reference), fits.getdata(target))
    held: dict[str, np.ndarray] = {}
    base = {"data": "astro/decam_i_mini_stacks/4check", "reference": reference.name,
            "target": target.name, "shape": list(shipped.shape)}

    def judge_outcore(run: Path, _: Measured, tool: str = "outcore") -> dict:
        summary = summary_of(run / "out")
        pair = xr.open_zarr(run / "out" / "difference.zarr").sel(pair="pair").load()
        held[tool] = pair.difference.values.astype(np.float64)
        score = pair.score.values.astype(np.float64)
        searched = np.isfinite(score)
        if tool == "outcore":  # the default run's searched area is every contender's
            held["searched"] = searched
        area = sky & searched
        return {"score_spread_empty_sky": robust_spread(score[area]),
                "empty_sky_pixels": int(area.sum()),
                "searched_fraction": round(float(searched.mean()), 4),
                "method": [i.get("method") for i in summary["metrics"]["items"].values()]}

    def judge_sfft(run: Path, _: Measured) -> dict:
        held["sfft"] = np.load(run / "difference.npy").astype(np.float64)
        return {}

    contenders = [Contender(
        "outcore", "outcore", dict(base),
        lambda run: [*outcore_command(), "diffim", "--reference", str(reference), "--target",
                     str(target), *cluster_options(args), "--output-dir", str(run), "--name",
                     "out", "--no-progress"],
        judge_outcore)]
    for method in ("zogy", "kernel"):  # the default (auto) and each subtraction it chooses from
        contenders.append(Contender(
            f"outcore-{method}", f"outcore --method {method}", {**base, "method": method},
            lambda run, method=method: [
                *outcore_command(), "diffim", "--reference", str(reference), "--target",
                str(target), "--method", method, *cluster_options(args), "--output-dir",
                str(run), "--name", "out", "--no-progress"],
            lambda run, measured, method=method: judge_outcore(run, measured,
                                                               f"outcore-{method}")))
    if args.peers:
        python = DIFFIM_VENVS["sfft"] / "bin" / "python"
        note = (None if python.exists() else
                f"no sfft environment at {python.parent.parent}: run "
                "benchmarks/peers/make_diffim_venvs.sh")
        contenders.append(Contender(
            "sfft", "sfft", {**base, "backend": "numpy", "kernel": "poly order 2, half width 8",
                             "threads": 1},
            lambda run: [str(python), str(DIFFIM_RUNNER), "sfft", str(reference), str(target),
                         str(run / "difference.npy")],
            judge_sfft, note=note))
    alternate("real-decam", contenders, args, work)
    for contender in contenders:  # each judged against the same area once all have run
        if contender.judged is None or contender.tool not in held:
            continue
        quality = decam_quality(held[contender.tool], shipped, held.get("searched"))
        if contender.tool.startswith("outcore"):
            quality.update(contender.judged)
        elif "outcore" in held:
            area = np.isfinite(held["sfft"]) & held["searched"]
            calm = area & (np.abs(shipped) < np.percentile(np.abs(shipped[area]), 99))
            for key, where in (("", area), ("_clipped", calm)):
                quality[f"correlation_with_outcore{key}"] = correlation(
                    held["sfft"][where], held["outcore"][where])
        contender.judged = {"quality": quality}
    return emit("real-decam", contenders)


# --- emmi -----------------------------------------------------------------------------------


def emmi_quality(x: np.ndarray, y: np.ndarray, flux: np.ndarray, catalogue: np.ndarray
                 ) -> dict:
    """Sources ``(x, y, flux_auto)`` (0-based pixels) against SExtractor's FLAGS 0 objects."""
    clean = catalogue[catalogue[:, 20] == 0]  # column 21: FLAGS
    cx, cy = clean[:, 1] - 1, clean[:, 2] - 1  # SExtractor's pixels count from 1
    cflux, cerr = clean[:, 15], clean[:, 16]  # FLUX_AUTO, FLUXERR_AUTO
    distance = np.hypot(cx[:, None] - x[None], cy[:, None] - y[None])
    matched = distance.min(axis=1) < 1.0
    bright = matched & (cflux / np.maximum(cerr, 1e-30) > 20)
    deviation = np.abs(flux[distance.argmin(axis=1)[bright]] / cflux[bright] - 1)
    return {"sources": int(x.size), "flags0_objects": int(clean.shape[0]),
            "found_within_1px": round(float(matched.mean()), 4),
            "found": int(matched.sum()), "bright_matched_snr_gt_20": int(bright.sum()),
            "flux_auto_median_abs_dev": significant(np.median(deviation))
            if deviation.size else None,
            "flux_auto_max_abs_dev": significant(deviation.max()) if deviation.size else None}


def case_emmi(args: argparse.Namespace, work: Path, real: Path) -> list[dict]:
    image, cat = (real / name for name in FILES["emmi"])
    catalogue = np.loadtxt(cat)
    base = {"data": "astro/eso_ntt_emmi/image.fits", "threshold_sigma": 1.5, "min_area": 5}

    def judge_outcore(run: Path, _: Measured) -> dict:
        import pandas as pd

        found = pd.read_parquet(run / "sources.parquet")
        return {"quality": emmi_quality(found["x"].to_numpy(), found["y"].to_numpy(),
                                        found["flux_auto"].to_numpy(), catalogue)}

    def judge_sep(run: Path, measured: Measured) -> dict:
        found = np.loadtxt(run / "sources.csv", delimiter=",", skiprows=1, ndmin=2)
        return {"quality": emmi_quality(found[:, 0], found[:, 1], found[:, 2], catalogue),
                "peer_versions": runner_report(measured).get("versions")}

    contenders = [Contender(
        "outcore", "outcore", {**base, "call": "outcore.diffim.image_sources"},
        lambda run: [sys.executable, "-c", OUTCORE_SOURCES, str(image),
                     str(run / "sources.parquet")],
        judge_outcore)]
    if args.peers:
        contenders.append(Contender(
            "sep", "sep", {**base, "call": "sep Background, extract, kron_radius, "
                                           "sum_ellipse"},
            lambda run: [sys.executable, str(PEERS / "sep_sources_runner.py"), str(image),
                         str(run / "sources.csv")],
            judge_sep))
    alternate("real-emmi", contenders, args, work)
    return emit("real-emmi", contenders)


# --- main -----------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="+", choices=CASES, default=list(CASES))
    parser.add_argument("--real-data", type=Path, default=REPO.parent / "shared" / "real",
                        metavar="PATH",
                        help="the measured data sets (default ../shared/real beside the "
                             "checkout)")
    parser.add_argument("--no-peers", dest="peers", action="store_false", help="outcore only")
    parser.add_argument("--peer-threads", type=int, default=2,
                        help="threads of algotom's ASTRA slice loop")
    parser.add_argument("--cluster", default=None,
                        help="outcore's --cluster for tooth and decam (default: its own choice)")
    add_harness_options(parser)
    args = parser.parse_args()
    check_harness_options(parser, args)
    real = args.real_data.resolve()
    if not real.is_dir():
        reason = f"no measured data at {real} (give --real-data PATH)"
        skipped("real", "outcore", {"path": "cli", "cases": args.cases}, "wall_s", reason,
                skipped=reason, path="cli")
        return
    temporary = args.work is None
    work = Path(tempfile.mkdtemp(prefix="bench-real-")) if temporary else args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    runners: dict[str, Callable[[argparse.Namespace, Path, Path], list[dict]]] = {
        "tooth": case_tooth, "decam": case_decam, "emmi": case_emmi}
    try:
        for name in CASES:
            if name not in args.cases:
                continue
            absent = [f for f in FILES[name] if not (real / f).exists()]
            if absent:
                reason = f"missing under {real}: {', '.join(absent)}"
                skipped(f"real-{name}", "outcore", {"path": "cli"}, "wall_s", reason,
                        skipped=reason, path="cli")
                continue
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # FITS header cards astropy cannot parse
                runners[name](args, work, real)
    finally:
        if temporary:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
