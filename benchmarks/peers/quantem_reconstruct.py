"""Reconstruct a ptychography scan with quantEM, as one process from input file to object.

    benchmarks/peers/.venv-quantem/bin/python benchmarks/peers/quantem_reconstruct.py \
        SCAN.npz OUT.npz --iterations 20 --batch 128 [--mode gd|adam] [--seed 0]

The whole-process peer of ``outcore ptycho reconstruct`` in ``bench_cli.py``: reads the
patterns, positions and probe guess that ``bench_cli.py`` exported from an ``outcore ptycho
preprocess`` store (``amplitudes`` (n, K, K) float32 with zero frequency at K // 2,
``top_left`` (n, 2), ``scan`` (rows, cols), ``step``, ``guess`` (K, K) complex64,
``object_shape``), builds quantEM's ``Ptychography`` the way ``quantem_runner.build`` maps
outcore's scan onto it (see that module's docstring: the same model, checked there against
the true object and probe), runs ``--iterations`` iterations of batches of ``--batch``
positions (``gd``: its analytic gradient with SGD, the nearest to outcore's step; ``adam``:
autograd with Adam), and writes ``OUT.npz``: ``object`` (Ny, Nx) complex64 in outcore's
frame, ``probe`` (K, K) centred, ``loss`` per iteration. Torch keeps its default threads
(all cores), as a user's run would. Prints one JSON line: setup and reconstruction seconds,
torch threads, first and last loss, versions.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from importlib import metadata
from pathlib import Path

import numpy as np
import torch
from quantem_runner import build, optimizer_params


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data", type=Path, help=".npz exported by bench_cli.py")
    parser.add_argument("out", type=Path, help=".npz written with the object and probe")
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--mode", choices=["gd", "adam"], default="gd")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.out.exists():
        raise SystemExit(f"{args.out} exists; give a new output path")
    with np.load(args.data) as npz:
        data = {key: npz[key] for key in npz.files}
    t0 = time.perf_counter()
    ptycho = build(data, args.seed)
    t1 = time.perf_counter()
    ptycho.reconstruct(num_iters=args.iterations, batch_size=args.batch,
                       autograd=args.mode == "adam", optimizer_params=optimizer_params(args.mode))
    t2 = time.perf_counter()
    with torch.no_grad():
        obj = ptycho.obj_model._obj.detach().cpu().numpy()[0]
        probe = np.fft.fftshift(ptycho.probe_model._probe.detach().cpu().numpy()[0])
    losses = np.asarray(ptycho._iter_losses, dtype=np.float64)
    partial = args.out.with_name(args.out.stem + ".partial.npz")
    np.savez(partial, object=obj.astype(np.complex64), probe=probe.astype(np.complex64),
             loss=losses)
    partial.rename(args.out)
    print(json.dumps({"mode": args.mode, "iterations": args.iterations, "batch": args.batch,
                      "setup_s": round(t1 - t0, 4), "reconstruct_s": round(t2 - t1, 4),
                      "torch_threads": torch.get_num_threads(),
                      "loss_first_last": [float(losses[0]), float(losses[-1])],
                      "versions": {"python": platform.python_version(),
                                   **{name: metadata.version(name)
                                      for name in ("quantem", "torch", "numpy")}}}),
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
