"""The model of ptychography, far field or near field (sub-pixel positions, mixed-state
probes, multislice objects), its losses and gradients, written once for numpy and cupy over
the kernels (``outcore.ptycho.kernels`` holds what differs).

Conventions (used everywhere in ``outcore.ptycho``):

- ``obj``: complex object transmission ``(S, Ny, Nx)``, ``S`` slices (1: single slice), one
  pixel = ``pixel_size`` metres. A 2-D ``(Ny, Nx)`` object is one slice.
- ``probe``: ``(M, K, K)`` complex, ``M`` incoherent modes on the probe window. A 2-D
  ``(K, K)`` probe is one mode.
- ``coords``: ``(n, 2)`` float64 ``(row, col)`` of each window's corner in object pixels,
  fractional in general. Position ``p`` [m, ``xy``] is the centre of its window, so
  ``coords = p[::-1] / pixel_size - K / 2``. The window is cut at
  ``top_left = floor(coords + 0.5)`` (``backend.nearest_whole``: a half, to within
  ``WHOLE_TOLERANCE``, rounds up, so the preprocessing's windows and these agree) and the
  probe is moved by the rest, ``f = coords - top_left`` in ``[-0.5, 0.5)``, with a Fourier
  shift: ``probe_f = ifft2(fft2(probe) exp(-2 pi i q.f))`` (``q`` = ``fftfreq(K)``, cycles per
  pixel), so ``probe_f(r) = probe(r - f)`` for a band-limited probe. Integer coordinates
  (an int ``top_left``) need no shift. Where a position crosses half a pixel its window
  moves by one and the probe's shift flips sign: the patterns stay the same but for the
  probe's energy at the window's edge, which the Fourier shift wraps around, so the model is
  smooth in the positions only as far as the probe fits its window.
- Exit wave of mode ``m`` at position ``j``: ``psi^1 = probe_f[m] * obj[0][window j]``, then
  ``psi^{s+1} = obj[s][window j] * ifft2(fft2(psi^s) H)`` with the free-space propagator
  ``H`` (``Model.propagator``, ``optics.fresnel_propagator``). Far field
  ``Psi_jm = fftshift(fft2(psi^S, norm="ortho"))``, zero frequency at index ``K // 2`` as
  detectors record it. Near field (``Model.nearfield``, a scan in the Fresnel scaling
  geometry): the detector records the image ``D_jm = ifft2(fft2(psi^S) T)`` with ``T`` the
  angular spectrum over the effective distance (``optics.nearfield_transfer``), and
  ``Psi_jm = D_jm`` in the same centred frame (the model holds ``ifftshift(D)``, which the
  roll in ``T`` makes, so everything after the detector field is the far field's).
  Intensity ``I_j = sum_m |Psi_jm|^2``; measured amplitude
  ``a_j = sqrt(y_j)``.
- Losses over the pixels of ``Model.valid`` (all when None): ``amplitude``
  ``L = sum (sqrt(I) - a)^2`` (least squares on amplitudes); ``poisson``
  ``L = 1/2 sum (I - y - y log(I / y))``, half the Poisson deviance (0 for a perfect fit; its
  gradient near the fit equals the amplitude loss's, so the same steps suit both).

Gradients are returned as ``dL/dRe + 1j dL/dIm`` (twice the Wirtinger derivative dL/dz*),
so a real perturbation ``d`` of ``z`` changes ``L`` by ``Re(conj(g) d)`` to first order; the
position gradient is ``dL/dcoords`` (per pixel). All sums are accumulated in
float64/complex128, so partial sums from any number of workers agree to rounding.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from outcore.backend import array_namespace, nearest_whole, to_host
from outcore.ptycho import kernels
from outcore.ptycho.kernels.arrays import preconditioner

Array = Any

#: Amplitudes (and intensities) below this are treated as zero in the gradients' divisions.
TINY = 1e-12
#: Coordinates this close to the pixel grid (pixels) are on it.
WHOLE_PIXEL = 1e-9
NOISE_MODELS: tuple[str, ...] = ("amplitude", "poisson")


@dataclass(frozen=True)
class Model:
    """What the forward model needs besides object, probe and positions.

    ``noise``: ``amplitude`` or ``poisson``. ``valid``: ``(K, K)`` bool, centred like the
    patterns, True where a detector pixel counts (None: all; the stores' ``mask`` is its
    negation). ``propagator``: ``(K, K)`` complex in FFT order, the free space between two
    slices (None: single slice). ``nearfield``: ``(K, K)`` complex in FFT order, the
    transfer from the exit wave to the detector of a near-field scan
    (``optics.nearfield_transfer``; None: far field, the FFT).
    """

    noise: str = "amplitude"
    valid: Array | None = None
    propagator: Array | None = None
    nearfield: Array | None = None

    def on(self, xp: Any) -> Model:
        """The same model with its arrays in ``xp`` (numpy or cupy)."""
        return replace(self, valid=None if self.valid is None else xp.asarray(self.valid),
                       propagator=None if self.propagator is None
                       else xp.asarray(self.propagator),
                       nearfield=None if self.nearfield is None
                       else xp.asarray(self.nearfield))


AMPLITUDE = Model()


def split(coords: Array) -> tuple[np.ndarray, np.ndarray]:
    """``top_left`` (n, 2) int64 and the sub-pixel rest ``f`` (n, 2) float64 of ``coords``;
    a rest under ``WHOLE_PIXEL`` is 0 (positions stored in metres come back a rounding error
    off the pixel grid, and a shift of 1e-14 pixel is not worth an FFT pair per pattern)."""
    coords = np.asarray(to_host(coords), dtype=np.float64)
    top_left = nearest_whole(coords)
    frac = coords - top_left
    frac[np.abs(frac) < WHOLE_PIXEL] = 0.0
    return top_left, frac


def subpixel(coords: Array) -> bool:
    """Whether any of ``coords`` is off the pixel grid (by ``WHOLE_PIXEL`` or more)."""
    return bool(np.any(split(coords)[1] != 0))


def as_slices(obj: Array) -> Array:
    """``obj`` as ``(S, Ny, Nx)`` (a 2-D object is one slice)."""
    return obj[None] if obj.ndim == 2 else obj


def as_modes(probe: Array) -> Array:
    """``probe`` as ``(M, K, K)`` (a 2-D probe is one mode)."""
    return probe[None] if probe.ndim == 2 else probe


def _frequencies(k: int, xp: Any) -> Array:
    """``fftfreq(k)``: frequencies in cycles per pixel, FFT order (float64)."""
    return xp.asarray(np.fft.fftfreq(k))


def _ramps(frac: np.ndarray, k: int, xp: Any, dtype: Any) -> Array:
    """``exp(-2 pi i q.f_j)`` (n, K, K), FFT order: the Fourier shift by ``f_j`` pixels."""
    q = _frequencies(k, xp)
    f = xp.asarray(frac)
    rows = xp.exp(-2j * np.pi * f[:, 0, None] * q[None, :]).astype(dtype)
    cols = xp.exp(-2j * np.pi * f[:, 1, None] * q[None, :]).astype(dtype)
    return rows[:, :, None] * cols[:, None, :]


@dataclass
class Forward:
    """The forward pass of a set of positions, kept for the backward pass.

    Its FFTs are unnormalised (one pass less each than ``norm="ortho"``): the scales of the
    unitary transforms sit in the small arrays, so the exit waves are ``1/K`` of the model's
    and their unnormalised transforms are the model's far fields."""

    top_left: np.ndarray  # (n, 2) int64
    obj: Array  # (S, Ny, Nx) the object the windows are cut from
    probe_hat: Array | None  # (M, K, K) fft2(probe) / K^3 (sub-pixel or positions only)
    ramps: Array | None  # (n, K, K) Fourier shifts (None: integer positions)
    incident: list  # S arrays (n or 1, M, K, K): the wave entering each slice, over K
    waves: Array  # (n, M, K, K) detector fields Psi, FFT order (zero frequency at index 0)


def forward(obj: Array, probe: Array, coords: Array, model: Model = AMPLITUDE,
            keep_shift: bool = False) -> Forward:
    """The detector fields ``Psi`` of every mode at the positions ``coords``, in FFT order
    (near field: ``ifftshift`` of the images)."""
    obj, probe = as_slices(obj), as_modes(probe)
    xp = array_namespace(obj)
    fft = kernels.fft(obj)
    k = probe.shape[-1]
    top_left, frac = split(coords)
    probe_hat = ramps = None
    if keep_shift or np.any(frac != 0):
        probe_hat = fft.fft2(probe) * k ** -3.0
        ramps = _ramps(frac, k, xp, probe.dtype)
        probes = fft.ifft2(probe_hat[None] * ramps[:, None], norm="forward", overwrite_x=True)
    else:
        probes = (probe / k)[None]
    incident = [probes]
    wave = kernels.exit_waves(obj[0], top_left, probes)
    waves = _through(wave, obj[1:], top_left, model, fft, incident)
    return Forward(top_left, obj, probe_hat, ramps, incident, waves)


def _propagator(model: Model, k: int, conjugate: bool = False) -> Array:
    """The free space between slices for unnormalised FFTs (``H / K^2``), or its adjoint."""
    h = model.propagator * k ** -2.0
    return h.conj() if conjugate else h


def _to_detector(wave: Array, model: Model, fft: Any) -> Array:
    """The detector field (FFT order) of the exit wave ``wave`` (n, M, K, K): its
    unnormalised ``fft2`` (far field), or ``ifft2(fft2(wave) T / K, norm="forward")`` (near
    field: the unitary propagation of the model's exit wave, ``K`` times ``wave``)."""
    if model.nearfield is None:
        return fft.fft2(wave, overwrite_x=True)
    return fft.ifft2(fft.fft2(wave, overwrite_x=True) * _nearfield(model, wave.shape[-1]),
                     norm="forward", overwrite_x=True)


def _from_detector(grad: Array, model: Model, fft: Any) -> Array:
    """The adjoint of ``_to_detector``: ``dL/dwave`` of the gradient ``grad`` of the
    detector field (the conjugate transfer function in the near field)."""
    if model.nearfield is not None:
        grad = fft.fft2(grad, overwrite_x=True) * _nearfield(model, grad.shape[-1], True)
    return fft.ifft2(grad, norm="forward", overwrite_x=True)


def _nearfield(model: Model, k: int, conjugate: bool = False) -> Array:
    """The near-field transfer for unnormalised FFTs (``T / K``), or its adjoint."""
    t = model.nearfield * k ** -1.0
    return t.conj() if conjugate else t


def _through(wave: Array, layers: Array, top_left: np.ndarray, model: Model, fft: Any,
             incident: list | None = None) -> Array:
    """The detector field (FFT order, unnormalised) of the wave ``wave`` (n, M, K, K) leaving
    the first slice, carried through the further slices ``layers`` (each cut at
    ``top_left``); the wave entering each of them is appended to ``incident`` when given."""
    if len(layers):
        h = _propagator(model, wave.shape[-1])
    for layer in layers:
        wave = fft.ifft2(fft.fft2(wave, overwrite_x=True) * h, norm="forward",
                         overwrite_x=True)
        if incident is not None:
            incident.append(wave)
        wave = kernels.exit_waves(layer, top_left, wave)
    return _to_detector(wave, model, fft)


def farfield(obj: Array, probe: Array, coords: Array, model: Model = AMPLITUDE) -> Array:
    """Detector waves ``Psi`` (n, M, K, K) complex, centred: the far field with its zero
    frequency at ``K // 2``, or the near-field images."""
    waves = forward(obj, probe, coords, model).waves
    return array_namespace(waves).fft.fftshift(waves, axes=(-2, -1))


def intensities(obj: Array, probe: Array, coords: Array, model: Model = AMPLITUDE) -> Array:
    """Diffraction intensities ``sum_m |Psi_m|^2`` (n, K, K), real, centred."""
    waves = farfield(obj, probe, coords, model)
    return (waves.real**2 + waves.imag**2).sum(axis=1)


def _residual(waves: Array, amplitudes: Array, model: Model) -> float:
    """The loss of the far fields ``waves`` (n, M, K, K, FFT order) against the centred
    ``amplitudes``; ``waves`` become ``dL/dPsi_m = w Psi_m`` in place
    (``kernels.residual``)."""
    return kernels.residual(waves, array_namespace(waves).asarray(amplitudes), model.valid,
                            model.noise == "poisson", TINY)


def loss(obj: Array, probe: Array, coords: Array, amplitudes: Array,
         model: Model = AMPLITUDE) -> float:
    """The loss of the given positions (amplitudes centred), as a float."""
    return _residual(forward(obj, probe, coords, model).waves, amplitudes, model)


@dataclass
class BatchTerms:
    """Sums over a set of positions; ``a + b`` sums the positions of both (``a``'s first).

    ``loss``: the loss. ``grad_obj`` (S, h, w) complex128: the object gradient on the region
    of the object whose corner is pixel ``origin`` (row, col) (nothing outside it).
    ``grad_probe`` (M, K, K) complex128: the probe gradient. ``illum_probe`` (K, K) float64:
    ``sum_j |obj[0] window j|^2``. ``count``: positions summed. With positions:
    ``index`` (b,) int64, the positions (as given by the caller) whose ``grad_pos`` (b, 2)
    ``dL/dcoords`` and ``curv_pos`` (b, 3) (the Gauss-Newton matrix ``[yy, yx, xx]`` of
    their amplitudes, float64; NaN rows where it was not computed) are held; else all three
    are None. ``illum_slices`` (S, h, w) float64, several slices only: ``sum_j sum_m |wave
    entering slice s|^2`` on the region (each slice's preconditioner).
    """

    loss: float
    origin: tuple[int, int]
    grad_obj: Array
    grad_probe: Array
    illum_probe: Array
    count: int
    index: np.ndarray | None = None
    grad_pos: np.ndarray | None = None
    curv_pos: np.ndarray | None = None
    illum_slices: Array | None = None

    def __add__(self, other: BatchTerms) -> BatchTerms:
        xp = array_namespace(self.grad_probe)
        top = min(self.origin[0], other.origin[0]), min(self.origin[1], other.origin[1])
        bottom = (max(self.origin[0] + self.grad_obj.shape[-2],
                      other.origin[0] + other.grad_obj.shape[-2]),
                  max(self.origin[1] + self.grad_obj.shape[-1],
                      other.origin[1] + other.grad_obj.shape[-1]))
        shape = (bottom[0] - top[0], bottom[1] - top[1])
        grad_obj = xp.zeros((self.grad_obj.shape[0], *shape), xp.complex128)
        illum = None if self.illum_slices is None else xp.zeros(
            (self.illum_slices.shape[0], *shape), xp.float64)
        for part in (self, other):
            r, c = part.origin[0] - top[0], part.origin[1] - top[1]
            h, w = part.grad_obj.shape[-2:]
            grad_obj[:, r:r + h, c:c + w] += part.grad_obj
            if illum is not None:
                illum[:, r:r + h, c:c + w] += part.illum_slices
        positions = {}
        if self.index is not None and other.index is not None:
            positions = {"index": np.concatenate([self.index, other.index]),
                         "grad_pos": np.concatenate([self.grad_pos, other.grad_pos]),
                         "curv_pos": np.concatenate([self.curv_pos, other.curv_pos])}
        return BatchTerms(self.loss + other.loss, top, grad_obj,
                          self.grad_probe + other.grad_probe,
                          self.illum_probe + other.illum_probe, self.count + other.count,
                          illum_slices=illum, **positions)

    @classmethod
    def zeros(cls, origin: tuple[int, int], extent: tuple[int, int], like: BatchTerms
              ) -> BatchTerms:
        """Zero terms on the region of ``extent`` pixels from ``origin``, with the arrays
        ``like`` has (slices, modes, illuminations, positions), to ``accumulate`` into."""
        xp = array_namespace(like.grad_probe)
        slices = like.grad_obj.shape[0]
        positions = {}
        if like.index is not None:
            positions = {"index": np.zeros(0, np.int64), "grad_pos": np.zeros((0, 2)),
                         "curv_pos": np.zeros((0, 3))}
        illum = None if like.illum_slices is None else xp.zeros((slices, *extent), xp.float64)
        return cls(0.0, origin, xp.zeros((slices, *extent), xp.complex128),
                   xp.zeros_like(like.grad_probe), xp.zeros_like(like.illum_probe), 0,
                   illum_slices=illum, **positions)

    def accumulate(self, other: BatchTerms) -> BatchTerms:
        """``self + other``, added into ``self``'s arrays when ``other``'s region lies within
        ``self``'s (the same sums as ``+``, without a new region)."""
        r, c = other.origin[0] - self.origin[0], other.origin[1] - self.origin[1]
        h, w = other.grad_obj.shape[-2:]
        if r < 0 or c < 0 or r + h > self.grad_obj.shape[-2] or c + w > self.grad_obj.shape[-1]:
            return self + other
        self.grad_obj[:, r:r + h, c:c + w] += other.grad_obj
        if self.illum_slices is not None:
            self.illum_slices[:, r:r + h, c:c + w] += other.illum_slices
        self.grad_probe += other.grad_probe
        self.illum_probe += other.illum_probe
        self.loss += other.loss
        self.count += other.count
        if self.index is not None and other.index is not None:
            self.index = np.concatenate([self.index, other.index])
            self.grad_pos = np.concatenate([self.grad_pos, other.grad_pos])
            self.curv_pos = np.concatenate([self.curv_pos, other.curv_pos])
        return self

    def full_grad_obj(self, object_shape: tuple[int, ...]) -> Array:
        """The object gradient on the whole object of ``object_shape`` ((S, Ny, Nx) or, for
        one slice, (Ny, Nx)), zeros outside the region."""
        return self._full(self.grad_obj, object_shape, "complex128")

    def _full(self, region: Array, object_shape: tuple[int, ...], dtype: str) -> Array:
        xp = array_namespace(self.grad_probe)
        full = xp.zeros((region.shape[0], *object_shape[-2:]), dtype)
        r, c = self.origin
        full[:, r:r + region.shape[-2], c:c + region.shape[-1]] = region
        return full.reshape(object_shape)


def batch_terms(obj: Array, probe: Array, coords: Array, amplitudes: Array,
                model: Model = AMPLITUDE, index: np.ndarray | None = None,
                curvature: bool = True) -> BatchTerms:
    """Loss, gradients and probe illumination of the positions ``coords`` (n, 2) whose
    measured amplitudes are ``amplitudes`` (n, K, K), centred like ``farfield``.

    With ``index`` (n,) (the positions' numbers, kept with their terms), the position
    gradients are computed too, and their curvatures unless ``curvature`` is False (then
    ``curv_pos`` is NaN: 4 of the 8 batch-sized FFTs of a refined set are the curvatures'
    and the caller may keep earlier ones). A fixed number of passes over the whole set
    (``kernels``); callers bound the set's size to bound the transient memory, about
    ``n M K^2`` x ``memory.SCRATCH_PER_PIXEL`` bytes.
    """
    obj, probe = as_slices(obj), as_modes(probe)
    xp = array_namespace(obj)
    fft = kernels.fft(obj)
    k = probe.shape[-1]
    fwd = forward(obj, probe, coords, model, keep_shift=index is not None)
    curv_pos = None
    if index is not None:
        curv_pos = _position_curvature(fwd, model, fft, xp) if curvature else np.full(
            (len(index), 3), np.nan)
    total_loss = _residual(fwd.waves, amplitudes, model)
    # K dL/dpsi at the last slice (the exit waves were 1/K of the model's)
    chi = _from_detector(fwd.waves, model, fft)
    fwd.waves = None
    top_left = fwd.top_left
    origin = (int(top_left[:, 0].min()), int(top_left[:, 1].min()))
    extent = (int(top_left[:, 0].max()) - origin[0] + k, int(top_left[:, 1].max()) - origin[1] + k)
    slices = len(obj)
    grad_obj = xp.zeros((slices, *extent), xp.complex128)
    local = top_left - np.asarray(origin)
    illum_slices = None
    if slices > 1:
        illum_slices = xp.zeros((slices, *extent), xp.float64)
        for s, wave in enumerate(fwd.incident):
            kernels.scatter_add(illum_slices[s], local,
                                (wave.real**2 + wave.imag**2).sum(axis=1) * k**2)
    illum_probe = xp.zeros((k, k), xp.float64)
    probe_sum = xp.zeros(probe.shape, xp.complex128) if fwd.ramps is None else None
    for s in range(slices - 1, -1, -1):
        kernels.back_layer(chi, obj[s], top_left, fwd.incident[s], grad_obj[s], local,
                           None if s else illum_probe, None if s else probe_sum)
        if s:
            chi = fft.ifft2(fft.fft2(chi, overwrite_x=True) * _propagator(model, k, True),
                            norm="forward", overwrite_x=True)
    # chi is now K dL/d(shifted probe), (n, M, K, K)
    positions: dict[str, Any] = {}
    if fwd.ramps is None:
        grad_probe = probe_sum / k
    else:
        # Parseval: the fft2 of K dL/d probe_f against fft2(probe) / K^3 (both unnormalised)
        # has the scale of the unitary transforms'
        unshifted, grad_pos = kernels.unshift(fft.fft2(chi, overwrite_x=True),
                                              fwd.probe_hat, fwd.ramps, index is not None)
        grad_probe = fft.ifft2(unshifted) / k
        if index is not None:
            positions = {"index": np.asarray(index), "curv_pos": curv_pos,
                         "grad_pos": to_host(grad_pos)}
    return BatchTerms(total_loss, origin, grad_obj, grad_probe, illum_probe,
                      int(top_left.shape[0]), illum_slices=illum_slices, **positions)


def _position_curvature(fwd: Forward, model: Model, fft: Any, xp: Any) -> np.ndarray:
    """The Gauss-Newton matrix of each position's amplitudes, ``sum_k J_a J_b`` with
    ``J = d sqrt(I) / d coords``, as (n, 3) ``[yy, yx, xx]`` float64 on the host (the Poisson
    loss's curvature equals it near the fit). The shifted probe moves with ``coords``:
    ``d probe_f / d f_a = ifft2(fft2(probe) ramp (-2 pi i q_a))``, carried to the far field."""
    waves = fwd.waves
    q = _frequencies(waves.shape[-1], xp)
    far = []
    for axis_q in (q[:, None], q[None, :]):
        slope = (fwd.probe_hat * (-2j * np.pi * axis_q)).astype(waves.dtype)
        moved = fft.ifft2(slope[None] * fwd.ramps[:, None], norm="forward", overwrite_x=True)
        far.append(_through(kernels.exit_waves(fwd.obj[0], fwd.top_left, moved),
                            fwd.obj[1:], fwd.top_left, model, fft))
    return to_host(kernels.curvature(waves, *far, model.valid, TINY))


def object_illumination(probe: Array, top_left: Array, object_shape: tuple[int, ...]) -> Array:
    """``sum_j sum_m |probe_m|^2`` placed at each window ``top_left`` (n, 2): (Ny, Nx)
    float64 (the object's preconditioner; sub-pixel shifts are left out)."""
    probe = as_modes(probe)
    xp = array_namespace(probe)
    power = (probe.real**2 + probe.imag**2).sum(axis=0).astype(xp.float64)
    illumination = xp.zeros(object_shape[-2:], xp.float64)
    top_left = np.asarray(to_host(top_left))
    kernels.scatter_add(illumination, top_left, power[None])
    return illumination


def update(obj: Array, probe: Array, terms: BatchTerms, coords: Array, *, step_obj: float,
           step_probe: float, alpha: float) -> tuple[Array, Array]:
    """One preconditioned gradient step on object and probe (new arrays, shapes and dtypes
    kept).

    ``obj -= step_obj / S * (grad_obj / 2) / ((1 - alpha) illum_obj + alpha max(illum_obj))``
    (``illum_obj`` the probe's power at the windows ``coords`` of the batch, or, for several
    slices, each slice's ``illum_slices``; each of the ``S`` slices takes its share of the
    correction), on the terms' region only, and likewise for every probe mode with its own
    illumination (``step_probe = 0`` keeps the probe). With ``step = 1`` and one position
    this is the projection of ePIE/rPIE: the window moves onto the wave whose far-field
    amplitude is the measured one.
    """
    r, c = terms.origin
    slices, h, w = terms.grad_obj.shape
    if terms.illum_slices is None:
        local = split(coords)[0] - np.asarray(terms.origin)
        illumination = object_illumination(probe, local, (h, w))[None]
    else:  # each slice by the power of the waves entering it
        illumination = terms.illum_slices
    new_obj = obj.copy()
    layers = as_slices(new_obj)
    layers[:, r:r + h, c:c + w] -= kernels.object_step(terms.grad_obj, illumination,
                                                       step_obj / slices * 0.5, alpha, TINY,
                                                       obj.dtype)
    if step_probe == 0:
        return new_obj, probe
    step = step_probe * 0.5 * terms.grad_probe / preconditioner(terms.illum_probe, alpha,
                                                                TINY)
    new_probe = probe - step.reshape(probe.shape).astype(probe.dtype)
    return new_obj, new_probe


_WARM: set[str] = set()


def warm() -> None:
    """Compile the host loops of ``kernels`` for the engine's dtypes (complex64 waves and
    object, float32 amplitudes), or load them from numba's on-disk cache (``cache=True``), once per
    process, by running ``batch_terms`` and ``update`` on a tiny scan: whole-pixel and
    sub-pixel positions, refined, one and two slices. ``engine.run`` calls it where the
    client starts the shards, so that workers sharing numba's cache directory load the
    machine code instead of each compiling it (about 10 CPU seconds on a clean cache)."""
    if "cpu" in _WARM:
        return
    k = 4
    amplitudes = np.ones((2, k, k), np.float32)
    probe = np.ones((1, k, k), np.complex64)
    for slices in (1, 2):
        obj = np.ones((slices, 2 * k, 2 * k), np.complex64)
        model = Model(propagator=np.ones((k, k), np.complex64) if slices > 1 else None)
        for coords, index in ((np.zeros((2, 2)), None), (np.full((2, 2), 0.25), np.arange(2))):
            terms = batch_terms(obj, probe, coords, amplitudes, model, index=index)
            update(obj, probe, terms, coords, step_obj=1.0, step_probe=1.0, alpha=0.1)
    _WARM.add("cpu")
