"""Accuracy of the reconstruction on scans written from first principles
(``ptycho_cases.true_scan``: its own forward model, no code shared with outcore.ptycho), run
by ``solver.serial`` (the engine's numpy twin; ``test_ptycho_engine`` shows the cluster
follows it): sub-pixel positions, refined positions, probe modes, rough probe guesses, a
searched defocus, two slices, Poisson counts, a detector mask, and the stop on the loss.

Object errors are ``quality.object_error`` (after global phase, scale and linear phase ramp)
on the well-lit pixels; 8 x 8 positions of 32 x 32 patterns, 4 pixels apart.
"""

from __future__ import annotations

import numpy as np
import pytest

from outcore.ptycho.reconstruction import probe as probes
from outcore.ptycho.reconstruction import quality, solver
from outcore.ptycho.reconstruction.model import Model
from outcore.ptycho.reconstruction.start import prepare, scan_of

from .ptycho_cases import (
    defocus_metres,
    position_rms,
    pupil_guess,
    solve,
    true_scan,
    write_preprocessed,
)


@pytest.fixture(scope="module")
def subpixel():
    return true_scan(side=8, k=32, step=4, jitter=0.5, seed=1)


def test_subpixel_scan_reconstructs_under_half_a_percent(subpixel):
    """40 iterations: under 0.5 %; the same windows rounded to whole pixels stay above 1 %."""
    guess = pupil_guess(subpixel, 0.1)
    assert np.abs(subpixel.corners() - np.floor(subpixel.corners() + 0.5)).max() > 0.4
    _, trajectory, error = solve(subpixel, guess, iterations=40, batch_size=16)
    assert error < 0.005, error
    assert trajectory.losses[-1] < 1e-3 * trajectory.losses[0]
    _, _, rounded = solve(subpixel, guess, coords=np.floor(subpixel.corners() + 0.5),
                          iterations=40, batch_size=16)
    assert rounded > 0.01, rounded


def test_refined_positions_reach_a_tenth_of_a_pixel():
    """Recorded positions off by up to 2 pixels (uniform, zero mean) are refined to under
    0.1 pixel RMS of the truth in 60 iterations and the object error ends under 1 %;
    without refinement it stays above 5 %."""
    scan = true_scan(side=8, k=32, step=4, jitter=2.5, seed=3)
    errors = np.random.default_rng(5).uniform(-2, 2, scan.centres.shape)
    recorded = scan.corners() + errors - errors.mean(axis=0)
    guess = pupil_guess(scan, 0.1)
    start = position_rms(recorded, scan.corners())
    state, _, error = solve(scan, guess, coords=recorded, iterations=60, batch_size=16,
                            refine_positions=True, refine_from=2)
    found = position_rms(state.coords, scan.corners())
    assert start > 1.0 and found < 0.1, (start, found)
    assert error < 0.01, error
    assert np.abs(state.coords - recorded).max() <= solver.Settings().position_bound + 1e-9
    _, _, fixed = solve(scan, guess, coords=recorded, iterations=60, batch_size=16)
    assert fixed > 0.05, fixed


def test_gauss_newton_matrices_are_new_every_curvature_every_iterations(monkeypatch):
    """Refined from iteration 2 with ``curvature_every=3``: every position gets a new matrix
    on iterations 2, 5 and 8 only (the others step with the latest one), so 3 of the 7
    refined iterations pay for them; with 1, all 7 do, and the two runs differ."""
    from outcore.ptycho.reconstruction import model as physics

    scan = true_scan(side=6, k=32, step=4, jitter=0.5, seed=4)
    errors = np.random.default_rng(6).uniform(-1, 1, scan.centres.shape)
    recorded = scan.corners() + errors - errors.mean(axis=0)
    made: list[int] = []
    computed = physics._position_curvature

    def counted(fwd, *args):
        made.append(len(fwd.top_left))
        return computed(fwd, *args)

    monkeypatch.setattr(physics, "_position_curvature", counted)
    states = {}
    for every in (3, 1):
        made.clear()
        states[every], _, _ = solve(scan, pupil_guess(scan, 0.1), coords=recorded,
                                    iterations=9, batch_size=12, refine_positions=True,
                                    refine_from=2, curvature_every=every)
        assert sum(made) == len(recorded) * (3 if every == 3 else 7), (every, made)
        assert not np.isnan(states[every].curvature).any()
    assert np.abs(states[3].coords - states[1].coords).max() > 1e-6


def test_three_modes_fit_what_one_mode_cannot():
    """Patterns of three incoherent modes (an extended source): 3 modes under 1 %, 1 mode
    above 3 %, in 60 iterations."""
    scan = true_scan(side=8, k=32, step=4, jitter=0.5, modes=(1.0, 0.6, 0.6), seed=2)
    guess = pupil_guess(scan, 0.1)
    results = {}
    for modes in (1, 3):
        state, trajectory, results[modes] = solve(
            scan, probes.initial_modes(guess, modes), iterations=60, batch_size=8,
            probe_modes=modes)
        assert state.probe.shape == (modes, 32, 32)
    assert results[3] < 0.01 and results[1] > 0.03, results
    power = (np.abs(state.probe) ** 2).sum(axis=(1, 2))
    assert np.all(np.diff(power) <= 0)  # orthogonalised, ordered by power
    overlap = np.abs(np.vdot(state.probe[0], state.probe[1]))
    assert overlap < 1e-4 * power[0]


@pytest.mark.parametrize("factor", [0.5, 1.5])
def test_probe_from_an_aperture_with_the_defocus_half_off(factor):
    """A flat disc of the right radius with the defocus 50 % off: under 2 % in 60."""
    scan = true_scan(side=8, k=32, step=4, jitter=0.5, seed=4)
    guess = pupil_guess(scan, 0.1 * factor, radius=8)
    _, _, error = solve(scan, guess, iterations=60, batch_size=16)
    assert error < 0.02, error


def test_defocus_search_finds_the_probe_of_the_mean_pattern_alone(tmp_path):
    """A guess from the mean pattern with no defocus (a focused probe where the truth is
    defocused): without the search the run fails (stagnates or diverges) and says so; with
    it (``auto``, as ``ptycho reconstruct`` does) under 2 %."""
    scan = true_scan(side=8, k=32, step=4, jitter=0.5, seed=4)
    store = write_preprocessed(scan, tmp_path / "pre.zarr", pupil_guess(scan, 0.0))
    ds = scan_of(store)
    settings = solver.Settings(iterations=60, batch_size=16)
    errors = {}
    for search in ("off", "auto"):
        prepared = prepare(store, ds, settings, defocus_search=search)
        _, trajectory, errors[search] = solve(scan, prepared.probe, iterations=60,
                                              batch_size=16)
        notes = quality.convergence_warnings(np.asarray(trajectory.losses), prepared.probe,
                                             prepared.floor, prepared.power, "iterations")
        assert bool(notes) == (search == "off"), notes
    assert not errors["off"] < 0.2 and errors["auto"] < 0.02, errors  # NaN when diverged
    found = prepared.search["defocus"]
    assert found == pytest.approx(defocus_metres(scan, 0.1), rel=0.3)


def test_two_slices_fit_what_one_slice_cannot():
    """A thick object of two slices: ``slices=2`` under 1 % (of the slices' product), one
    slice above 5 %."""
    scan = true_scan(side=8, k=32, step=4, jitter=0.5, slices=2, thickness=0.03, seed=5)
    q = np.fft.fftfreq(scan.k) * scan.k
    propagator = np.exp(-1j * scan.thickness * (q[:, None] ** 2 + q[None, :] ** 2))
    guess = pupil_guess(scan, 0.1)
    _, thin_trajectory, thin = solve(scan, guess, iterations=60, batch_size=8)
    _, thick_trajectory, thick = solve(scan, guess, model=Model(propagator=propagator.astype(
        np.complex64)), iterations=60, batch_size=8, slices=2, slice_thickness=1e-6)
    assert thick < 0.01 and thin > 0.05, (thick, thin)
    assert thick_trajectory.losses[-1] < 0.01 * thin_trajectory.losses[-1]


@pytest.mark.parametrize("noise", ["amplitude", "poisson"])
def test_counts_reach_their_noise_floor(noise):
    """Poisson counts (1e5 photons a pattern): both losses fall to within 2x of the noise
    floor ``quality.noise_floor`` expects and the object error to about the noise (1.8 %
    amplitude, 2.1 % Poisson here)."""
    scan = true_scan(side=8, k=32, step=4, jitter=0.5, dose=1e5, seed=6)
    _, trajectory, error = solve(scan, pupil_guess(scan, 0.1), model=Model(noise),
                                 iterations=50, batch_size=16, noise=noise)
    floor = quality.noise_floor(scan.amplitudes(), len(scan.centres), noise)
    assert floor is not None and trajectory.losses[-1] < 2 * floor, (trajectory.losses, floor)
    assert error < 0.025, error


def test_a_detector_mask_keeps_spoiled_pixels_out():
    """Hot pixels and a blocked corner: with the mask under 0.5 %, without it over 3 %."""
    scan = true_scan(side=8, k=32, step=4, jitter=0.5, seed=7)
    rng = np.random.default_rng(8)
    ignored = rng.random((32, 32)) < 0.03
    ignored[:4, :4] = True
    spoiled = scan.amplitudes()
    spoiled[:, ignored] = spoiled.max()
    guess = pupil_guess(scan, 0.1)
    _, _, masked = solve(scan, guess, model=Model(valid=~ignored), amplitudes=spoiled,
                         iterations=40, batch_size=16)
    _, _, unmasked = solve(scan, guess, amplitudes=spoiled, iterations=40, batch_size=16)
    assert masked < 0.005 and unmasked > 0.03, (masked, unmasked)


def test_without_iterations_the_run_stops_when_the_loss_settles(subpixel):
    _, trajectory, error = solve(subpixel, pupil_guess(subpixel, 0.1), batch_size=16,
                                 tolerance=1e-2, max_iterations=200)
    assert trajectory.stopped == "tolerance" and len(trajectory.losses) < 200
    assert trajectory.change() < 1e-2 <= solver.Trajectory(trajectory.losses[:-1]).change()
    _, capped, _ = solve(subpixel, pupil_guess(subpixel, 0.1), batch_size=16, tolerance=1e-9,
                         max_iterations=7)
    assert capped.stopped == "max_iterations" and len(capped.losses) == 7


def test_affine_refinement_undoes_a_stretched_and_turned_scan():
    """Recorded positions stretched by 5 % and turned by 2 degrees about the scan's centre:
    ``position_affine`` keeps the corrections an affine map of the recorded positions, and
    that map brings them to within 0.1 pixel RMS of the truth."""
    scan = true_scan(side=8, k=32, step=4, jitter=0.5, margin=3, seed=10)
    centre = scan.corners().mean(axis=0)
    turn = np.deg2rad(2.0)
    stretch = 1.05 * np.array([[np.cos(turn), -np.sin(turn)], [np.sin(turn), np.cos(turn)]])
    recorded = centre + (scan.corners() - centre) @ stretch.T
    start = position_rms(recorded, scan.corners())
    state, _, error = solve(scan, pupil_guess(scan, 0.1), coords=recorded, iterations=60,
                            batch_size=16, refine_positions=True, refine_from=2,
                            position_affine=True)
    design = np.column_stack([recorded, np.ones(len(recorded))])
    moved = state.coords - recorded
    residual = moved - design @ np.linalg.lstsq(design, moved, rcond=None)[0]
    assert np.abs(residual).max() < 1e-9  # an affine map indeed
    found = position_rms(state.coords, scan.corners())
    assert start > 0.5 and found < 0.1, (start, found)
    assert error < 0.01, error
