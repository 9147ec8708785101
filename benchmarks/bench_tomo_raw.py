"""Benchmark: a raw beamline scan to a volume, outcore's commands against algotom + ASTRA.

Prints one JSON line per tool and case (DESIGN.md, "Benchmark lines", ``"path": "cli"``):
whole processes from the same files, runs alternating between the contenders, ``--repeats``
each (bench_cli.py's machinery: ``Contender``, ``alternate``, ``emit``; the fields of its
lines). The scans are simulated once per size by ``raw_scan.py`` (Shepp-Logan, 180 degrees,
the rotation axis ``--center-offset`` pixels right of the detector's centre, per-pixel gains
of ``1 +- --gain`` that the flats miss, Poisson noise; Data Exchange HDF5):

- ``scan.h5``: that scan; ``clean.h5``: its ring-free twin (``--gain 0``, the same noise);
  ``phase.h5``: the same with Fresnel-propagated phase contrast (``--delta-beta``,
  ``--energy``, ``--distance``) and its noise-free line integrals ``phase.truth.h5``.

Cases (``--cases``); a case whose outcore feature the branch under test lacks (read from
``outcore tomo reconstruct --help``, ``outcore tomo convert --help`` and ``outcore tomo
center --help``) prints outcore's line with ``"skipped"`` and the reason, and still runs the peer:

- ``fbp``: the parts that exist today. outcore: ``tomo convert`` (the true centre given
  as ``--attr detector_offset``) then ``tomo reconstruct --method fbp``, one shell command;
  algotom: flat-field, then ASTRA's CPU FBP slice by slice at the true centre. ``quality``:
  PSNR against the phantom over the whole volume (bench_cli.py's ``psnr_db``).
- ``center``: ``outcore tomo center --input proj.zarr`` against algotom's ``find_center_vo``
  on the same projections (``proj.npy``, exported once); ``quality.center_error_px``: found
  minus true, pixels (the axis' column, 0-based).
- ``rings``: the ``fbp`` path with stripe removal, ``tomo reconstruct --rings
  --outcore-rings`` against algotom's ``remove_stripe_based_sorting`` on each sinogram, both at
  the true centre. ``quality.ring_rms``: the RMS over the volume of the tool's volume minus
  its own reconstruction of ``clean.h5`` without removal (1/m); ``ring_rms_before`` the same
  without removal (one reference run per tool), and their ratio ``ring_reduction``.
- ``paganin``: ``tomo convert --paganin DELTA_BETA --energy --propagation-distance``
  against algotom's flat-field and phase filter (``fresnel_filter``, ratio ``pi lambda z
  (delta/beta) / pixel^2``), each from ``phase.h5`` to its corrected projections;
  ``quality.relative_error``: ``||p - truth|| / ||truth||`` against the noise-free line
  integrals.
- ``path``: the whole raw file -> volume of ``phase.h5``: ``outcore tomo reconstruct --input
  phase.h5 --center auto --rings METHOD --paganin ...`` (or ``tomo convert`` then
  ``tomo reconstruct`` when ``--input`` takes no raw file) against algotom's script (load,
  flat-field, phase filter, find the centre, remove stripes, ASTRA CPU FBP slice by slice);
  PSNR against the phantom.

    python benchmarks/bench_tomo_raw.py --n 64 --views 96 --repeats 1      # a smoke run
    python benchmarks/bench_tomo_raw.py --n 256 --views 360 --work /tmp/raw256
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import shutil
import statistics
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import raw_scan
from bench_cli import (
    PEERS,
    Contender,
    Measured,
    add_harness_options,
    alternate,
    check_harness_options,
    checked,
    emit,
    outcore_command,
    progress,
    psnr_db,
    run_process,
    runner_report,
    summary_of,
)
from common import skipped

VENVS_NOTE = "benchmarks/peers/make_algotom_venv.sh"
CASES = ("fbp", "center", "rings", "paganin", "path")
LACKS = "this outcore lacks"


# --- what the outcore under test can do ---------------------------------------------------


def features(timeout: float) -> dict[str, bool]:
    """Which of issue 15's options the ``outcore`` under test has, from its help texts."""
    def help_of(*verb: str) -> tuple[int | None, str]:
        folder = Path(tempfile.mkdtemp(prefix="bench-raw-help-"))
        try:
            found = run_process([*outcore_command(), *verb, "--help"], folder, timeout)
            return found.returncode, (folder / "stdout.txt").read_text(errors="replace")
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    _, reconstruct = help_of("tomo", "reconstruct")
    _, convert = help_of("tomo", "convert")
    code, _ = help_of("tomo", "center")
    return {"center_verb": code == 0, "center_option": "--center" in reconstruct,
            "rings": "--rings" in reconstruct, "paganin": "--paganin" in reconstruct,
            "paganin_convert": "--paganin" in convert, "raw_input": "--flats" in reconstruct}


def missing(have: dict[str, bool], *needs: str) -> str | None:
    """The reason a case cannot run on this outcore, or None."""
    lacking = [need for need in needs if not have[need]]
    if not lacking:
        return None
    return (LACKS + " " + ", ".join(lacking) + " (issue 15; read from `outcore tomo "
            "reconstruct --help`, `outcore tomo convert --help`, `outcore tomo center --help`)")


# --- inputs -------------------------------------------------------------------------------


#: The scans each case reads.
SCANS = {"fbp": ("scan",), "center": ("scan",), "rings": ("scan", "clean"),
         "paganin": ("phase",), "path": ("phase",)}


def make_scans(args: argparse.Namespace, folder: Path) -> dict[str, float]:
    """The scans of ``args.cases`` among ``scan.h5``, ``clean.h5`` and ``phase.h5`` (see the
    module doc), each made once."""
    prepare = {}
    needed = {name for case in args.cases for name in SCANS[case]}
    common = dict(n=args.n, views=args.views, center_offset=args.center_offset,
                  pixel=args.pixel_size, seed=args.seed)
    for name, extra in (("scan", dict(gain=args.gain)), ("clean", dict(gain=0.0)),
                        ("phase", dict(gain=args.gain, phase=True, delta_beta=args.delta_beta,
                                       energy_kev=args.energy, distance=args.distance,
                                       truth_projections=True))):
        path = folder / f"{name}.h5"
        if name in needed and not path.exists():
            truth = raw_scan.simulate(path, **common, **extra)
            prepare[f"simulate_{name}"] = round(truth["simulate_s"], 3)
    return prepare


def pixel_attrs(truth: dict, offset: bool) -> list[str]:
    """``--attr`` options of ``tomo convert``: the pixel, and the true offset if asked."""
    attrs = ["--attr", f"detector_pixel_size={truth['pixel_size']}"]
    if offset:
        attrs += ["--attr", f"detector_offset=[0, {truth['detector_offset_u']}]"]
    return attrs


def convert_once(args: argparse.Namespace, folder: Path, raw: Path, store: Path,
                 prepare: dict, offset: bool) -> None:
    """``store`` from ``raw`` by ``outcore tomo convert`` and its ``.npy`` export."""
    import zarr

    truth = raw_scan.load_truth(raw)
    if not store.exists():
        found = checked([*outcore_command(), "tomo", "convert", str(raw), str(store),
                         *pixel_attrs(truth, offset), "--output-dir",
                         str(folder / "prep-runs"), "--no-progress"],
                        folder / f"prep-{store.stem}", args.timeout, "outcore tomo convert")
        prepare[f"convert_{store.stem}"] = round(found.wall_s, 3)
    npy = store.with_suffix(".npy")
    if not npy.exists():
        np.save(npy, zarr.open_group(store, mode="r")["projections"][:])


def report(bench: str, contenders: list[Contender], prepare: dict) -> None:
    """The case's lines: a contender its outcore lacks the feature for gets a line with
    ``"skipped"``; the others bench_cli.py's lines (outcore's first, peers with ratios)."""
    for contender in contenders:
        if contender.note and contender.note.startswith(LACKS):
            skipped(bench, contender.tool, {**contender.case, "path": "cli"}, "wall_s",
                    contender.note, skipped=contender.note, path="cli")
    emit(bench, [c for c in contenders if not (c.note and c.note.startswith(LACKS))], prepare)


# --- judges -------------------------------------------------------------------------------


def outcore_volume(run: Path) -> np.ndarray:
    import zarr

    summary_of(run / "out")
    return zarr.open_group(run / "out" / "volume.zarr", mode="r")["volume"][:]


def found_center(summary: dict) -> float | None:
    """The centre an ``outcore tomo center`` run reports: its metric ``center`` (a number, or
    a list / per-range mapping whose median is taken), else None."""
    def numbers(value: Any) -> list[float]:
        if isinstance(value, bool):
            return []
        if isinstance(value, int | float):
            return [float(value)]
        if isinstance(value, list):
            return [x for item in value for x in numbers(item)]
        if isinstance(value, dict):
            for key in ("center", "centre", "value", "median"):
                if key in value:
                    return numbers(value[key])
            return [x for item in value.values() for x in numbers(item)]
        return []

    metrics = summary.get("metrics", {})
    for key in ("center", "centre", "centers", "centres"):
        if key in metrics and numbers(metrics[key]):
            return float(statistics.median(numbers(metrics[key])))
    return None


def cluster_options(args: argparse.Namespace) -> list[str]:
    """outcore's ``--workers`` and ``--cluster`` when given (else outcore's own choice)."""
    return ([*(["--workers", str(args.workers)] if args.workers else []),
             *(["--cluster", args.cluster] if args.cluster else [])])


def shell(*commands: list[str]) -> list[str]:
    """One process that runs ``commands`` one after the other (stops at the first failure)."""
    return ["/bin/sh", "-c", " && ".join(shlex.join(c) for c in commands)]


# --- the contenders -------------------------------------------------------------------------


def outcore_path(args: argparse.Namespace, raw: Path, truth: dict, *, center: str,
                 rings: bool, paganin: bool, have: dict[str, bool]) -> Any:
    """The command of outcore's raw -> volume path (a function of the run folder)."""
    runs = lambda run, name: ["--output-dir", str(run), "--name", name, "--no-progress"]  # noqa: E731
    workers = cluster_options(args)
    phase = (["--paganin", str(args.delta_beta), "--energy", str(args.energy),
              "--propagation-distance", str(args.distance)] if paganin else [])
    ring = ["--rings", args.outcore_rings] if rings else []
    given = have.get("center_option", False)
    centre = (["--center", "auto"] if center == "auto" else
              ["--center", repr(truth["center"])] if given else [])
    offset = center != "auto" and not given  # the true centre as the store's attr instead
    window = ["--window", args.window, "--volume-shape", *[str(args.n)] * 3]

    def command(run: Path) -> list[str]:
        if have["raw_input"]:
            return [*outcore_command(), "tomo", "reconstruct", "--input", str(raw),
                    *pixel_attrs(truth, offset), *centre, *ring, *phase, *window,
                    *workers, *runs(run, "out")]
        store = run / "proj.zarr"
        convert = [*outcore_command(), "tomo", "convert", str(raw), str(store),
                   *pixel_attrs(truth, offset), *phase, *workers,
                   *runs(run, "convert")]
        reconstruct = [*outcore_command(), "tomo", "reconstruct", "--input", str(store),
                       *centre, *ring, *window, *workers, *runs(run, "out")]
        return shell(convert, reconstruct)

    return command


def algotom_path(args: argparse.Namespace, raw: Path, truth: dict, *, center: str,
                 rings: bool, paganin: bool) -> tuple[Any, str | None]:
    python, note = peer_python_algotom()
    ratio = (math.pi * truth["wavelength"] * args.distance * args.delta_beta
             / truth["pixel_size"] ** 2) if paganin else None

    def command(run: Path) -> list[str]:
        return [python, str(PEERS / "algotom_runner.py"), "path", str(raw),
                str(run / "volume.npy"), "--center",
                "auto" if center == "auto" else repr(truth["center"]),
                "--rings", "sort" if rings else "none",
                "--ratio", "none" if ratio is None else repr(ratio), "--window", args.window,
                "--threads", str(args.peer_threads), "--size", str(args.n)]

    return command, note


def peer_python_algotom() -> tuple[str | None, str | None]:
    python = PEERS / ".venv-algotom" / "bin" / "python"
    if python.exists():
        return str(python), None
    return None, f"no algotom environment at {python.parent.parent}: run {VENVS_NOTE}"


def volume_judges(phantom: np.ndarray, reference: dict[str, np.ndarray] | None = None):
    """Judges of outcore's and algotom's volumes: PSNR, and the ring RMS against a reference."""
    def quality(tool: str, volume: np.ndarray) -> dict:
        out = {"psnr_db": psnr_db(volume, phantom)}
        if reference is not None and tool in reference:
            out["ring_rms"] = rms(volume - reference[tool])
        return out

    def judge_outcore(run: Path, _: Measured) -> dict:
        return {"quality": quality("outcore", outcore_volume(run))}

    def judge_algotom(run: Path, measured: Measured) -> dict:
        report = runner_report(measured)
        return {"quality": quality("algotom", np.load(run / "volume.npy")),
                "steps_s": {k: v for k, v in report.items() if k.endswith("_s")},
                "center_found": report.get("center"), "peer_versions": report.get("versions")}

    return judge_outcore, judge_algotom


def rms(x: np.ndarray) -> float:
    return round(float(np.sqrt(np.mean(np.square(x, dtype=np.float64)))), 6)


def path_contenders(args, raw, truth, base, judges, have, needs, **steps) -> list[Contender]:
    judge_outcore, judge_algotom = judges
    command = outcore_path(args, raw, truth, have=have, **steps)
    reason = missing(have, *needs)
    contenders = [Contender("outcore", "outcore", dict(base), command, judge_outcore,
                            note=reason)]
    if args.peers:
        peer, note = algotom_path(args, raw, truth, **steps)
        contenders.append(Contender("algotom", "algotom", {**base, "fbp": "astra FBP (CPU)"},
                                    peer, judge_algotom, note=note))
    return contenders


# --- cases --------------------------------------------------------------------------------


def case_fbp(args, work, folder, have, prepare) -> None:
    raw = folder / "scan.h5"
    truth = raw_scan.load_truth(raw)
    base = {**scan_case(args), "steps": "flat-field, FBP at the true centre"}
    judges = volume_judges(raw_scan.phantom_volume(truth))
    contenders = path_contenders(args, raw, truth, base, judges, have, (), center="true",
                                 rings=False, paganin=False)
    alternate(f"raw-fbp-{args.n}", contenders, args, work)
    report("tomo-raw-fbp", contenders, prepare)


def case_center(args, work, folder, have, prepare) -> None:
    raw = folder / "scan.h5"
    truth = raw_scan.load_truth(raw)
    store = folder / "proj.zarr"
    base = {**scan_case(args), "true_center": truth["center"]}
    lacks = missing(have, "center_verb")
    if lacks and not args.peers:  # nothing to run: no store to convert
        report("tomo-raw-center", [Contender("outcore", "outcore", base, list, dict,
                                             note=lacks)], prepare)
        return
    convert_once(args, folder, raw, store, prepare, offset=False)
    error = lambda c: None if c is None else round(c - truth["center"], 4)  # noqa: E731

    def judge_outcore(run: Path, _: Measured) -> dict:
        centre = found_center(summary_of(run / "out"))
        return {"quality": {"center_px": centre, "center_error_px": error(centre)}}

    def judge_algotom(run: Path, measured: Measured) -> dict:
        report = runner_report(measured)
        return {"quality": {"center_px": report["center"],
                            "center_error_px": error(report["center"]),
                            "center_rows": report.get("center_rows")},
                "peer_versions": report.get("versions")}

    contenders = [Contender(
        "outcore", "outcore", dict(base),
        lambda run: [*outcore_command(), "tomo", "center", "--input", str(store),
                     *cluster_options(args), "--output-dir", str(run), "--name", "out",
                     "--no-progress"],
        judge_outcore, note=lacks)]
    if args.peers:
        python, note = peer_python_algotom()
        contenders.append(Contender(
            "algotom", "algotom", {**base, "method": "find_center_vo", "rows": args.rows},
            lambda run: [python, str(PEERS / "algotom_runner.py"), "center",
                         str(store.with_suffix(".npy")), "--rows", str(args.rows)],
            judge_algotom, note=note))
    alternate(f"raw-center-{args.n}", contenders, args, work)
    report("tomo-raw-center", contenders, prepare)


def case_rings(args, work, folder, have, prepare) -> None:
    raw, clean = folder / "scan.h5", folder / "clean.h5"
    truth = raw_scan.load_truth(raw)
    phantom = raw_scan.phantom_volume(truth)
    base = {**scan_case(args), "outcore_rings": args.outcore_rings,
            "algotom_rings": "remove_stripe_based_sorting"}
    reason = missing(have, "rings")
    references, before = {}, {}
    for tool, ok in (("outcore", reason is None), ("algotom", args.peers)):
        if not ok:
            continue
        volumes = {}
        for name, path in (("clean", clean), ("ringed", raw)):
            volumes[name] = reference_volume(args, work, tool, path, truth, name)
        if all(v is not None for v in volumes.values()):
            references[tool] = volumes["clean"]
            before[tool] = rms(volumes["ringed"] - volumes["clean"])
    judges = volume_judges(phantom, references)
    contenders = path_contenders(args, raw, truth, base, judges, have, ("rings",),
                                 center="true", rings=True, paganin=False)
    alternate(f"raw-rings-{args.n}", contenders, args, work)
    for contender in contenders:  # the figures before removal, from the reference runs
        if contender.judged and contender.tool in before:
            quality = contender.judged["quality"]
            quality["ring_rms_before"] = before[contender.tool]
            if quality.get("ring_rms"):
                quality["ring_reduction"] = round(before[contender.tool] / quality["ring_rms"],
                                                  3)
    report("tomo-raw-rings", contenders, prepare)


def reference_volume(args, work, tool, raw, truth, name) -> np.ndarray | None:
    """One run of ``tool``'s path without removal at the true centre: its volume."""
    folder = work / "runs" / f"rings-reference-{tool}-{name}"
    shutil.rmtree(folder, ignore_errors=True)
    if tool == "outcore":
        command = outcore_path(args, raw, truth, center="true", rings=False, paganin=False,
                               have={"raw_input": False})
    else:
        command, note = algotom_path(args, raw, truth, center="true", rings=False,
                                     paganin=False)
        if note:
            return None
    found = run_process(command(folder), folder, args.timeout)
    progress(f"rings reference {tool} {name}: {found.wall_s:.1f} s, exit {found.returncode}")
    if found.returncode != 0:
        return None
    volume = outcore_volume(folder) if tool == "outcore" else np.load(folder / "volume.npy")
    shutil.rmtree(folder, ignore_errors=True)
    return volume.astype(np.float64)


def case_paganin(args, work, folder, have, prepare) -> None:
    import h5py
    import zarr

    raw = folder / "phase.h5"
    truth = raw_scan.load_truth(raw)
    with h5py.File(folder / "phase.truth.h5", "r") as f:
        expected = f["/projections"][()].astype(np.float64)
    ratio = math.pi * truth["wavelength"] * args.distance * args.delta_beta / args.pixel_size**2
    base = {**scan_case(args), "delta_beta": args.delta_beta, "energy_kev": args.energy,
            "distance_m": args.distance}

    def error(p: np.ndarray) -> dict:
        diff = float(np.linalg.norm(p - expected) / np.linalg.norm(expected))
        return {"quality": {"relative_error": round(diff, 5)}}

    def judge_outcore(run: Path, _: Measured) -> dict:
        summary_of(run / "out")
        return error(zarr.open_group(run / "proj.zarr", mode="r")["projections"][:])

    def judge_algotom(run: Path, measured: Measured) -> dict:
        report = runner_report(measured)
        return {**error(np.load(run / "proj.npy")), "peer_versions": report.get("versions")}

    contenders = [Contender(
        "outcore", "outcore", dict(base),
        lambda run: [*outcore_command(), "tomo", "convert", str(raw), str(run / "proj.zarr"),
                     *pixel_attrs(truth, False), "--paganin",
                     str(args.delta_beta), "--energy", str(args.energy),
                     "--propagation-distance", str(args.distance), *cluster_options(args),
                     "--output-dir", str(run),
                     "--name", "out", "--no-progress"],
        judge_outcore, note=missing(have, "paganin_convert"))]
    if args.peers:
        python, note = peer_python_algotom()
        contenders.append(Contender(
            "algotom", "algotom", {**base, "filter": "fresnel_filter", "ratio": ratio},
            lambda run: [python, str(PEERS / "algotom_runner.py"), "paganin", str(raw),
                         str(run / "proj.npy"), "--ratio", repr(ratio)],
            judge_algotom, note=note))
    alternate(f"raw-paganin-{args.n}", contenders, args, work)
    report("tomo-raw-paganin", contenders, prepare)


def case_path(args, work, folder, have, prepare) -> None:
    raw = folder / "phase.h5"
    truth = raw_scan.load_truth(raw)
    base = {**scan_case(args), "steps": "flat-field, Paganin, centre, rings, FBP",
            "delta_beta": args.delta_beta, "outcore_rings": args.outcore_rings}
    judges = volume_judges(raw_scan.phantom_volume(truth))
    phase = "paganin" if have["raw_input"] else "paganin_convert"
    contenders = path_contenders(args, raw, truth, base, judges, have,
                                 ("center_option", "rings", phase),
                                 center="auto", rings=True, paganin=True)
    alternate(f"raw-path-{args.n}", contenders, args, work)
    report("tomo-raw-path", contenders, prepare)


def scan_case(args: argparse.Namespace) -> dict:
    return {"n": args.n, "views": args.views, "center_offset_px": args.center_offset,
            "gain": args.gain, "window": args.window}


# --- main ---------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="+", choices=CASES, default=list(CASES))
    parser.add_argument("--n", type=int, default=256, help="volume edge = detector size")
    parser.add_argument("--views", type=int, default=360, help="views over 180 degrees")
    parser.add_argument("--center-offset", type=float, default=3.7,
                        help="the axis' column right of the detector's centre, pixels")
    parser.add_argument("--gain", type=float, default=0.02, help="per-pixel gain spread")
    parser.add_argument("--pixel-size", type=float, default=1e-6, help="m")
    parser.add_argument("--delta-beta", type=float, default=50.0)
    parser.add_argument("--energy", type=float, default=20.0, help="keV")
    parser.add_argument("--distance", type=float, default=0.02, help="propagation, m")
    parser.add_argument("--window", default="hann", help="FBP filter window of both tools")
    parser.add_argument("--outcore-rings", default="sort", help="outcore's --rings METHOD")
    parser.add_argument("--rows", type=int, default=5, help="sinograms algotom's centre uses")
    parser.add_argument("--no-peers", dest="peers", action="store_false",
                        help="outcore only")
    parser.add_argument("--peer-threads", type=int, default=2,
                        help="threads of algotom's ASTRA slice loop")
    parser.add_argument("--cluster", default=None,
                        help="outcore's --cluster (e.g. threads for a quick check)")
    add_harness_options(parser)
    args = parser.parse_args()
    check_harness_options(parser, args)
    temporary = args.work is None
    work = Path(tempfile.mkdtemp(prefix="bench-raw-")) if temporary else args.work.resolve()
    folder = work / f"scans-{args.n}-{args.views}-{args.seed}"
    folder.mkdir(parents=True, exist_ok=True)
    try:
        have = features(args.timeout)
        progress(f"outcore features: {json.dumps(have)}; scans in {folder}")
        prepare = make_scans(args, folder)
        runners = {"fbp": case_fbp, "center": case_center, "rings": case_rings,
                   "paganin": case_paganin, "path": case_path}
        for name in CASES:
            if name in args.cases:
                runners[name](args, work, folder, have, prepare)
    finally:
        if temporary:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
