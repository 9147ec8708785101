"""Scan geometry of a tomography data set: parallel beam or circular cone beam.

Conventions (used by every kernel, operator and solver of ``outcore.tomo``):

- Lengths are in the volume's length unit (the layouts store metres); angles in radians.
- The volume is ``(z, y, x)``, cubic voxels of edge ``voxel_size``, centred on the origin:
  voxel ``(k, j, i)`` has its centre at ``x = (i - (nx - 1) / 2) * voxel_size`` (same for
  ``y`` and ``z``). The rotation axis is the ``z`` axis.
- Projections are ``(view, v, u)``. At angle ``theta`` the detector row direction is
  ``e_u = (cos theta, sin theta, 0)`` in ``(x, y, z)`` and rays travel along
  ``e_d = (-sin theta, cos theta, 0)``; ``v`` runs along ``z``. Pixel ``(v, u)`` has its centre at
  ``u = (iu - (nu - 1) / 2) * du + offset_u`` and ``v = (iv - (nv - 1) / 2) * dv + offset_v``.
- Parallel beam: the ray of pixel ``(v, u)`` is the line ``u e_u + v e_z + t e_d``, so a point
  ``(x, y, z)`` projects to ``u = x cos theta + y sin theta``, ``v = z``: slices along ``z`` are
  independent.
- Cone beam: the source sits at ``-source_distance * e_d`` (in the plane ``z = 0``) and the
  flat detector is the plane through ``detector_distance * e_d`` spanned by ``e_u`` and ``e_z``;
  the ray of pixel ``(v, u)`` joins the source to the pixel centre. A point projects with the
  magnification ``M = (source_distance + detector_distance) / (source_distance + x . e_d)``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from outcore.backend import whole_ceil
from outcore.errors import LayoutError

Kind = Literal["parallel", "cone"]
#: Voxel edge of a simulated volume when none is given, metres.
DEFAULT_VOXEL_M = 1e-3
KINDS: tuple[str, ...] = ("parallel", "cone")


def _pair(value: float | Sequence[float], name: str) -> tuple[float, float]:
    values = np.atleast_1d(np.asarray(value, dtype=np.float64)).ravel()
    if values.size == 1:
        values = np.repeat(values, 2)
    if values.size != 2:
        raise ValueError(f"{name} must be a number or a pair (v, u), not {value!r}.")
    return float(values[0]), float(values[1])


@dataclass(frozen=True, eq=False)
class Geometry:
    """A scan: its angles, detector and (cone) distances, and the volume's voxel size.

    ``angles`` (view,) in radians; ``detector_shape`` ``(nv, nu)`` pixels;
    ``detector_pixel_size`` ``(dv, du)`` (or one number); ``detector_offset`` ``(v, u)`` shift
    of the detector centre; ``voxel_size`` the volume's voxel edge. Cone beam needs
    ``source_distance`` and ``detector_distance`` (both from the rotation axis). All lengths in
    the volume's unit.
    """

    kind: Kind
    angles: np.ndarray
    detector_shape: tuple[int, int]
    detector_pixel_size: tuple[float, float] = (1.0, 1.0)
    voxel_size: float = 1.0
    source_distance: float | None = None
    detector_distance: float | None = None
    detector_offset: tuple[float, float] = field(default=(0.0, 0.0))

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"geometry kind must be one of {KINDS}, not {self.kind!r}.")
        angles = np.array(self.angles, dtype=np.float64).reshape(-1)
        if angles.size == 0 or not np.isfinite(angles).all():
            raise ValueError("angles must be a non-empty list of finite numbers (radians).")
        angles.setflags(write=False)
        shape = tuple(int(n) for n in self.detector_shape)
        if len(shape) != 2 or min(shape) < 1:
            raise ValueError(f"detector_shape must be (nv, nu) >= 1, not {self.detector_shape}.")
        set_ = object.__setattr__
        set_(self, "angles", angles)
        set_(self, "detector_shape", shape)
        set_(self, "detector_pixel_size", _pair(self.detector_pixel_size, "detector_pixel_size"))
        set_(self, "detector_offset", _pair(self.detector_offset, "detector_offset"))
        set_(self, "voxel_size", float(self.voxel_size))
        if min(self.detector_pixel_size) <= 0 or self.voxel_size <= 0:
            raise ValueError("detector_pixel_size and voxel_size must be positive.")
        if self.kind == "cone":
            if self.source_distance is None or self.detector_distance is None:
                raise ValueError("a cone-beam geometry needs source_distance and "
                                 "detector_distance (from the rotation axis).")
            set_(self, "source_distance", float(self.source_distance))
            set_(self, "detector_distance", float(self.detector_distance))
            if self.source_distance <= 0 or self.detector_distance < -self.source_distance:
                raise ValueError("source_distance must be positive and the detector must lie "
                                 "beyond the source.")
        else:
            set_(self, "source_distance", None)
            set_(self, "detector_distance", None)

    @classmethod
    def parallel(cls, angles: Sequence[float] | np.ndarray, detector_shape: tuple[int, int],
                 **kwargs: Any) -> Geometry:
        """A parallel-beam geometry (keywords as the class)."""
        return cls("parallel", np.asarray(angles), detector_shape, **kwargs)

    @classmethod
    def cone(cls, angles: Sequence[float] | np.ndarray, detector_shape: tuple[int, int],
             source_distance: float, detector_distance: float, **kwargs: Any) -> Geometry:
        """A circular cone-beam geometry (keywords as the class)."""
        return cls("cone", np.asarray(angles), detector_shape, source_distance=source_distance,
                   detector_distance=detector_distance, **kwargs)

    @property
    def n_views(self) -> int:
        return int(self.angles.size)

    @property
    def projection_shape(self) -> tuple[int, int, int]:
        """``(view, v, u)`` shape of the projections."""
        return (self.n_views, *self.detector_shape)

    @property
    def magnification(self) -> float:
        """Magnification at the rotation axis (1 for parallel beam)."""
        if self.kind == "parallel":
            return 1.0
        return (self.source_distance + self.detector_distance) / self.source_distance

    def with_angles(self, angles: np.ndarray) -> Geometry:
        """The same geometry over other angles (e.g. a block of views)."""
        return Geometry(self.kind, angles, self.detector_shape, self.detector_pixel_size,
                        self.voxel_size, self.source_distance, self.detector_distance,
                        self.detector_offset)

    def radius(self, volume_shape: tuple[int, int, int]) -> float:
        """In-plane radius that holds every ray sample inside the volume, in length units."""
        _, ny, nx = volume_shape
        return self.voxel_size * (math.hypot(nx / 2, ny / 2) + 1.0)

    def check_volume(self, volume_shape: tuple[int, int, int]) -> None:
        """Refuse a volume that reaches the source circle of a cone-beam scan."""
        if self.kind == "cone" and self.radius(volume_shape) >= 0.95 * self.source_distance:
            raise ValueError(
                f"the volume {volume_shape} of voxel {self.voxel_size} reaches the source "
                f"circle (radius {self.source_distance}); use a smaller voxel_size or volume."
            )

    def row_band(self, z0: int, z1: int, volume_shape: tuple[int, int, int]) -> tuple[int, int]:
        """Detector rows ``[v0, v1)`` that the slab ``z0 <= k < z1`` of the volume can touch.

        A row outside the band has no ray sample, nor voxel-driven sample, within the slab.
        Conservative by one row on each side; clipped to the detector.
        """
        nv = self.detector_shape[0]
        dv, _ = self.detector_pixel_size
        cz = (volume_shape[0] - 1) / 2
        z_lo = (z0 - 1 - cz) * self.voxel_size
        z_hi = (z1 - cz) * self.voxel_size
        if self.kind == "cone":
            r = self.radius(volume_shape)
            mags = [(self.source_distance + self.detector_distance) / (self.source_distance + w)
                    for w in (-r, r)]
            z_lo, z_hi = min(z_lo * m for m in mags), max(z_hi * m for m in mags)
        cv = (nv - 1) / 2
        lo = (z_lo - self.detector_offset[0]) / dv + cv
        hi = (z_hi - self.detector_offset[0]) / dv + cv
        v0 = max(0, math.floor(lo) - 1)
        v1 = min(nv, math.ceil(hi) + 2)
        return (v0, max(v0, v1))

    def kernel_args(self) -> tuple[bool, float, float, float, float, float, float, float]:
        """Kernel scalars: cone?, source and detector distances, dv, du, offsets, voxel."""
        dv, du = self.detector_pixel_size
        ov, ou = self.detector_offset
        return (self.kind == "cone", float(self.source_distance or 0.0),
                float(self.detector_distance or 0.0), dv, du, ov, ou, self.voxel_size)

    def to_attrs(self) -> dict[str, Any]:
        """Attrs of the ``projections`` layout (angles are the ``angles(view)`` variable)."""
        attrs: dict[str, Any] = {
            "geometry": self.kind,
            "detector_pixel_size": list(self.detector_pixel_size),
            "detector_offset": list(self.detector_offset),
            "voxel_size": self.voxel_size,
        }
        if self.kind == "cone":
            attrs["source_distance"] = self.source_distance
            attrs["detector_distance"] = self.detector_distance
        return attrs

    @classmethod
    def from_attrs(cls, ds: Any, voxel_size: float | None = None) -> Geometry:
        """The geometry of a dataset in the ``projections`` layout (attrs and ``angles``).

        ``voxel_size`` overrides the ``voxel_size`` attr; without either, a voxel is the
        detector pixel ``du`` divided by the magnification at the axis.
        """
        attrs: Mapping[str, Any] = ds.attrs
        kind = attrs.get("geometry")
        if kind not in KINDS:
            raise LayoutError(f"projections attr geometry is {kind!r}; expected one of {KINDS}.",
                              "set ds.attrs['geometry'] to 'parallel' or 'cone'.")
        if "angles" not in ds.variables:
            raise LayoutError("projections need the angles(view) variable [rad].",
                              "add it, e.g. ds['angles'] = ('view', angles).")
        if "detector_pixel_size" not in attrs:
            raise LayoutError("projections need the attr detector_pixel_size [length].",
                              "set ds.attrs['detector_pixel_size'] = [dv, du] (or one number).")
        pixel = _pair(attrs["detector_pixel_size"], "detector_pixel_size")
        source, detector = attrs.get("source_distance"), attrs.get("detector_distance")
        size = voxel_size if voxel_size is not None else attrs.get("voxel_size")
        if size is None:
            size = pixel[1] * (source / (source + detector) if kind == "cone" else 1.0)
        sizes = np.unique(np.ravel(np.asarray(size, dtype=np.float64)))
        if sizes.size != 1:
            raise LayoutError(f"voxel_size {size!r} is not isotropic; outcore.tomo uses cubic "
                              "voxels.", "pass one voxel_size (voxel_size=...).")
        return cls(kind, np.asarray(ds["angles"].values), tuple(ds["projections"].shape[1:]),
                   pixel, float(sizes[0]), source, detector,
                   attrs.get("detector_offset", (0.0, 0.0)))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Geometry):
            return NotImplemented
        return (self.to_attrs() == other.to_attrs() and self.detector_shape == other.detector_shape
                and np.array_equal(self.angles, other.angles))

    __hash__ = None  # type: ignore[assignment]


def uniform_angles(n_views: int, kind: Kind = "parallel") -> np.ndarray:
    """``n_views`` angles evenly over a half turn (parallel) or a full turn (cone), radians."""
    span = math.pi if kind == "parallel" else 2 * math.pi
    return np.arange(n_views, dtype=np.float64) * (span / n_views)


def scan_for(kind: Kind, volume_shape: tuple[int, int, int], n_views: int,
             voxel_size: float = 1.0) -> Geometry:
    """A full scan of ``n_views`` whose detector sees all of ``volume_shape (z, y, x)``.

    Parallel: pixels of one voxel, one row per plane. Cone: source and detector at 3 and 2
    volume diagonals from the axis, pixels of one voxel at the axis (``voxel *
    magnification``), a margin of empty rows and columns all round.
    """
    nz, ny, nx = volume_shape
    half = voxel_size * math.hypot(nx, ny) / 2
    if kind == "parallel":
        return Geometry.parallel(uniform_angles(n_views, kind),
                                 (nz, 2 * whole_ceil(half / voxel_size) + 2),
                                 detector_pixel_size=voxel_size, voxel_size=voxel_size)
    source, detector = 6 * half, 4 * half
    pixel = voxel_size * (source + detector) / source
    widest = (source + detector) / (source - half)
    return Geometry.cone(uniform_angles(n_views, kind),
                         (whole_ceil((nz + 2) * voxel_size * widest / pixel) + 2,
                          2 * whole_ceil((half + voxel_size) * widest / pixel) + 2),
                         source, detector, detector_pixel_size=pixel, voxel_size=voxel_size)
