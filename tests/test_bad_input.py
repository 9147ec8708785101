"""The bad-input battery: every verb fed malformed files and bad options.

Each case runs ``outcore.cli.main`` in this process and checks what a user would see and
what would be left: a non-zero exit; exactly one line on stderr that names the problem and,
after "Fix:", what to do; no traceback anywhere; the inputs byte for byte as they were; and
no run directory that claims success. Most cases must fail before a cluster starts (nothing
at all under the output folder); the few that can only fail while computing (a chunk that
does not decode, NaN in a block) run on a threads cluster and must leave a run marked
``failed``.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np
import pytest
import tifffile
import xarray as xr
from astropy.io import fits

import outcore
from outcore.cli import main
from outcore.fit import simulate_catalog
from outcore.ptycho import preprocess, save_preprocessed, simulate
from outcore.runs import Run, sha256_path
from outcore.tomo import Projector, shepp_logan
from outcore.tomo.geometry import scan_for
from outcore.tomo.layouts import projections_dataset

from .ptycho_cases import local_client

THREADS = ["--cluster", "threads", "--no-progress"]


def _corrupt_chunk(store: Path, variable: str) -> None:
    """Overwrite the codec's header of the first chunk file of ``variable`` with junk bytes and
    cut the file short (junk after the header could decode, to junk values)."""
    chunk = sorted(p for p in (store / variable / "c").rglob("*") if p.is_file())[0]
    data = chunk.read_bytes()
    chunk.write_bytes(b"\xff" * 16 + data[16:len(data) // 2])


def _copy(source: Path, target: Path) -> Path:
    shutil.copytree(source, target)
    return target


def _half(source: Path, target: Path) -> Path:
    target.write_bytes(source.read_bytes()[: source.stat().st_size // 2])
    return target


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> Path:
    """Good and bad inputs of every verb, written once (no cluster)."""
    d = tmp_path_factory.mktemp("inputs")
    catalog, _ = simulate_catalog(40, stamp=9, seed=1, chunk_size=10)
    images, ids = catalog["images"].values, catalog["candidate_id"].values
    np.savez(d / "cat.npz", images=images, candidate_id=ids)
    (d / "notzip.npz").write_text("these bytes are not a zip archive\n")
    _half(d / "cat.npz", d / "truncated.npz")
    (d / "empty.npz").write_bytes(b"")
    np.savez(d / "flat.npz", images=images[:, 0], candidate_id=ids)
    np.savez(d / "ints.npz", images=images.astype(np.int16), candidate_id=ids)
    np.savez(d / "mismatch.npz", images=images, candidate_id=ids, variance=images[:5])
    np.savez(d / "none.npz", images=images[:0], candidate_id=ids[:0])
    outcore.save(catalog, d / "cat.zarr", layout="cutouts")
    _corrupt_chunk(_copy(d / "cat.zarr", d / "cat-badchunk.zarr"), "images")
    (_copy(d / "cat.zarr", d / "cat-badmeta.zarr") / "zarr.json").write_text('{"zarr_form')
    np.save(d / "psf1d.npy", np.ones(9))
    (d / "psf.txt").write_text("1 2 3\n")

    volume = np.random.default_rng(2).random((6, 8, 8), dtype=np.float32)
    with h5py.File(d / "vol.h5", "w") as f:
        f["/entry/volume"] = volume
        f["/entry/line"] = volume[0, 0]
        f["/entry/complex"] = volume.astype(np.complex64)
        f["/entry/nan"] = np.where(volume > 0.9, np.nan, volume)
    (d / "empty.h5").write_bytes(b"")
    (d / "text.h5").write_text("not an HDF5 file\n")
    _half(d / "vol.h5", d / "truncated.h5")
    fits.PrimaryHDU(volume).writeto(d / "vol.fits")
    (d / "garbage.fits").write_text("SIMPLE? no." * 40)
    _half(d / "vol.fits", d / "truncated.fits")
    tifffile.imwrite(d / "vol.tif", volume)
    (d / "garbage.tif").write_text("not a TIFF\n")
    _half(d / "vol.tif", d / "truncated.tif")
    for name, frames in (("series_shape", [(8, 12)] * 2 + [(8, 10)] + [(8, 12)]),
                         ("series_dtype", [(8, 12)] * 4)):
        (d / name).mkdir()
        for i, frame in enumerate(frames):
            dtype = np.float32 if name == "series_dtype" and i == 3 else np.uint16
            tifffile.imwrite(d / name / f"frame_{i}.tif", np.zeros(frame, dtype))
    for name, frames in (("fits_shape", [(8, 12)] * 3 + [(8, 10)]),
                         ("fits_dtype", [(8, 12)] * 4)):
        (d / name).mkdir()
        for i, frame in enumerate(frames, start=1):
            dtype = np.float64 if name == "fits_dtype" and i == 2 else np.float32
            fits.PrimaryHDU(np.zeros(frame, dtype)).writeto(d / name / f"e_{i}.fits")
    (d / "empty.npy").write_bytes(b"")
    (d / "frames.raw").write_bytes(bytes(100))
    np.save(d / "angles5.npy", np.linspace(0, np.pi, 5))

    shape = (8, 8, 8)
    geometry = scan_for("parallel", shape, 12)
    projector = Projector(geometry, shape, "views")
    projections = projections_dataset(projector.project(shepp_logan(shape)), geometry, shape,
                                      "shepp-logan")
    outcore.save(projections, d / "proj.zarr", layout="projections", chunks={"view": 4})
    _corrupt_chunk(_copy(d / "proj.zarr", d / "proj-badchunk.zarr"), "projections")
    (_copy(d / "proj.zarr", d / "proj-badmeta.zarr") / "projections" / "zarr.json").write_text(
        "[1, 2")
    outcore.save(xr.Dataset({"volume": (("z", "y", "x"), volume)}, attrs={"voxel_size": 1.0}),
                 d / "vol.zarr", layout="volume")
    nan = projections.compute()
    nan["projections"][0, 0, 0] = np.nan
    nan.to_zarr(d / "proj-nan.zarr", zarr_format=3, consolidated=False)

    with local_client() as client:
        stack, _ = simulate((4, 4), detector=16, step=4, seed=0).save(d / "stack.zarr")
        pre = preprocess(stack, client=client)
        save_preprocessed(pre, d / "pre.zarr")
        save_preprocessed(pre, d / "pre-zstd.zarr", compression="zstd")
    _corrupt_chunk(d / "pre-zstd.zarr", "amplitudes")  # read by the engine, not outcore.open
    (_copy(d / "pre.zarr", d / "pre-badmeta.zarr") / "zarr.json").write_text("")
    _corrupt_chunk(_copy(d / "stack.zarr", d / "stack-badchunk.zarr"), "data")
    np.save(d / "probe3x3.npy", np.ones((3, 3), np.complex64))
    outcore.save(outcore.open(stack).assign_attrs(length_unit="pixel"), d / "stack-mixed.zarr",
                 layout="diffraction")
    (d / "not-a-run").mkdir()
    return d


@pytest.fixture(scope="module")
def digest(inputs) -> str:
    """The SHA-256 of every input file, before any case ran."""
    return sha256_path(inputs)


@dataclass(frozen=True)
class Case:
    """``argv(inputs)`` must fail with a line holding ``says`` (``{d}``: the inputs folder);
    ``computes``: the failure is met in the compute, so a failed run is left, with that
    reason."""

    id: str
    argv: Callable[[Path], list[str]]
    says: str
    computes: bool = False


def _c(id_: str, says: str, *words: str, computes: bool = False) -> Case:
    """A case whose words name inputs as ``{d}/...``."""
    return Case(id_, lambda d: [w.replace("{d}", str(d)) for w in words], says, computes)


def _says(case: Case, inputs: Path) -> str:
    return case.says.replace("{d}", str(inputs))


FIT = ("fit-dipoles", "--input")
RECON = ("tomo", "reconstruct", "--input", "{d}/proj.zarr")
PTY = ("ptycho", "reconstruct", "--input", "{d}/pre.zarr")
SIM = ("ptycho", "simulate", "--output", "{d}/new.zarr")
TSIM = ("tomo", "simulate", "--output", "{d}/new.zarr", "--shape", "8", "8", "8")
DEMO = ("demo", "--scan", "4", "8", "--frame", "16", "--fit-candidates", "0", "--tomo-size",
        "0", "--ptycho-scan", "0")
VOL = ("--layout", "volume", "--attr", "voxel_size=1")

CASES = [
    # convert: files that are not what they claim, or are cut short
    _c("convert-npz-not-a-zip", "BadZipFile", "convert", "{d}/notzip.npz", "{d}/o.zarr"),
    _c("convert-npz-truncated", "cannot be read", "convert", "{d}/truncated.npz", "{d}/o.zarr"),
    _c("convert-npz-empty", "NPZ file", "convert", "{d}/empty.npz", "{d}/o.zarr"),
    _c("convert-h5-empty", "file signature not found", "convert", "{d}/empty.h5",
       "{d}/o.zarr", *VOL),
    _c("convert-h5-not-hdf5", "file signature not found", "convert", "{d}/text.h5",
       "{d}/o.zarr", *VOL),
    _c("convert-h5-truncated", "truncated", "convert", "{d}/truncated.h5", "{d}/o.zarr", *VOL),
    _c("convert-fits-garbage", "FITS file", "convert", "{d}/garbage.fits", "{d}/o.zarr", *VOL),
    _c("convert-fits-truncated", "is truncated", "convert", "{d}/truncated.fits", "{d}/o.zarr",
       *VOL),
    _c("convert-tiff-garbage", "not a TIFF file", "convert", "{d}/garbage.tif", "{d}/o.zarr",
       *VOL),
    _c("convert-tiff-truncated", "TIFF file", "convert", "{d}/truncated.tif", "{d}/o.zarr",
       *VOL),
    # a TIFF series whose frames differ: refused from the headers, the file named
    _c("convert-tiff-series-shape", "frame_2.tif' holds 8 x 10 uint16 frames", "convert",
       "{d}/series_shape", "{d}/o.zarr", *VOL),
    _c("convert-tiff-series-dtype", "frame_3.tif' holds 8 x 12 float32 frames", "convert",
       "{d}/series_dtype", "{d}/o.zarr", *VOL),
    # the same for a sequence of FITS images (a directory, and a glob)
    _c("convert-fits-series-shape", "e_4.fits' holds a 8 x 10 float32 image", "convert",
       "{d}/fits_shape", "{d}/o.zarr", *VOL),
    _c("convert-fits-series-dtype", "e_2.fits' holds a 8 x 12 float64 image", "convert",
       "{d}/fits_dtype/e_*.fits", "{d}/o.zarr", *VOL),
    _c("convert-npy-empty", "npy file", "convert", "{d}/empty.npy", "{d}/o.zarr", *VOL),
    _c("convert-raw-wrong-size", "has 100 bytes", "convert", "{d}/frames.raw", "{d}/o.zarr",
       *VOL, "--dtype", "uint16", "--shape", "4", "4", "4"),
    _c("convert-wrong-dims", "1 axes", "convert", "{d}/vol.h5", "{d}/o.zarr", *VOL,
       "--dataset", "/entry/line"),
    _c("convert-wrong-dtype", "complex64", "convert", "{d}/vol.h5", "{d}/o.zarr", *VOL,
       "--dataset", "/entry/complex"),
    _c("convert-nan-where-not-allowed", "non-finite", "convert", "{d}/vol.h5", "{d}/o.zarr",
       *VOL, "--dataset", "/entry/nan", *THREADS, computes=True),
    _c("convert-mismatched-shapes", "angles has shape (5,)", "convert", "{d}/vol.tif",
       "{d}/o.zarr", "--layout", "projections", "--attr", "detector_pixel_size=1",
       "--array", "angles={d}/angles5.npy"),
    _c("convert-store-bad-metadata", "metadata of the store", "convert", "{d}/cat-badmeta.zarr",
       "{d}/o.zarr"),
    _c("convert-store-corrupted-chunk", "Chunk (0, 0, 0) of variable 'images'", "convert",
       "{d}/cat-badchunk.zarr", "{d}/o.zarr", *THREADS, computes=True),
    _c("convert-output-exists", "already exists", "convert", "{d}/cat.npz", "{d}/cat.zarr"),
    _c("convert-unknown-chunk-dim", "does not have", "convert", "{d}/cat.npz", "{d}/o.zarr",
       "--chunk", "q=4"),
    # demo: sizes and names
    _c("demo-memory-limit-negative", "--memory-limit -5 is not a positive size", *DEMO,
       "--memory-limit", "-5"),
    _c("demo-memory-limit-zero", "is not a positive size", *DEMO, "--memory-limit", "0"),
    _c("demo-memory-limit-nonsense", "--memory-limit abc is not a size", *DEMO,
       "--memory-limit", "abc"),
    _c("demo-name-escapes", "is not a plain name", *DEMO, "--name", "../escape"),
    _c("demo-name-absolute", "is not a plain name", *DEMO, "--name", "/tmp/abs"),
    _c("demo-name-empty", "is not a plain name", *DEMO, "--name", ""),
    _c("demo-chunk-rows-zero", "--chunk-rows 0 must be at least 1", *DEMO, "--chunk-rows", "0"),
    _c("demo-workers-zero", "--workers 0 must be at least 1", *DEMO, "--workers", "0"),
    _c("demo-workers-not-a-number", "invalid int value", *DEMO, "--workers", "two"),
    _c("demo-device-limit-not-for-local", "does not apply to the 'local' cluster", *DEMO,
       "--device-memory-limit", "1GiB"),
    _c("demo-interface-not-for-threads", "--interface does not apply", *DEMO, "--cluster",
       "threads", "--interface", "lo"),
    _c("demo-tls-incomplete", "TLS needs", *DEMO, "--tls-cert", "{d}/cert.pem"),
    _c("demo-negative-timeout", "must be positive", *DEMO, "--worker-timeout", "-1"),
    _c("demo-no-measure-rounds", "cannot be run", *DEMO, "--measure-rounds", "0"),
    # fit-dipoles: catalogs
    _c("fit-npz-not-a-zip", "BadZipFile", *FIT, "{d}/notzip.npz"),
    _c("fit-npz-truncated", "NPZ file", *FIT, "{d}/truncated.npz"),
    _c("fit-wrong-dims", "cutouts need 3 axes", *FIT, "{d}/flat.npz"),
    _c("fit-wrong-dtype", "int16", *FIT, "{d}/ints.npz"),
    _c("fit-mismatched-shapes", "variance", *FIT, "{d}/mismatch.npz"),
    _c("fit-no-candidates", "no candidates", *FIT, "{d}/none.npz"),
    _c("fit-store-bad-metadata", "metadata of the store", *FIT, "{d}/cat-badmeta.zarr"),
    _c("fit-store-corrupted-chunk", "Chunk (0, 0, 0) of variable 'images'", *FIT,
       "{d}/cat-badchunk.zarr", *THREADS, computes=True),
    _c("fit-chunk-size-zero", "--chunk-size 0 must be at least 1", *FIT, "{d}/cat.npz",
       "--chunk-size", "0"),
    _c("fit-psf-wrong-dims", "The PSF has shape (9,)", *FIT, "{d}/cat.npz", "--model", "psf",
       "--psf", "{d}/psf1d.npy"),
    _c("fit-psf-wrong-format", "Cannot read a PSF", *FIT, "{d}/cat.npz", "--model", "psf",
       "--psf", "{d}/psf.txt"),
    _c("fit-memory-limit-negative", "is not a positive size", *FIT, "{d}/cat.npz",
       "--memory-limit=-1GiB"),
    # tomo simulate / reconstruct
    _c("tomo-simulate-zero-shape", "is not a shape of 3", "tomo", "simulate", "--output",
       "{d}/new.zarr", "--shape", "0", "8", "8"),
    _c("tomo-simulate-zero-views", "--views 0 must be at least 1", *TSIM, "--views", "0"),
    _c("tomo-simulate-negative-voxel", "--voxel-size -1.0 must be positive", *TSIM,
       "--voxel-size", "-1"),
    _c("tomo-simulate-output-exists", "already exists", "tomo", "simulate", "--output",
       "{d}/proj.zarr"),
    _c("tomo-simulate-name-escapes", "is not a plain name", *TSIM, "--name", "../escape"),
    _c("tomo-reconstruct-corrupted-chunk", "of variable 'projections'", "tomo", "reconstruct",
       "--input", "{d}/proj-badchunk.zarr", *THREADS, computes=True),
    _c("tomo-reconstruct-bad-metadata", "metadata of the store", "tomo", "reconstruct",
       "--input", "{d}/proj-badmeta.zarr"),
    _c("tomo-reconstruct-wrong-layout", "projections", "tomo", "reconstruct", "--input",
       "{d}/vol.zarr"),
    _c("tomo-reconstruct-nan-where-not-allowed", "projections of the input", "tomo",
       "reconstruct",
       "--input", "{d}/proj-nan.zarr", *THREADS, computes=True),
    _c("tomo-reconstruct-zero-iterations", "--iterations 0 must be at least 1", *RECON,
       "--method", "sirt", "--iterations", "0"),
    _c("tomo-reconstruct-window-not-for-sirt", "--window applies to fbp", *RECON, "--method",
       "sirt", "--window", "hann"),
    _c("tomo-reconstruct-resume-from-not-a-run", "not a run directory", *RECON, "--method",
       "sirt", "--resume", "--resume-from", "{d}/not-a-run"),
    _c("tomo-reconstruct-slab-zero", "--slab 0 must be at least 1", *RECON, "--slab", "0"),
    # ptycho simulate / preprocess / reconstruct
    _c("ptycho-simulate-zero-detector", "detector", *SIM, "--detector", "0"),
    _c("ptycho-simulate-zero-scan", "scan", *SIM, "--scan", "0", "4"),
    _c("ptycho-simulate-uint32-without-dose", "dose", *SIM, "--dtype", "uint32"),
    _c("ptycho-simulate-probe-wrong-shape", "probe", *SIM, "--probe", "{d}/probe3x3.npy"),
    _c("ptycho-simulate-output-exists", "already exists", "ptycho", "simulate", "--output",
       "{d}/stack.zarr"),
    _c("ptycho-preprocess-not-a-store", "is not a zarr store", "ptycho", "preprocess",
       "--input", "{d}/not-a-run", "--output", "{d}/new.zarr"),
    _c("ptycho-preprocess-bin-does-not-divide", "bin", "ptycho", "preprocess", "--input",
       "{d}/stack.zarr", "--output", "{d}/new.zarr", "--bin", "3"),
    _c("ptycho-preprocess-bad-centre", "--centre", "ptycho", "preprocess", "--input",
       "{d}/stack.zarr", "--output", "{d}/new.zarr", "--centre", "1", "2", "3"),
    _c("ptycho-preprocess-corrupted-chunk", "of variable 'data'", "ptycho", "preprocess",
       "--input", "{d}/stack-badchunk.zarr", "--output", "{d}/new.zarr", *THREADS,
       computes=True),
    _c("ptycho-reconstruct-not-preprocessed", "not a preprocessed", "ptycho", "reconstruct",
       "--input", "{d}/stack.zarr"),
    _c("ptycho-reconstruct-bad-metadata", "metadata of the store", "ptycho", "reconstruct",
       "--input", "{d}/pre-badmeta.zarr"),
    _c("ptycho-reconstruct-corrupted-chunk", "A chunk of '{d}/pre-zstd.zarr' cannot be read",
       "ptycho", "reconstruct", "--input", "{d}/pre-zstd.zarr", "--iterations", "2", *THREADS,
       computes=True),
    _c("ptycho-reconstruct-zero-iterations", "--iterations 0", *PTY, "--iterations", "0"),
    _c("ptycho-reconstruct-batch-too-big", "--batch-size", *PTY, "--batch-size", "100000"),
    _c("ptycho-reconstruct-bad-residency", "--residency", *PTY, "--residency", "gpu"),
    _c("ptycho-reconstruct-resume-alone", "go together", *PTY, "--resume"),
    _c("ptycho-preprocess-pixels-and-metres", "cannot be mixed", "ptycho", "preprocess",
       "--input", "{d}/stack-mixed.zarr", "--output", "{d}/new.zarr"),
    _c("ptycho-frc-not-preprocessed", "not a preprocessed", "ptycho", "frc", "--input",
       "{d}/stack.zarr"),
    _c("ptycho-frc-batch-too-big", "--batch-size 100", "ptycho", "frc", "--input",
       "{d}/pre.zarr", "--batch-size", "100"),
    _c("ptycho-frc-corrupted-chunk", "of the store '{d}/pre-zstd.zarr' cannot be read",
       "ptycho", "frc", "--input", "{d}/pre-zstd.zarr", "--iterations", "2", *THREADS,
       computes=True),
    # tune, plan, runs
    _c("tune-not-tunable", "cannot be tuned", "tune", "convert", "--chunk-size", "1",
       "--workers", "1"),
    _c("tune-zero-chunk", "needs distinct values of at least 1", "tune", "demo",
       "--chunk-size", "0", "--workers", "1"),
    _c("tune-mpi-cluster", "cannot resize", "tune", "demo", "--chunk-size", "2", "--workers",
       "1", "--cluster", "mpi"),
    _c("tune-bad-catalog", "BadZipFile", "tune", "fit-dipoles", "--input", "{d}/notzip.npz",
       "--chunk-size", "8", "--workers", "1"),
    _c("tune-name-escapes", "is not a plain name", "tune", "demo", "--chunk-size", "2",
       "--workers", "1", "--name", "a/b"),
    _c("plan-unknown-verb", "is not a command with a plan", "plan", "bogus"),
    _c("plan-memory-limit-negative", "is not a positive size", "plan", "demo",
       "--memory-limit", "-5"),
    _c("plan-bad-catalog", "BadZipFile", "plan", "fit-dipoles", "--input", "{d}/notzip.npz"),
    _c("runs-missing-folder", "does not exist", "runs", "{d}/no-such-folder"),
    _c("runs-not-a-folder", "is not a folder", "runs", "{d}/cat.npz"),
]


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_bad_input_fails_in_one_line_and_changes_nothing(case, inputs, digest, tmp_path, capfd):
    out = tmp_path / "runs"
    argv = case.argv(inputs)
    if argv[0] not in ("plan", "runs"):
        argv += ["--output-dir", str(out)]
    try:
        code = main(argv)
    except SystemExit as usage_error:  # the parser's own errors exit 2
        code = usage_error.code
    stdout, stderr = capfd.readouterr()
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert code != 0
    assert len(lines) == 1, stderr
    assert lines[0].startswith("outcore ") and "Fix:" in lines[0], lines[0]
    assert _says(case, inputs) in lines[0], lines[0]
    assert "Traceback" not in stdout + stderr and "internal error" not in lines[0]
    assert sha256_path(inputs) == digest, "the inputs changed"
    assert not (inputs / "new.zarr").exists() and not (inputs / "o.zarr").exists()
    summaries = [json.loads(p.read_text()) for p in out.rglob("summary.json")]
    if not case.computes:
        assert not out.exists(), "a run directory was made before the input was refused"
    assert all(s["status"] == "failed" for s in summaries), summaries
    if case.computes:  # the run records the same reason
        assert summaries and _says(case, inputs) in summaries[0]["reason"], summaries
    assert not [p for p in inputs.iterdir() if ".partial-" in p.name]


def test_the_battery_covers_every_verb_with_40_cases_or_more():
    verbs = {case.id.split("-")[0] for case in CASES}
    assert len(CASES) >= 40
    assert verbs == {"convert", "demo", "fit", "tomo", "ptycho", "tune", "plan", "runs"}
    for family_verb in ("tomo-simulate", "tomo-reconstruct", "ptycho-simulate",
                        "ptycho-preprocess", "ptycho-reconstruct"):
        assert any(case.id.startswith(family_verb) for case in CASES), family_verb


def test_an_unexpected_error_is_reported_as_a_bug_in_one_line(tmp_path, capfd, monkeypatch):
    """A bug (not a user's error) still ends in one line, says so, names --debug, and the
    run it happened in is marked failed; --debug raises it with its traceback."""
    def broken(self: Run, **values: object) -> None:
        raise ZeroDivisionError("division by zero")

    monkeypatch.setattr(Run, "metric", broken)
    argv = ["demo", *DEMO[1:], *THREADS, "--memory-limit", "4GiB", "--output-dir",
            str(tmp_path), "--name", "bug"]
    assert main(argv) == 1
    lines = [line for line in capfd.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and "internal error (a bug in outcore): ZeroDivisionError" in lines[0]
    assert "--debug" in lines[0]
    summary = json.loads((tmp_path / "bug" / "summary.json").read_text())
    assert summary["status"] == "failed" and "ZeroDivisionError" in summary["reason"]
    with pytest.raises(ZeroDivisionError):
        main(["--debug", *argv[:-1], "bug2"])
