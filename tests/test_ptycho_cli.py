"""outcore ptycho reconstruct: run directories, error to the truth, resume, refusals."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

from outcore.cli import main
from outcore.runs import load_summary

COMMON = ["--cluster", "threads", "--workers", "2", "--no-progress"]


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("ptycho-cli")
    runs = str(root / "runs")
    main(["ptycho", "simulate", "--output", str(root / "s.zarr"), "--scan", "12", "12",
          "--detector", "32", "--step", "5", "--jitter", "1", "--name", "sim",
          "--output-dir", runs, "--cluster", "threads", "--no-progress"])
    main(["ptycho", "preprocess", "--input", str(root / "s.zarr"), "--output",
          str(root / "p.zarr"), "--name", "pre", "--output-dir", runs, "--cluster", "threads",
          "--no-progress"])
    return root


def _reconstruct(root: Path, name: str, *extra: str) -> dict:
    code = main(["ptycho", "reconstruct", "--input", str(root / "p.zarr"), "--batch-size",
                 "32", "--output-dir", str(root / "runs"), "--name", name, *COMMON, *extra])
    assert code == 0
    return load_summary(root / "runs" / name)


def _refused(root: Path, name: str, *extra: str) -> int:
    return main(["ptycho", "reconstruct", "--input", str(root / "p.zarr"), "--output-dir",
                 str(root / "runs"), "--name", name, *extra, "--no-progress"])


def _object(root: Path, name: str) -> np.ndarray:
    path = root / "runs" / name / "reconstruction.zarr"
    return xr.open_zarr(path, consolidated=False)["object"].values


def test_reconstruct_writes_its_run_and_reaches_the_truth(prepared):
    summary = _reconstruct(prepared, "full", "--iterations", "30", "--truth",
                           str(prepared / "s.truth.zarr"), "--checkpoint-every", "10")
    assert summary["status"] == "success"
    assert summary["metrics"]["object_error"] < 0.02
    run = prepared / "runs" / "full"
    recon = xr.open_zarr(run / "reconstruction.zarr", consolidated=False)
    assert recon["object"].dtype == np.complex64 and recon["probe"].dtype == np.complex64
    assert recon["x"].attrs["units"] == "m" and recon.sizes["iteration"] == 30
    assert recon["object"].dims == ("y", "x") and recon["probe"].dims == ("k_y", "k_x")
    assert np.all(np.diff(recon["loss"].values[2:]) < 0)
    for png in ("object_phase.png", "object_amplitude.png", "probe.png", "probe_phase.png"):
        assert (run / png).read_bytes()[:4] == b"\x89PNG"
    latest = json.loads((run / "work" / "latest.json").read_text())
    assert latest == {"checkpoint": "checkpoint-000030.zarr", "iterations_done": 30}


def test_resumed_run_equals_uninterrupted(prepared):
    _reconstruct(prepared, "whole", "--iterations", "12")
    _reconstruct(prepared, "half", "--iterations", "6", "--checkpoint-every", "3")
    summary = _reconstruct(prepared, "rest", "--iterations", "12", "--resume",
                           "--resume-from", str(prepared / "runs" / "half"))
    assert summary["metrics"]["iterations_run"] == 6
    np.testing.assert_array_equal(_object(prepared, "rest"), _object(prepared, "whole"))
    whole = xr.open_zarr(prepared / "runs" / "whole" / "reconstruction.zarr",
                         consolidated=False)["loss"].values
    rest = xr.open_zarr(prepared / "runs" / "rest" / "reconstruction.zarr",
                        consolidated=False)["loss"].values
    np.testing.assert_array_equal(rest, whole)


def test_refined_positions_and_modes_run_from_the_command_line(tmp_path):
    """A first-principles scan (``ptycho_cases.true_scan``) of two probe modes with its
    positions recorded up to 1.5 pixels off: ``--refine-positions --probe-modes 2`` writes
    the modes, the refined and the input positions, and a summary with the errors against
    the truth, the fitted phase ramp and no warnings; the run stops on the loss by itself."""
    from .ptycho_cases import pupil_guess, true_scan, write_preprocessed, write_truth

    scan = true_scan(side=8, k=32, step=4, jitter=0.5, modes=(1.0, 0.4), margin=4, seed=3)
    errors = np.random.default_rng(2).uniform(-1.5, 1.5, scan.centres.shape)
    write_preprocessed(scan, tmp_path / "p.zarr", pupil_guess(scan, 0.1),
                       centres=scan.centres + errors - errors.mean(axis=0),
                       probe_source="given")
    write_truth(scan, tmp_path / "t.zarr")
    code = main(["ptycho", "reconstruct", "--input", str(tmp_path / "p.zarr"),
                 "--refine-positions", "--refine-from", "2", "--probe-modes", "2",
                 "--batch-size", "8", "--max-iterations", "80", "--truth",
                 str(tmp_path / "t.zarr"), "--output-dir", str(tmp_path / "runs"),
                 "--name", "rec", *COMMON])
    assert code == 0
    metrics = load_summary(tmp_path / "runs" / "rec")["metrics"]
    assert metrics["stopped"] == "tolerance" and metrics["iterations_run"] < 80, metrics
    assert metrics["warnings"] == []
    assert metrics["object_error"] < 0.02 and metrics["position_error_px"] < 0.1, metrics
    assert metrics["position_correction_rms_px"] > 0.8
    assert len(metrics["phase_ramp_rad_per_m"]) == 2
    recon = xr.open_zarr(tmp_path / "runs" / "rec" / "reconstruction.zarr", consolidated=False)
    assert recon["probe"].dims == ("mode", "k_y", "k_x") and recon.sizes["mode"] == 2
    assert recon["positions"].attrs["units"] == "m"
    pre = xr.open_zarr(tmp_path / "p.zarr", consolidated=False)
    np.testing.assert_array_equal(recon["input_positions"].values, pre["positions"].values)


def test_refined_run_resumed_between_new_gauss_newton_matrices_equals_uninterrupted(
        tmp_path):
    """Positions refined from iteration 1 with new matrices every 3 iterations (1, 4, 7):
    a run checkpointed after 5 iterations keeps the matrices of iteration 4 in its
    checkpoint, and resumed to 7 it ends bit-identical to a run of 7."""
    from .ptycho_cases import pupil_guess, true_scan, write_preprocessed

    scan = true_scan(side=6, k=32, step=4, jitter=0.5, margin=4, seed=7)
    errors = np.random.default_rng(3).uniform(-1, 1, scan.centres.shape)
    write_preprocessed(scan, tmp_path / "p.zarr", pupil_guess(scan, 0.1),
                       centres=scan.centres + errors - errors.mean(axis=0),
                       probe_source="given")
    refine = ["--refine-positions", "--refine-from", "1", "--curvature-every", "3",
              "--batch-size", "12"]
    for name, more in (("whole", ["--iterations", "7"]),
                       ("half", ["--iterations", "5", "--checkpoint-every", "5"]),
                       ("rest", ["--iterations", "7", "--resume", "--resume-from",
                                 str(tmp_path / "runs" / "half")])):
        assert main(["ptycho", "reconstruct", "--input", str(tmp_path / "p.zarr"), *refine,
                     *more, "--output-dir", str(tmp_path / "runs"), "--name", name,
                     *COMMON]) == 0
    checkpoint = xr.open_zarr(tmp_path / "runs" / "half" / "work" / "checkpoint-000005.zarr",
                              consolidated=False)
    assert checkpoint["curvature"].shape == (len(scan.centres), 3)
    ends = {name: xr.open_zarr(tmp_path / "runs" / name / "reconstruction.zarr",
                               consolidated=False).load() for name in ("whole", "rest")}
    for variable in ("object", "positions", "loss"):
        np.testing.assert_array_equal(ends["rest"][variable].values,
                                      ends["whole"][variable].values)


def test_a_run_that_cannot_converge_says_so(prepared, capsys):
    """The focused probe of the mean pattern alone, where the scan's probe is defocused,
    without the defocus search: the summary and the terminal say it has not converged."""
    main(["ptycho", "preprocess", "--input", str(prepared / "s.zarr"), "--output",
          str(prepared / "focused.zarr"), "--defocus", "0", "--name", "focused",
          "--output-dir", str(prepared / "runs"), "--cluster", "threads", "--no-progress"])
    code = main(["ptycho", "reconstruct", "--input", str(prepared / "focused.zarr"),
                 "--iterations", "8", "--defocus-search", "off", "--output-dir",
                 str(prepared / "runs"), "--name", "stuck", *COMMON])
    assert code == 0
    notes = load_summary(prepared / "runs" / "stuck")["metrics"]["warnings"]
    assert notes and ("not converged" in notes[0] or "diverged" in notes[0])
    assert "warning: " in capsys.readouterr().err


def test_a_resume_with_other_settings_is_refused(prepared, capsys):
    _reconstruct(prepared, "base", "--iterations", "2", "--checkpoint-every", "1")
    assert _refused(prepared, "other", "--iterations", "4", "--batch-size", "32", "--seed",
                    "7", "--resume", "--resume-from", str(prepared / "runs" / "base")) == 1
    assert "--seed 7 differs from the resumed run's 0" in capsys.readouterr().err
    assert not (prepared / "runs" / "other").exists()


def test_a_plan_that_cannot_fit_names_the_fixes_that_would():
    """10^5 patterns of 128^2 (6.5 GB) in host memory: 2 or 8 workers of 1 GiB cannot hold
    them; disk residency fits on 2, and 64 workers fit (the fix names them from 16). The object
    (1200^2) leaves room for the 360 MiB a worker holds with the compiled loops loaded."""
    import dask.array as da

    from outcore.errors import PlanError
    from outcore.plan import Resources
    from outcore.ptycho.reconstruction import planning
    from outcore.ptycho.reconstruction.engine import Settings

    ds = xr.Dataset({"amplitudes": (("position", "k_y", "k_x"),
                                    da.zeros((100_000, 128, 128), "f4", chunks=(64, -1, -1)))},
                    attrs={"object_shape": [1200, 1200]})
    resources = Resources(workers=2, threads_per_worker=1, memory_limit=2**30)
    with pytest.raises(PlanError) as refused:
        planning.plan(ds, Settings(residency="host"), resources)
    fix = refused.value.fix
    assert "residency='disk'" in fix and "workers=" not in fix and "--" not in fix
    assert planning.plan(ds, Settings(residency="disk"), resources).fits
    with pytest.raises(PlanError, match="workers=64"):
        planning.plan(ds, Settings(residency="host"), Resources(16, 1, 2**30))
    assert planning.plan(ds, Settings(residency="host"), Resources(64, 1, 2**30)).fits


def test_a_plan_over_the_stated_device_memory_names_host_residency():
    """On the cupy backend with 2 GiB of device memory stated (no GPU needed): targets of
    10^5 patterns of 128^2 resident on the device do not fit, host residency does, and the
    refusal names it."""
    import dask.array as da

    from outcore.errors import PlanError
    from outcore.plan import Resources
    from outcore.ptycho.reconstruction import planning
    from outcore.ptycho.reconstruction.solver import Settings

    ds = xr.Dataset({"amplitudes": (("position", "k_y", "k_x"),
                                    da.zeros((100_000, 128, 128), "f4", chunks=(64, -1, -1)))},
                    attrs={"object_shape": [2000, 2000]})
    resources = Resources(workers=2, threads_per_worker=1, memory_limit=64 * 2**30,
                          backend="cupy", device_memory_limit=2 * 2**30)
    settings = Settings(residency="device", batch_size=1024, probe_modes=2)
    with pytest.raises(PlanError) as refused:
        planning.plan(ds, settings, resources)
    assert "does not fit the GPU" in str(refused.value)
    assert "residency='host'" in refused.value.fix
    plan = planning.plan(ds, Settings(residency="host", batch_size=1024, probe_modes=2), resources)
    assert plan.fits and plan.device_peak_bytes < 0.9 * 2 * 2**30
    assert plan.worker_peak_bytes > 50_000 * 128 * 128 * 4  # the targets moved to the host


@pytest.mark.parametrize("args, message", [
    (["--batch-size", "100000"], "--batch-size 100000"),
    (["--residency", "gpu"], "--residency gpu is not one of"),
    (["--resume"], "--resume and --resume-from"),
    (["--truth", "nowhere.zarr"], "nowhere.zarr"),
    (["--probe-modes", "0"], "--probe-modes 0 must be at least 1"),
    (["--slice-thickness", "1e-9"], "--slice-thickness 1e-09 was given without --slices"),
    (["--slices", "2"], "--slices 2 needs a positive --slice-thickness"),
    (["--noise", "gauss"], "--noise gauss is not one of"),
    (["--defocus-search", "maybe"], "--defocus-search maybe is not one of"),
    (["--refine-positions"], "could leave the"),
    (["--curvature-every", "0"], "--curvature-every 0 must be at least 1"),
])
def test_bad_options_fail_before_compute(prepared, args, message, capsys):
    assert _refused(prepared, "bad", "--cluster", "threads", *args) == 1
    assert message in capsys.readouterr().err
    assert not (prepared / "runs" / "bad").exists()


def test_a_stack_of_integer_counts_is_reconstructed_with_the_poisson_loss(prepared, tmp_path):
    """A counting detector's frames (integers, many zeros): preprocessing records that they
    are counts, and the reconstruction's loss is then Poisson unless --noise says otherwise;
    float frames keep the amplitude loss."""
    import outcore
    from outcore.io.store import write_new

    stack = outcore.open(prepared / "s.zarr")
    counts = stack.copy()
    scale = 0.5 / float(stack["data"].mean())  # half a count a pixel on average
    counts["data"] = np.round(stack["data"] * scale).astype(np.uint16)
    assert (counts["data"].values == 0).mean() > 0.3
    write_new(counts, tmp_path / "counts.zarr")
    runs = ["--output-dir", str(tmp_path / "runs"), *COMMON]
    assert main(["ptycho", "preprocess", "--input", str(tmp_path / "counts.zarr"), "--output",
                 str(tmp_path / "c.zarr"), "--name", "pre", *runs]) == 0
    assert xr.open_zarr(tmp_path / "c.zarr", consolidated=False).attrs["preprocess"]["counts"]
    for name, extra, noise in (("auto", [], "poisson"),
                               ("given", ["--noise", "amplitude"], "amplitude")):
        assert main(["ptycho", "reconstruct", "--input", str(tmp_path / "c.zarr"),
                     "--iterations", "1", "--batch-size", "32", "--name", name, *extra,
                     *runs]) == 0
        settings = load_summary(tmp_path / "runs" / name)["config"]["settings"]
        assert settings["noise"] == noise
    assert _reconstruct(prepared, "floats", "--iterations", "1")["config"]["settings"][
        "noise"] == "amplitude"
