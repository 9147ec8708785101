"""Difference imaging from Python: ``difference`` and ``catalog`` on the user's own cluster.

Both take a pair as the user holds it, ``reference`` and ``target`` as ``xarray.DataArray``
images ``(y, x)`` (their WCS in their attrs, or ``aligned=True``, or ``register='stars'``;
``outcore.diffim.images``) or as FITS paths, or several pairs at once: ``pairs=`` a manifest's
path or the checked pairs of ``read_manifest``. They run on ``client`` (else the default
client, else an in-process cluster: ``outcore.session``), check every argument and the
memory plan for that cluster's workers before any task (``plan_pairs``: the tile side is
chosen there unless ``tile=`` is given; a ``PlanError`` names ``tile=`` and
``memory_limit=``), then compute the pairs' models (one survey of each image: backgrounds,
PSFs, flux ratio, kernels, noise scale; a pair that cannot be modelled is refused before any
tile) and check the plan again at the kernels' exact reach.

``difference`` returns the images lazily (nothing of them is computed until asked);
``catalog`` runs the tiles (the rows are known only after detection) and returns the sources
and their cutouts as lazy Datasets over the tiles' results, which stay on the cluster.
``outcore diffim`` parses its flags, plans with ``plan_pairs`` and calls ``catalog`` with
the plan it printed: one path, one answer.
"""

from __future__ import annotations

import math
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, replace
from os import PathLike
from pathlib import Path
from typing import Any, NamedTuple

import distributed
import xarray as xr

from outcore import backend as backends
from outcore import session
from outcore.arguments import keywords_checked
from outcore.checks import at_least, choice, positive
from outcore.diffim import images, memory, operator
from outcore.diffim.basis import BASES
from outcore.diffim.manifest import ITEM_ID, PSF_KEYS, SUBTRACTIONS, Pair, read_manifest
from outcore.diffim.prepare import Options, PairModel
from outcore.diffim.register import register_pairs
from outcore.diffim.stack import METHODS as STACKS
from outcore.errors import ArgumentError, OutcoreError, refuse_existing
from outcore.plan import Plan, Resources
from outcore.progress import SHOW_PROGRESS, follow

__all__ = ["BASES", "FIT_MODELS", "METHODS", "PLAN_FIXES", "REGISTRATIONS", "Catalog", "Choice",
           "catalog", "difference", "options_of", "plan_pairs"]

#: Subtraction methods: ZOGY's, a matching kernel fitted to the pair, or the better of the
#: two on a sample of the pair (``outcore.diffim.choose``).
METHODS = SUBTRACTIONS
#: Dipole models of the fits.
FIT_MODELS = ("psf", "gaussian")
#: Registrations of a target without WCS.
REGISTRATIONS = ("stars",)
#: What a plan that does not fit can change (keywords; the command line shows its flags).
PLAN_FIXES = ("use a smaller tile=",)


class Catalog(NamedTuple):
    """What ``catalog`` returns: ``sources``, one row per source (dims ``source``), and
    ``cutouts`` in the ``cutouts`` layout (``images``, ``variance``, ``mask``
    ``(candidate, y, x)``; ``candidate_id`` is the row of ``sources``)."""

    sources: xr.Dataset
    cutouts: xr.Dataset


@dataclass(frozen=True)
class Choice:
    """What a plan chose: the options (with their tile) and the resources planned for, on
    which the exact plan is made once the PSFs, and so the halo, are known."""

    options: Options
    resources: Resources


#: Highest degree of a fitted kernel's spatial variation.
MAX_KERNEL_DEGREE = 4


def options_of(*, threshold: float = 5.0, stamp: int = 21, fit_model: str = "psf",
               tile: int | None = None, background_box: int = 64, psf_size: int = 25,
               star_snr: float | None = None, method: str = "auto", kernel_degree: int = 2,
               kernel_basis: str = "auto", backend: str = "auto") -> Options:
    """The checked options of a run (``tile`` None: ``memory.TILE_SIDES[0]`` until the plan
    chooses it); each refusal names its keyword."""
    positive(threshold, "threshold", "the detection threshold, e.g. threshold=5")
    if not math.isfinite(threshold):
        raise OutcoreError(f"threshold={threshold} is not finite.", "e.g. threshold=5.")
    _odd(stamp, "stamp", 5, 21)
    _odd(psf_size, "psf_size", 5, 25)
    choice(fit_model, FIT_MODELS, "fit_model")
    choice(method, METHODS, "method")
    if isinstance(kernel_degree, bool) or not isinstance(kernel_degree, int) \
            or not 0 <= kernel_degree <= MAX_KERNEL_DEGREE:
        raise OutcoreError(f"kernel_degree={kernel_degree!r} is not a whole degree from 0 to"
                           f" {MAX_KERNEL_DEGREE}.",
                           "give the degree of the kernel's variation over the image, e.g."
                           " kernel_degree=2 (0: one kernel everywhere).")
    choice(kernel_basis, BASES, "kernel_basis")
    if tile is not None:
        at_least(tile, "tile", 64, "a tile side of 64 or more, e.g. tile=1024")
    at_least(background_box, "background_box", 8,
             "a box side of 8 or more, e.g. background_box=64")
    positive(star_snr, "star_snr", "the stars' least S/N, e.g. star_snr=50")
    choice(backend, ("auto", "numpy", "cupy"), "backend")
    return Options(threshold=threshold, stamp=stamp, fit_model=fit_model,
                   tile=tile or memory.TILE_SIDES[0], box=background_box, psf_size=psf_size,
                   star_snr=star_snr, backend=backends.resolve(backend), method=method,
                   kernel_degree=kernel_degree, kernel_basis=kernel_basis)


def _odd(value: int, name: str, least: int, example: int) -> None:
    at_least(value, name, least, f"an odd side of {least} or more, e.g. {name}={example}")
    if value % 2 == 0:
        raise OutcoreError(f"{name}={value} must be odd.", f"e.g. {name}={example}.")


def plan_pairs(pairs: Sequence[Pair], options: Options, resources: Resources, *,
               tile: int | None = None, halo: int | None = None,
               catalog: bool = True) -> Plan:
    """The memory plan of subtracting ``pairs`` with ``options`` on ``resources`` (computes
    nothing): with tiles of ``tile`` pixels, else of the side the plan chooses
    (``memory.choose_tile``), and a halo of ``halo`` pixels, else the bound no pair exceeds
    before its PSFs are known; with ``catalog`` the writing of the catalog too (``catalog``,
    ``outcore diffim``), else the images only (``difference``). Its choices are a
    ``Choice``."""
    shapes = [p.shape for p in pairs]
    variance = any(p.reference_variance is not None for p in pairs)
    sides = [options.psf_size] + [min(max(getattr(p, k).shape), options.psf_size)
                                  for p in pairs for k in PSF_KEYS if getattr(p, k) is not None]
    methods = tuple(sorted({options.method_of(p) for p in pairs}))
    bound = memory.halo_bound(sides, options.stamp, methods, options.kernel_basis)
    side = tile or memory.choose_tile(shapes, options, bound, variance, resources, catalog,
                                      methods)
    chosen = replace(options, tile=side)
    return memory.run_plan(shapes, chosen, bound if halo is None else halo, variance,
                           resources, bound=bound, chosen=tile is None,
                           choices=Choice(chosen, resources), catalog=catalog,
                           methods=methods)


@dataclass
class _Prepared:
    """Pairs ready for their tiles: modelled, their options (tile chosen), their facts."""

    client: distributed.Client
    pairs: list[Pair]
    models: list[PairModel]
    options: Options
    attrs: dict[str, Any]
    single: bool


def _prepare(reference: Any, target: Any, pairs: Any, files: dict[str, Any],
             psfs: dict[str, Any], per_pair: dict[str, Any], options: Options,
             tile: int | None, workdir: Any, client: distributed.Client | None,
             plan: Plan | None, catalog: bool) -> _Prepared:
    """The pairs of the arguments, checked (before any cluster is started for them); the
    plan for ``client``'s workers (or ``plan``), checked before any task; the arrays written
    where the workers read them; targets registered; the models; the exact plan checked."""
    checked, arrays, single = _pairs(reference, target, pairs, files, psfs, per_pair, workdir)
    client = session.client_for(client)
    plan = session.fitted_plan(lambda r: plan_pairs(checked, options, r, tile=tile,
                                                    catalog=catalog),
                               client, options.backend, plan=plan, fixes=PLAN_FIXES,
                               device_fixes=PLAN_FIXES)
    choice_ = plan.choices
    options = replace(options, tile=choice_.options.tile)
    if arrays:
        images.write_arrays(checked[0], arrays, client)
    checked, registrations = register_pairs(checked, client)
    models = operator.compute_models(checked, options, client)
    plan_pairs(checked, options, choice_.resources, tile=options.tile,
               halo=max(m.halo for m in models), catalog=catalog).check(PLAN_FIXES,
                                                                        PLAN_FIXES)
    facts = [operator.pair_facts(p, m, registrations.get(p.item_id))
             for p, m in zip(checked, models, strict=True)]
    return _Prepared(client, checked, models, options,
                     operator.result_attrs(checked, facts), single)


def _pairs(reference: Any, target: Any, pairs: Any, files: dict[str, Any],
           psfs: dict[str, Any], per_pair: dict[str, Any], workdir: Any
           ) -> tuple[list[Pair], dict[str, xr.DataArray] | None, bool]:
    """The checked pairs, the arrays to write for them (None: files only) and whether one
    pair was given as ``reference`` and ``target``."""
    defaults = {"flux_ratio": None, "zeropoint": None, "saturation": None, "aligned": False,
                "register": None, "stack": "median", "item_id": "pair", "fwhm": None}
    if pairs is not None:
        given = [k for k, v in {"reference": reference, "target": target, **files, **psfs}.items()
                 if v is not None]
        given += [k for k, v in per_pair.items() if v != defaults[k]]
        if given:
            raise ArgumentError(
                f"pairs= carries each pair's own images and options; {given[0]}= was given too.",
                f"give pairs= alone (a manifest item holds \"{given[0]}\"), or reference= and"
                " target= with their keywords.")
        return _pairs_given(pairs), None, False
    if reference is None or target is None:
        raise ArgumentError("difference imaging needs reference= and target= (or pairs=).",
                            "give reference= and target= as DataArrays (y, x) or FITS paths.")
    grid = _grid(per_pair)
    options = {k: per_pair[k] for k in ("flux_ratio", "zeropoint", "saturation", "item_id",
                                        "fwhm")}
    given = {"reference": reference, "target": target, **files}
    paths = {images.is_path(v) for v in given.values() if v is not None}
    if paths == {True}:
        pair, _ = images.file_pair(given, psfs, grid=grid, stack=per_pair["stack"], **options)
        return [pair], None, True
    if True in paths:
        kinds = ", ".join(f"{k}= a {'path' if images.is_path(v) else type(v).__name__}"
                          for k, v in given.items() if v is not None)
        raise ArgumentError(f"The images of a pair are either all FITS paths or all arrays;"
                            f" here {kinds}.",
                            "open the FITS files as DataArrays (dims ('y', 'x'), WCS in"
                            " attrs['wcs']), or give every image as a path.")
    pair, arrays = images.array_pair(given, psfs, grid=grid, workdir=workdir, **options)
    return [pair], arrays, True


def _pairs_given(pairs: Any) -> list[Pair]:
    """``pairs=``: a manifest's path (read and checked) or checked pairs."""
    if images.is_path(pairs):
        return read_manifest(pairs)[0]
    if isinstance(pairs, Sequence) and pairs and all(isinstance(p, Pair) for p in pairs):
        return list(pairs)
    raise ArgumentError(f"pairs= is a {type(pairs).__name__}, not a manifest's path or the"
                        " pairs read_manifest returns.",
                        "give pairs='pairs.json', or reference= and target=.")


def _grid(per_pair: dict[str, Any]) -> str:
    """How the target reaches the reference's grid (``manifest.GRIDS``), from
    ``aligned=`` and ``register=``, with the pair's other options checked."""
    aligned, register = per_pair["aligned"], per_pair["register"]
    if not isinstance(aligned, bool):
        raise ArgumentError(f"aligned={aligned!r} is not True or False.",
                            "give aligned=True for images already on one pixel grid.")
    if register is not None:
        choice(register, REGISTRATIONS, "register")
    if aligned and register:
        raise ArgumentError("aligned=True and register= exclude each other.",
                            "give aligned=True for images already on one grid, else"
                            " register='stars'.")
    for name in ("flux_ratio", "saturation"):
        if per_pair[name] is not None and not math.isfinite(per_pair[name]):
            raise OutcoreError(f"{name}={per_pair[name]} is not finite.", f"e.g. {name}=1.")
        positive(per_pair[name], name, f"a positive {name}=")
    fwhm = per_pair["fwhm"]
    widths = fwhm if isinstance(fwhm, list | tuple) else [fwhm, fwhm]
    if fwhm is not None and (len(widths) != 2 or not all(
            isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and v > 0
            for v in widths)):
        raise ArgumentError(f"fwhm={fwhm!r} is not a positive number of pixels, nor two of"
                            " them.", "give the PSF's FWHM in pixels, e.g. fwhm=2.5, or"
                            " fwhm=(2.1, 2.6) for the reference and the target.")
    zeropoint = per_pair["zeropoint"]
    if zeropoint is not None and not math.isfinite(zeropoint):
        raise OutcoreError(f"zeropoint={zeropoint} is not a number.", "e.g. zeropoint=27.5.")
    if not isinstance(per_pair["item_id"], str) or not ITEM_ID.match(per_pair["item_id"]):
        raise ArgumentError(f"item_id={per_pair['item_id']!r} is not a plain name.",
                            "use letters, digits, '.', '_' or '-', e.g. item_id='field1'.")
    choice(per_pair["stack"], STACKS, "stack")
    return "aligned" if aligned else "stars" if register else "wcs"


@keywords_checked
def difference(reference: Any = None, target: Any = None, *,
               pairs: str | PathLike[str] | Sequence[Pair] | None = None,
               reference_variance: Any = None, target_variance: Any = None, mask: Any = None,
               reference_psf: Any = None, target_psf: Any = None,
               flux_ratio: float | None = None, zeropoint: float | None = None,
               saturation: float | None = None, aligned: bool = False,
               register: str | None = None, stack: str = "median", item_id: str = "pair",
               fwhm: float | tuple[float, float] | None = None, method: str = "auto",
               kernel_degree: int = 2, kernel_basis: str = "auto",
               tile: int | None = None, background_box: int = 64,
               psf_size: int = 25, star_snr: float | None = None, backend: str = "auto",
               workdir: str | PathLike[str] | None = None,
               client: distributed.Client | None = None, plan: Plan | None = None
               ) -> xr.Dataset:
    """The difference of ``target`` minus ``reference``, lazily, by ZOGY's proper
    subtraction (Zackay, Ofek & Gal-Yam 2016) or a matching kernel fitted to the pair
    (``method``): ``difference`` (``D``, in units of its background sigma),
    ``variance`` (``V_D``) and ``score`` (``S_corr``, NaN in the zone not searched), float32
    ``(y, x)`` on the reference's pixel grid (coordinates in pixels, from 0), one dask chunk
    per tile; ``psf_difference`` (``P_D``); attrs ``wcs`` (the reference's WCS as FITS cards:
    ``astropy.wcs.WCS(ds.attrs["wcs"])``) and ``pairs`` (each pair's facts: flux ratio, PSFs,
    noise, kernels). Nothing of the images is computed until asked; the pairs' models are
    (one survey of each image), before this returns.

    ``reference``, ``target``: ``xarray.DataArray`` images with dims ``y`` and ``x`` (any
    order, numpy- or dask-backed), their WCS in attrs (``attrs["wcs"]``: an astropy WCS or
    header; ``attrs["header"]``; or the cards), or FITS paths. ``reference_variance``,
    ``target_variance`` (per pixel, each on its image's grid), ``mask`` (nonzero = bad, the
    reference's grid): the same kind. ``reference_psf``, ``target_psf``: stamps (arrays or
    ``.npy``/FITS paths; else measured from the stars). ``flux_ratio`` (target over
    reference; else measured), ``zeropoint`` (the reference's, mag), ``saturation`` (the
    level, images' units; else a SATURATE keyword), ``aligned=True`` (no WCS, one grid
    already), ``register='stars'`` (the target registered on the stars of both),
    ``stack`` (how a FITS glob's exposures combine), ``item_id``, ``fwhm`` (the PSF's FWHM
    in pixels, one for both images or two: the PSF of an image without stars; else an
    ``FWHM`` card). Or ``pairs=``: a
    manifest's path, or the pairs of ``read_manifest``; the result then has a ``pair``
    dimension, like ``difference.zarr``.

    ``method``: ``"zogy"`` (the PSFs given or measured), ``"kernel"`` (a kernel fitted to
    the pair's static sources, varying over the image as polynomials of degree
    ``kernel_degree``, of the basis ``kernel_basis``: ``delta``, ``gaussian`` or ``auto``;
    its difference decorrelated), or ``"auto"``, the one that subtracts a sample of the pair
    better (the pair's facts say which and why). ``tile`` (pixels; default: the plan's
    choice for the cluster),
    ``background_box``, ``psf_size``, ``star_snr``: as ``outcore diffim``'s options.
    ``backend``: ``auto``, ``numpy`` or ``cupy``. ``workdir``: where in-memory images are
    written for the workers to read (default: dask's temporary-directory; on workers of
    other machines, a folder they share). ``client``: the cluster (default: the current
    one); ``plan``: a plan of ``plan_pairs`` already checked.
    """
    prepared = _prepare(reference, target, pairs,
                        {"reference_variance": reference_variance,
                         "target_variance": target_variance, "mask": mask},
                        {"reference_psf": reference_psf, "target_psf": target_psf},
                        {"flux_ratio": flux_ratio, "zeropoint": zeropoint,
                         "saturation": saturation, "aligned": aligned, "register": register,
                         "stack": stack, "item_id": item_id, "fwhm": fwhm},
                        options_of(tile=tile, background_box=background_box,
                                   psf_size=psf_size, star_snr=star_snr, method=method,
                                   kernel_degree=kernel_degree, kernel_basis=kernel_basis,
                                   backend=backend),
                        tile, workdir, client, plan, catalog=False)
    images_ = [operator.pair_difference(p, m, prepared.options)
               for p, m in zip(prepared.pairs, prepared.models, strict=True)]
    ds = operator.difference_dataset(prepared.pairs, prepared.models, images_, prepared.attrs)
    return ds.isel(pair=0) if prepared.single else ds


@keywords_checked
def catalog(reference: Any = None, target: Any = None, *,
            pairs: str | PathLike[str] | Sequence[Pair] | None = None,
            reference_variance: Any = None, target_variance: Any = None, mask: Any = None,
            reference_psf: Any = None, target_psf: Any = None,
            flux_ratio: float | None = None, zeropoint: float | None = None,
            saturation: float | None = None, aligned: bool = False,
            register: str | None = None, stack: str = "median", item_id: str = "pair",
            fwhm: float | tuple[float, float] | None = None,
            threshold: float = 5.0, stamp: int = 21, fit_model: str = "psf",
            method: str = "auto", kernel_degree: int = 2, kernel_basis: str = "auto",
            tile: int | None = None, background_box: int = 64,
            psf_size: int = 25, star_snr: float | None = None, backend: str = "auto",
            difference_store: str | PathLike[str] | None = None,
            workdir: str | PathLike[str] | None = None,
            client: distributed.Client | None = None, plan: Plan | None = None) -> Catalog:
    """The transients of ``target`` against ``reference``: every tile subtracted (``method``),
    searched (``|S_corr| >= threshold``, dipoles merged), cut out (``stamp`` pixels a side),
    measured (PSF photometry; dipole fits with ``fit_model``, ``psf`` or ``gaussian``) and
    scored. The tiles run here (the rows are known only after detection); the result is a
    ``Catalog``: ``sources``, one row per source along ``source`` (the columns of
    ``sources.parquet``, with units: positions in pixels from 0, ``ra``/``dec`` in degrees
    through the reference's WCS, fluxes in the reference's units, ``mag``), and ``cutouts``
    in the ``cutouts`` layout that ``outcore.fit.fit_dipoles`` takes; both are dask-backed on
    the tiles' results, which stay on the cluster until you compute them (``.compute()``,
    ``.to_dataframe()``).

    ``difference_store``: the path of a new zarr store that the tiles write ``D``, ``V_D``
    and ``S_corr`` into as they run (the layout of ``difference.zarr``, ``(pair, y, x)``;
    ``xr.open_zarr`` opens it), so that the images are not computed twice. The other
    arguments are ``difference``'s.
    """
    prepared = _prepare(reference, target, pairs,
                        {"reference_variance": reference_variance,
                         "target_variance": target_variance, "mask": mask},
                        {"reference_psf": reference_psf, "target_psf": target_psf},
                        {"flux_ratio": flux_ratio, "zeropoint": zeropoint,
                         "saturation": saturation, "aligned": aligned, "register": register,
                         "stack": stack, "item_id": item_id, "fwhm": fwhm},
                        options_of(threshold=threshold, stamp=stamp, fit_model=fit_model,
                                   tile=tile, background_box=background_box,
                                   psf_size=psf_size, star_snr=star_snr, method=method,
                                   kernel_degree=kernel_degree, kernel_basis=kernel_basis,
                                   backend=backend),
                        tile, workdir, client, plan, catalog=True)
    store = None if difference_store is None else Path(difference_store).expanduser()
    if store is not None:
        refuse_existing(store)
        operator.create_store(store, prepared.pairs, prepared.models, prepared.options,
                              prepared.attrs)
    try:
        return _tiles(prepared, None if store is None else str(store))
    except BaseException:
        if store is not None:
            shutil.rmtree(store, ignore_errors=True)
        raise


def _tiles(prepared: _Prepared, store: str | None) -> Catalog:
    """Run every tile of the prepared pairs (writing their images into ``store``, if any)
    and return the lazy catalog over their results."""
    client, options = prepared.client, prepared.options
    tiles = operator.tile_graph(prepared.pairs, prepared.models, options, store,
                                keep_images=False)
    futures = client.compute([task for _, _, task in tiles])
    if SHOW_PROGRESS.get():
        follow(futures)
    counts = client.gather(client.map(operator.tile_count, futures, pure=False))
    sources = operator.sources(futures, counts, [p.item_id for p in prepared.pairs],
                               prepared.attrs)
    chunk = min(memory.CUTOUT_CHUNK, max(sum(counts), 1))
    return Catalog(sources, operator.cutouts(futures, counts, sources, options.stamp, chunk))
