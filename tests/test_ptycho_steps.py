"""The steps the data choose (``reconstruction.steps``, LSQML's closed form) against a
brute-force scan of the step on one batch, and the stopping rule that tells convergence
from a stall (``solver.adapt``) on trajectories made to order."""

from __future__ import annotations

import numpy as np
import pytest

from outcore.ptycho.reconstruction import model as physics
from outcore.ptycho.reconstruction import solver
from outcore.ptycho.reconstruction.steps import MAX_STEP, chosen_update

from .ptycho_cases import pupil_guess, true_scan


def _batch(noise: str, modes: tuple[float, ...]):
    """A state part-way to the truth (the true object blurred, a guessed probe) and one
    batch of whole-pixel windows, with counts for the Poisson loss."""
    scan = true_scan(side=6, k=16, step=3, modes=modes, dose=1e5 if noise == "poisson" else None,
                     seed=3)
    corners = np.floor(scan.corners() + 0.5)
    truth = scan.slices[0]
    blurred = np.fft.ifft2(np.fft.fft2(truth) * np.exp(-0.02 * np.add.outer(
        np.fft.fftfreq(truth.shape[0]) ** 2, np.fft.fftfreq(truth.shape[1]) ** 2) * 400))
    obj = (0.7 * blurred + 0.3).astype(np.complex64)[None]
    guess = pupil_guess(scan, 0.1)
    from outcore.ptycho.reconstruction.probe import initial_modes

    probe = initial_modes(guess, len(modes))
    batch = np.arange(0, len(corners), 2)
    return obj, probe, corners, scan.amplitudes(), batch


def _surrogate(obj, probe, coords, amplitudes, d_obj, d_probe, origin, steps, noise):
    """LSQML's exit-wave least squares along the update, written here from its definition:
    ``sum_j sum_m |Psi_jm - dPsi_jm(steps) - target_jm|^2`` with ``dPsi`` the far field of
    ``t P_m d_o + s_m d_m O`` at each (whole-pixel) window and the target whose distance
    falls as the loss does: the measured amplitude on the current phase of every mode
    (``a Psi_m / |Psi|``, the amplitude loss), or ``Psi_m (1 + y / I) / 2`` (the Poisson
    loss: ``Psi - target`` is half its gradient)."""
    k = probe.shape[-1]
    total = 0.0
    r0, c0 = origin
    full_d = np.zeros(obj.shape[-2:], np.complex128)
    full_d[r0:r0 + d_obj.shape[-2], c0:c0 + d_obj.shape[-1]] = d_obj[0]
    for j, corner in enumerate(coords.astype(int)):
        window = (slice(corner[0], corner[0] + k), slice(corner[1], corner[1] + k))
        o, d = obj[0][window].astype(np.complex128), full_d[window]
        fields = [np.fft.fft2(p * o, norm="ortho") for p in probe]
        modulus = np.sqrt(sum(np.abs(f) ** 2 for f in fields))
        measured = np.fft.ifftshift(amplitudes[j].astype(np.float64))
        for m, p in enumerate(probe.astype(np.complex128)):
            change = np.fft.fft2(steps[0] * p * d + steps[1 + m] * d_probe[m] * o, norm="ortho")
            if noise == "poisson":
                target = fields[m] * (1 + measured**2 / np.maximum(modulus**2, 1e-12)) / 2
            else:
                target = measured * fields[m] / np.maximum(modulus, 1e-12)
            total += float((np.abs(fields[m] - change - target) ** 2).sum())
    return total


@pytest.mark.parametrize("noise", ["amplitude", "poisson"])
@pytest.mark.parametrize("modes", [(1.0,), (1.0, 0.3)])
def test_the_closed_form_is_the_minimum_of_a_brute_force_scan_along_the_update(noise, modes):
    """On one batch: the steps of the object and of every probe mode that
    ``chosen_update`` takes minimise LSQML's exit-wave least squares written here from its
    definition (a brute-force scan of each step, and of all of them scaled together,
    within 5 %, or the step is ``MAX_STEP`` and the minimum lies beyond it), and the loss
    itself at those steps is within 5 % of the most it can fall along the update (the brute-
    force minimum of the loss at every scale of the steps), for the amplitude and the
    Poisson loss, one and two probe modes."""
    obj, probe, corners, amplitudes, batch = _batch(noise, modes)
    model = physics.Model(noise=noise)
    terms = physics.batch_terms(obj, probe, corners[batch], amplitudes[batch], model)
    new_obj, new_probe, chosen = chosen_update(obj, probe, terms, corners[batch])
    steps = np.concatenate([chosen.object, chosen.probe])
    assert np.all(steps > 0)
    # the directions, recovered from the update itself
    r, c = terms.origin
    h, w = terms.grad_obj.shape[-2:]
    d_obj = (obj - new_obj)[:, r:r + h, c:c + w].astype(np.complex128) / steps[0]
    d_probe = (probe - new_probe).astype(np.complex128) / steps[1:, None, None]

    def surrogate(values):
        return _surrogate(obj, probe, corners[batch], amplitudes[batch], d_obj, d_probe,
                          terms.origin, values, noise)

    for index in range(len(steps)):
        grid = steps[index] * np.linspace(0.5, 1.5, 101)
        values = []
        for value in grid:
            trial = steps.copy()
            trial[index] = value
            values.append(surrogate(trial))
        best = grid[int(np.argmin(values))]
        capped = steps[index] == MAX_STEP and best >= MAX_STEP  # the minimum lies beyond
        assert capped or best == pytest.approx(steps[index], rel=0.05), (index, best, steps)
    scales = np.linspace(0.2, 3.0, 141)

    def loss(scale):
        o = obj.copy()
        o[:, r:r + h, c:c + w] -= (scale * steps[0] * d_obj).astype(obj.dtype)
        p = (probe - scale * steps[1:, None, None] * d_probe).astype(probe.dtype)
        return physics.loss(o, p, corners[batch], amplitudes[batch], model)

    losses = np.array([loss(s) for s in scales])
    fall_best = terms.loss - losses.min()
    fall_chosen = terms.loss - loss(1.0)
    assert fall_best > 0 and fall_chosen >= 0.95 * fall_best, (fall_chosen, fall_best)


def test_given_steps_are_held_and_the_others_chosen_with_them():
    """``step_obj`` given: the object takes it, the probe's step is the best one with it
    (the surrogate's minimum along the probe alone); ``probe_on=False`` keeps the probe."""
    obj, probe, corners, amplitudes, batch = _batch("amplitude", (1.0,))
    terms = physics.batch_terms(obj, probe, corners[batch], amplitudes[batch])
    _, _, held = chosen_update(obj, probe, terms, corners[batch], step_obj=0.3)
    assert held.object[0] == 0.3 and held.probe[0] > 0
    _, kept, still = chosen_update(obj, probe, terms, corners[batch], probe_on=False)
    assert still.probe[0] == 0 and kept is probe


def _trajectory(losses, events=()):
    return solver.Trajectory(list(losses), events=[dict(e) for e in events])


GOAL = solver.Goal(floor=100.0, power=1e6, positions=64, pixels=256)


def _state(n=64):
    return solver.State(np.ones((1, 8, 8), np.complex64), np.ones((1, 4, 4), np.complex64),
                        np.zeros((n, 2)))


def test_a_loss_at_the_noise_floor_stops_the_run_after_checking_the_positions():
    """At ``NOISE_FACTOR`` times the floor: one trial iteration of position refinement
    first (when the data decide it), then the stop says "noise floor"."""
    settings = solver.Settings(adapt_positions=True, batch_size=16)
    trajectory = _trajectory([400, 200, 99])
    trajectory.positions = [None, None, None]
    settings, state = solver.adapt(trajectory, settings, _state(), GOAL, np.zeros((64, 2)), 2)
    assert settings.refine_positions and trajectory.events[-1]["name"] == "position_trial"
    assert not trajectory.done(settings, GOAL)
    trajectory.record(98, np.zeros((64, 2)), np.zeros((64, 2)))
    state.positions = np.array([1e-4, 1.0, 64, 0])  # Gauss-Newton steps at the noise
    settings, state = solver.adapt(trajectory, settings, state, GOAL, np.zeros((64, 2)), 3)
    assert not settings.refine_positions and trajectory.events[-1]["value"] is False
    assert trajectory.done(settings, GOAL) and trajectory.stopped == "noise floor"


def test_a_settled_loss_far_from_the_floor_changes_the_model_then_the_batch_then_stops():
    """A loss that no longer falls, 5 times the floor: three probe modes first, then a
    trial of position refinement, then twice the batch until it is the whole scan (the
    step's noise, not the data, was the limit), and only then "settled"; never while the
    batch could still grow."""
    settings = solver.Settings(adapt_modes=True, adapt_positions=True, adapt_batch=True,
                               batch_size=16)
    start = np.zeros((64, 2))
    state = _state()
    trajectory = _trajectory([600.0 - i for i in range(solver.STOP_WINDOW)] + [500.0] * 2)
    trajectory.positions = [None] * len(trajectory.losses)
    names = []
    iteration = len(trajectory.losses) - 1
    for _ in range(40):
        settings, state = solver.adapt(trajectory, settings, state, GOAL, start, iteration)
        if trajectory.stopped:
            break
        names.append(trajectory.events[-1]["name"] if trajectory.events
                     and trajectory.events[-1]["iteration"] == iteration else None)
        if names[-1] == "position_trial":
            state.positions = np.array([1e-4, 1.0, 64, 0])
        iteration += 1
        trajectory.record(500.0, start, start)
        assert trajectory.stopped != "settled" or settings.batch_size == 64
    changes = [name for name in names if name]
    assert changes == ["probe_modes", "position_trial", "refine_positions", "batch_size",
                       "batch_size"], changes
    assert settings.probe_modes == solver.AUTO_MODES and state.probe.shape[0] == 3
    assert settings.batch_size == 64 and trajectory.stopped == "settled"


def test_a_spike_of_one_iteration_is_not_a_settled_loss():
    """A falling loss with one iteration's spike (a mini-batch's noise): the median slope
    still falls, so nothing changes; a flat loss has settled."""
    falling = [1000 * 0.9**i for i in range(solver.STOP_WINDOW)]
    falling[-2] *= 3
    assert _trajectory(falling).change() > 0.05
    assert not _trajectory(falling).settled(solver.Settings())
    assert _trajectory([500.0] * solver.STOP_WINDOW).settled(solver.Settings())
