"""A sketch's run directory: ``components.zarr``, ``scree.png``, ``components.png`` and,
with ``--denoise``, ``denoised.zarr``; and what ``summary.json`` records of the sketch."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import xarray as xr

from outcore.io.store import open_unchecked, save, write_new
from outcore.runs import Run, check_png
from outcore.sketch import png
from outcore.sketch.randomized import reconstruct

#: Singular values recorded in summary.json's metrics (all of them are in components.zarr).
RECORDED = 64


def _reopens(path: Path) -> None:
    xr.open_zarr(path)


def write_components(run: Run, result: xr.Dataset) -> None:
    """``components.zarr`` (``u`` chunked along the items as the sketch's blocks, ``v`` a
    component a chunk), with consolidated metadata, and its two figures."""
    item_chunks = dict(zip(result.attrs["item_dims"], result.attrs["block_items"],
                           strict=True))
    with run.timing("write_components"):
        chunked = result.chunk({**item_chunks, "component": -1})
        chunked["v"] = chunked["v"].chunk({"component": 1})
        write_new(chunked, run.add_output("components.zarr", verify=_reopens))
    with run.timing("figures"):
        a = result.attrs
        png.scree(run.add_output("scree.png", verify=check_png),
                  result["singular_values"].values, result["explained_variance_ratio"].values,
                  f"scree: rank {a['rank']}, oversample {a['oversample']},"
                  f" q {a['power_iterations']}" + (", centred" if a["center"] else ""))
        png.components(run.add_output("components.png", verify=check_png), result["v"].values,
                       result["singular_values"].values)


def write_denoised(run: Run, result: xr.Dataset, ds: xr.Dataset, layout: str | None,
                   backend: str) -> None:
    """``denoised.zarr``: the rank-``k`` stack in the input's layout (without one, the
    input's variables as they are), written block by block."""
    with run.timing("denoise"):
        denoised = reconstruct(result, ds, backend=backend)
        path = run.add_output("denoised.zarr", verify=lambda p: open_unchecked(p))
        if layout is None:
            write_new(denoised, path)
        else:
            save(denoised, path, layout=layout)


def metrics(result: xr.Dataset, stack_bytes: int) -> dict[str, Any]:
    """What ``summary.json`` records of a sketch: the passes over the stack and the reads of
    the store (one when the stack was held in the workers' memory), each pass's seconds
    (``read_seconds``, wall) and, split from them, the seconds the workers' threads spent
    reading and decoding the store (``decode_seconds``) and multiplying (``product_seconds``)
    in each pass (added over the threads), the rate of stack bytes a second over the passes,
    the tasks of a pass, the leading singular values and the share of the sum of squares
    they explain."""
    a = result.attrs
    seconds = float(sum(a["read_seconds"]))
    return {
        "passes": a["passes"],
        "store_reads": a["store_reads"],
        "read_seconds": a["read_seconds"],
        "decode_seconds": a["decode_seconds"],
        "product_seconds": a["product_seconds"],
        "sketch_seconds": round(seconds, 6),
        "read_bytes_per_s": round(a["passes"] * stack_bytes / seconds) if seconds else None,
        "tasks_per_read": a["tasks_per_read"],
        "rank": a["rank"],
        "width": a["width"],
        "singular_values": [float(x) for x in result["singular_values"].values[:RECORDED]],
        "explained_variance_ratio_total": float(result["explained_variance_ratio"].sum()),
        "residual_fraction": a["residual_fraction"],
        "total_sum_of_squares": a["total_sum_of_squares"],
    }
