"""Small ptychography problems made straight from the forward model, for the tests."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import distributed
import numpy as np
import pytest
import zarr

from outcore.ptycho.reconstruction import model as physics


@contextmanager
def local_client(workers: int = 1, memory_limit: str = "2GiB") -> Iterator[distributed.Client]:
    """A cluster of ``workers`` in this process and its client, the default while the block
    runs (what a notebook user starts; the public functions run on it)."""
    with distributed.LocalCluster(n_workers=workers, threads_per_worker=1, processes=False,
                                  memory_limit=memory_limit, dashboard_address=":0") as cluster, \
            distributed.Client(cluster) as client:
        yield client


@dataclass
class Scan:
    truth: np.ndarray  # (Ny, Nx) complex64
    probe: np.ndarray  # (K, K) complex64, the true probe
    guess: np.ndarray  # (K, K) complex64, a probe guess from the mean pattern
    top_left: np.ndarray  # (n, 2) int64
    amplitudes: np.ndarray  # (n, K, K) float32, centred


def aperture_probe(k: int, radius: float, defocus: float) -> np.ndarray:
    """A circular aperture in reciprocal space with a quadratic (defocus) phase, as the
    real-space (K, K) probe normalised to a peak of 1."""
    ky, kx = np.mgrid[:k, :k] - k // 2
    pupil = (ky**2 + kx**2 < radius**2) * np.exp(1j * defocus * (ky**2 + kx**2))
    probe = np.fft.fftshift(np.fft.ifft2(np.fft.ifftshift(pupil)))
    return (probe / np.abs(probe).max()).astype(np.complex64)


def make_scan(k: int = 32, steps: int = 12, step: int = 6, jitter: int = 1, seed: int = 0,
              dose: float | None = None) -> Scan:
    """A jittered raster of ``(steps + 1)^2`` positions over a smooth phase/amplitude object,
    noise-free or with Poisson counts at ``dose`` photons per pattern (mean)."""
    rng = np.random.default_rng(seed)
    n = steps * step + k
    yy, xx = np.mgrid[:n, :n]
    truth = ((0.7 + 0.3 * np.cos(xx / 5.0) * np.sin(yy / 7.0))
             * np.exp(0.8j * np.sin(xx / 9.0 + yy / 13.0))).astype(np.complex64)
    probe = aperture_probe(k, k / 4, 0.02 * np.pi)
    grid = np.array([[r, c] for r in range(0, steps * step + 1, step)
                     for c in range(0, steps * step + 1, step)])
    top_left = np.clip(grid + rng.integers(-jitter, jitter + 1, grid.shape), 0, n - k)
    intensity = physics.intensities(truth, probe, top_left)
    if dose is not None:
        scale = dose / intensity.sum(axis=(1, 2)).mean()
        intensity = rng.poisson(intensity * scale) / scale
    amplitudes = np.sqrt(intensity).astype(np.float32)
    ky, kx = np.mgrid[:k, :k] - k // 2
    pupil = np.sqrt((amplitudes**2).mean(axis=0)) * np.exp(0.02j * np.pi * (ky**2 + kx**2))
    guess = np.fft.fftshift(np.fft.ifft2(np.fft.ifftshift(pupil), norm="ortho"))
    return Scan(truth, probe, guess.astype(np.complex64), top_left.astype(np.int64), amplitudes)


def write_store(scan: Scan, path: Path, chunk: int = 16) -> Path:
    """The scan's amplitudes as a zarr v3 array ``amplitudes`` under the group ``path``."""
    group = zarr.open_group(path, mode="w-", zarr_format=3)
    array = group.create_array("amplitudes", shape=scan.amplitudes.shape,
                               chunks=(chunk, *scan.amplitudes.shape[1:]), dtype="float32")
    array[:] = scan.amplitudes
    return path


# --- scans written from first principles --------------------------------------------------
# A forward model of its own, a few lines of plain numpy that share no code with
# outcore.ptycho: the probe at a sub-pixel position is the band-limited field of its pupil
# summed directly (a DFT matrix, no FFT shift), modes add intensities, slices are joined by
# Fresnel propagation in Fourier space.


def smooth_object(shape: tuple[int, int], seed: int = 0) -> np.ndarray:
    """A complex transmission (Ny, Nx) with structure at the scale of a probe: amplitude 0.6
    to 1 and phase within 1 rad, each a sum of 12 plane waves of periods 7 to 30 pixels in
    random directions."""
    rng = np.random.default_rng([seed, 7])
    yy, xx = np.mgrid[:shape[0], :shape[1]].astype(float)
    parts = []
    for _ in range(2):
        total = np.zeros(shape)
        for _ in range(12):
            size, angle, phase = rng.uniform(0.2, 0.9), rng.uniform(0, np.pi), rng.uniform(0, 6)
            total += np.cos(size * (np.cos(angle) * yy + np.sin(angle) * xx) + phase)
        parts.append(total / np.abs(total).max())
    return ((0.8 + 0.2 * parts[0]) * np.exp(1j * parts[1])).astype(np.complex64)


def disc_pupil(k: int, radius: float, defocus: float,
               centre: tuple[float, float] = (0.0, 0.0)) -> np.ndarray:
    """A disc of ``radius`` pixels around ``centre`` (q_y, q_x) with the quadratic phase
    ``defocus * |q|^2``, FFT order."""
    q = np.fft.fftfreq(k) * k
    q2 = q[:, None] ** 2 + q[None, :] ** 2
    inside = (q[:, None] - centre[0]) ** 2 + (q[None, :] - centre[1]) ** 2 < radius**2
    return inside * np.exp(1j * defocus * q2)


def probe_at(pupil: np.ndarray, offset: np.ndarray) -> np.ndarray:
    """The probe of ``pupil`` (K, K, FFT order) on the window's pixels when its centre sits
    ``offset`` (row, col) pixels from the window's centre pixel ``K // 2``: a direct sum
    ``(1/K) sum_q pupil(q) exp(2 pi i q.(r - K//2 - offset) / K)``."""
    k = pupil.shape[-1]
    q = np.fft.fftfreq(k) * k
    r = np.arange(k) - k // 2
    ey = np.exp(2j * np.pi * np.outer(r - offset[0], q) / k)
    ex = np.exp(2j * np.pi * np.outer(r - offset[1], q) / k)
    return ey @ pupil @ ex.T / k


def direct_intensities(objects: list, pupils: list, corners: np.ndarray,
                       propagator: np.ndarray | None = None) -> np.ndarray:
    """Patterns (n, K, K), centred, of the object ``objects`` (slices, each (Ny, Nx)) lit at
    the window corners ``corners`` (n, 2), fractional, by the probe modes of ``pupils``
    ((K, K) each, FFT order), slices joined by ``propagator`` (FFT order): each mode's probe
    summed directly at its exact position (``probe_at``), intensities added over modes."""
    k = pupils[0].shape[-1]
    counts = np.zeros((len(corners), k, k))
    for j, corner in enumerate(corners):
        whole = np.floor(corner + 0.5).astype(int)
        window = (slice(whole[0], whole[0] + k), slice(whole[1], whole[1] + k))
        for pupil in pupils:
            wave = probe_at(pupil, corner - whole) * objects[0][window]
            for layer in objects[1:]:
                wave = np.fft.ifft2(np.fft.fft2(wave) * propagator) * layer[window]
            counts[j] += np.abs(np.fft.fftshift(np.fft.fft2(wave, norm="ortho"))) ** 2
    return counts


@dataclass
class TrueScan:
    """A scan from first principles: the truth, the data and what a user would record."""

    slices: list  # of (Ny, Nx) complex64
    pupils: list  # of (K, K) complex, FFT order, one per probe mode
    centres: np.ndarray  # (n, 2) float64, probe centres in object pixels (row, col), true
    counts: np.ndarray  # (n, K, K) float32 intensities (or Poisson counts), centred
    thickness: float  # pixels^2 factor of the propagator between slices (phase / |q|^2)

    @property
    def k(self) -> int:
        return self.pupils[0].shape[-1]

    def corners(self, centres: np.ndarray | None = None) -> np.ndarray:
        """Window corners (row, col), fractional, of ``centres`` (default: the true ones)."""
        return (self.centres if centres is None else centres) - self.k / 2

    def probes(self) -> np.ndarray:
        """The true probe modes (M, K, K) centred at ``K // 2``."""
        return np.stack([probe_at(p, np.zeros(2)) for p in self.pupils]).astype(np.complex64)

    def amplitudes(self) -> np.ndarray:
        return np.sqrt(np.maximum(self.counts, 0)).astype(np.float32)


def true_scan(side: int = 8, k: int = 32, step: float = 4.0, jitter: float = 0.0,
              modes: tuple[float, ...] = (1.0,), slices: int = 1, thickness: float = 0.0,
              radius: float | None = None, defocus: float = 0.1, tilt: float = 2.0,
              dose: float | None = None, margin: int = 1, seed: int = 0) -> TrueScan:
    """A ``side x side`` raster ``step`` pixels apart, each centre moved by a uniform draw in
    ``[-jitter, jitter]`` pixels per axis (sub-pixel), over a smooth object of ``slices``
    slices, lit by probe modes of relative powers ``modes`` (the disc pupil, then the same
    disc moved by ``tilt`` pixels along q_y, along q_x, along both: the tilted waves of an
    extended, incoherent source), intensities summed over modes, Poisson counts at ``dose``
    photons per pattern when given; ``margin`` pixels of object around every window."""
    rng = np.random.default_rng(seed)
    radius = k / 4 if radius is None else radius
    grid = np.stack(np.meshgrid(np.arange(side), np.arange(side), indexing="ij"), -1)
    centres = grid.reshape(-1, 2) * step + k / 2 + margin + jitter
    centres = centres + rng.uniform(-jitter, jitter, centres.shape)
    size = int(np.ceil(centres.max() + k / 2 + jitter)) + margin
    objects = [smooth_object((size, size), seed + s) for s in range(slices)]
    q = np.fft.fftfreq(k) * k
    pupils = []
    for power, (ty, tx) in zip(modes, [(0, 0), (tilt, 0), (0, tilt), (tilt, tilt)],
                               strict=False):
        pupil = disc_pupil(k, radius, defocus, (ty, tx))
        pupils.append(pupil * np.sqrt(power / (np.abs(pupil) ** 2).sum()))
    propagator = np.exp(-1j * thickness * (q[:, None] ** 2 + q[None, :] ** 2))
    counts = direct_intensities(objects, pupils, centres - k / 2, propagator)
    if dose is not None:
        scale = dose / counts.sum(axis=(1, 2)).mean()
        counts = rng.poisson(counts * scale).astype(np.float64)
    return TrueScan(objects, pupils, centres, counts.astype(np.float32), thickness)


def pupil_guess(scan: TrueScan, defocus: float, radius: float | None = None) -> np.ndarray:
    """A probe guess (1, K, K) a user could make: the square root of the mean pattern (or,
    with ``radius``, a flat disc of that radius with the mean pattern's power) with the
    quadratic phase ``defocus * |q|^2``."""
    k = scan.k
    mean = np.fft.ifftshift(scan.counts.astype(np.float64).mean(axis=0))
    amplitude = np.sqrt(np.maximum(mean, 0))
    if radius is not None:
        disc = np.abs(disc_pupil(k, radius, 0.0))
        amplitude = disc * np.sqrt(mean.sum() / disc.sum())
    q = np.fft.fftfreq(k) * k
    pupil = amplitude * np.exp(1j * defocus * (q[:, None] ** 2 + q[None, :] ** 2))
    return probe_at(pupil, np.zeros(2))[None].astype(np.complex64)


def solve(scan: TrueScan, probe: np.ndarray, coords: np.ndarray | None = None,
          model=None, amplitudes: np.ndarray | None = None, **settings):
    """``solver.serial`` from a flat object (of ``len(scan.slices)`` slices unless
    ``slices`` is given): the final state, the trajectory and the object error (of the
    product of the slices, against the truth's product, on the well-lit pixels)."""
    from outcore.ptycho.reconstruction import solver
    from outcore.ptycho.reconstruction.model import Model
    from outcore.ptycho.reconstruction.quality import illuminated, object_error

    amplitudes = scan.amplitudes() if amplitudes is None else amplitudes
    slices = settings.get("slices", 1)
    start = scan.corners() if coords is None else coords
    state = solver.State(np.ones((slices, *scan.slices[0].shape), np.complex64), probe,
                         np.array(start, np.float64))
    state, trajectory = solver.serial(lambda p: amplitudes[p], state,
                                      solver.Settings(**settings), model or Model())
    truth = np.prod(np.stack(scan.slices).astype(np.complex128), axis=0)
    lit = illuminated(scan.probes(), np.floor(scan.corners() + 0.5).astype(int), truth.shape)
    return state, trajectory, object_error(np.prod(state.obj, axis=0), truth, lit)


def position_rms(found: np.ndarray, truth: np.ndarray) -> float:
    """RMS distance (pixels) of positions from the truth, less their mean offset."""
    moved = found - truth
    moved = moved - moved.mean(axis=0)
    return float(np.sqrt((moved**2).sum(axis=1).mean()))


#: The physics the first-principles scans stand for: 0.1 nm light, 10 nm object pixels.
WAVELENGTH, PIXEL = 1e-10, 1e-8


def defocus_metres(scan: TrueScan, phase: float) -> float:
    """The defocus [m] (``optics`` convention) of a pupil phase ``phase * |q|^2``."""
    return -phase * (scan.k * PIXEL) ** 2 / (np.pi * WAVELENGTH)


def thickness_metres(scan: TrueScan) -> float:
    """The slice distance [m] of the scan's propagator ``exp(-i thickness |q|^2)``."""
    return scan.thickness * (scan.k * PIXEL) ** 2 / (np.pi * WAVELENGTH)


def write_preprocessed(scan: TrueScan, path: Path, guess: np.ndarray, *, defocus: float = 0.0,
                       centres: np.ndarray | None = None, mask: np.ndarray | None = None,
                       chunk: int = 16, probe_source: str = "mean pattern") -> Path:
    """The scan as a ``ptycho-preprocessed`` store (what ``ptycho preprocess`` writes), with
    positions from ``centres`` (default: the true ones), the probe ``guess`` (K, K) made
    with ``defocus`` [m], and the detector ``mask`` (True = ignored)."""
    import xarray as xr

    from outcore.ptycho.preprocessing.store import save_preprocessed

    centres = scan.centres if centres is None else centres
    k = scan.k
    corners = centres - k / 2
    size = [int(n) for n in np.ceil(corners.max(axis=0) + 0.5).astype(int) + k]
    size = [max(n, s) for n, s in zip(size, scan.slices[0].shape, strict=True)]
    variables = {
        "amplitudes": (("position", "k_y", "k_x"), scan.amplitudes()),
        "top_left": (("position", "yx"), np.floor(corners + 0.5).astype(np.int64)),
        "positions": (("position", "xy"), centres[:, ::-1] * PIXEL),
        "probe_guess": (("k_y", "k_x"), np.asarray(guess).reshape(k, k).astype(np.complex64)),
    }
    if mask is not None:
        variables["mask"] = (("k_y", "k_x"), np.asarray(mask, bool))
    ds = xr.Dataset(variables, coords={"xy": ["x", "y"], "yx": ["y", "x"]},
                    attrs={"outcore_layout": "ptycho-preprocessed", "wavelength": WAVELENGTH,
                           "pixel_size": PIXEL, "reciprocal_pixel_size": 1 / (k * PIXEL),
                           "object_shape": size, "detector_size": k, "object_padding": 0,
                           "defocus": defocus,
                           "preprocess": {"probe": probe_source, "defocus": defocus}})
    return save_preprocessed(ds.chunk({"position": chunk}), path)


def write_truth(scan: TrueScan, path: Path) -> Path:
    """The scan's truth as a ``ptycho-truth`` store (what ``ptycho simulate`` writes beside
    a stack), in the frame of ``write_preprocessed``'s store."""
    import xarray as xr

    from outcore.io.store import write_new as write_zarr

    probe = scan.probes()
    obj = np.stack(scan.slices)
    ds = xr.Dataset(
        {"object": (("y", "x"), obj[0]) if len(obj) == 1 else (("slice", "y", "x"), obj),
         "probe": (("k_y", "k_x"), probe[0]) if len(probe) == 1 else
                  (("mode", "k_y", "k_x"), probe),
         "top_left": (("position", "yx"), np.floor(scan.corners() + 0.5).astype(np.int64)),
         "positions": (("position", "xy"), scan.centres[:, ::-1] * PIXEL)},
        coords={"xy": ["x", "y"], "yx": ["y", "x"]},
        attrs={"outcore_layout": "ptycho-truth", "pixel_size": PIXEL, "wavelength": WAVELENGTH})
    return write_zarr(ds, path)


def assert_gradients_match(obj: np.ndarray, probe: np.ndarray, coords: np.ndarray,
                           measured: np.ndarray, model: physics.Model,
                           rng: np.random.Generator, draws: int, pick=None) -> None:
    """The exact gradients of ``physics.batch_terms`` (object slices, probe modes, positions)
    against central differences of ``physics.loss``, at ``draws`` random elements of each
    (both the real and the imaginary direction of a complex one); ``pick(name, idx, rng)``
    may move a drawn index (to a pixel that some window covers, say)."""
    terms = physics.batch_terms(obj, probe, coords, measured, model,
                                index=np.arange(len(coords)))
    assert terms.loss == pytest.approx(physics.loss(obj, probe, coords, measured, model))
    cases = {"object": (obj, terms.full_grad_obj(obj.shape),
                        lambda t: physics.loss(t, probe, coords, measured, model)),
             "probe": (probe, terms.grad_probe,
                       lambda t: physics.loss(obj, t, coords, measured, model)),
             "positions": (coords, terms.grad_pos,
                           lambda t: physics.loss(obj, probe, t, measured, model))}
    for name, (target, grad, loss) in cases.items():
        for _ in range(draws):
            idx = tuple(int(rng.integers(0, n)) for n in target.shape)
            if pick is not None:
                idx = pick(name, idx, rng)
            for direction in ((1.0, 1j) if np.iscomplexobj(target) else (1.0,)):
                h = 1e-6 * direction
                plus, minus = target.copy(), target.copy()
                plus[idx] += h
                minus[idx] -= h
                fd = (loss(plus) - loss(minus)) / 2e-6
                analytic = (np.conj(grad[idx]) * direction).real
                assert fd == pytest.approx(analytic, rel=1e-5, abs=1e-7), (name, idx)
