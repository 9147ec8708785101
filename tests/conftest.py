"""Shared test settings: GPU and MPI tests skip cleanly where the machine has neither, and
real-data tests where ``../shared/real`` (or ``$OUTCORE_REAL_DATA``) is absent."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import dask
import pytest

from outcore import backend, cluster

#: The measured data sets (never committed): the shared folder beside the checkout.
REAL_DATA = Path(os.environ.get("OUTCORE_REAL_DATA",
                                Path(__file__).resolve().parents[2] / "shared" / "real"))
MPIRUN = shutil.which("mpirun", path=str(Path(sys.executable).parent)) or shutil.which("mpirun")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    no_gpu = pytest.mark.skip(reason="needs a CUDA GPU (cupy.cuda.is_available() is False)")
    no_mpi = pytest.mark.skip(reason="needs mpirun and mpi4py (pip install 'outcore[mpi]')")
    no_data = pytest.mark.skip(reason=f"needs the measured data sets at {REAL_DATA} (the shared"
                               " folder beside the checkout, or $OUTCORE_REAL_DATA)")
    for item in items:
        if item.get_closest_marker("realdata") and not REAL_DATA.is_dir():
            item.add_marker(no_data)
        if item.get_closest_marker("gpu") and not backend.gpu_available():
            item.add_marker(no_gpu)
        if item.get_closest_marker("mpi") and MPIRUN is None:
            item.add_marker(no_mpi)


@pytest.fixture(scope="module")
def shared_cluster():
    """``shared_cluster(workers=2, memory_limit=...)``: a client of a local process cluster
    started once per test module for each (workers, memory_limit, other options) and stopped
    when the module ends, for tests that only compute on it. Starting one costs seconds of
    CPU (worker processes importing the stack), so tests that neither kill its workers, nor
    read their peak memory (a lifetime high-water mark), nor need a cluster of their own share
    it. While it runs it is dask's default scheduler in that module (as any client is)."""
    clients: dict[tuple, object] = {}

    def get(workers: int = 2, memory_limit: str | int = "1GiB", **options):
        key = (workers, memory_limit, *sorted(options.items()))
        if key not in clients:
            clients[key] = cluster.start("local", workers=workers, memory_limit=memory_limit,
                                         **options)
        client = clients[key]
        client.wait_for_workers(workers, timeout=60)
        return client

    scheduler = dask.config.get("scheduler", None)
    yield get
    for client in reversed(list(clients.values())):  # each close restores the one before
        cluster.stop(client)
    # later modules must not find the closed clients' "dask.distributed" as their scheduler
    dask.config.set(scheduler=scheduler)


@pytest.fixture(scope="session")
def real_data() -> Path:
    """The folder of the measured data sets (tests using it carry the ``realdata`` mark)."""
    return REAL_DATA


@pytest.fixture(scope="session")
def p25_stores(real_data, tmp_path_factory) -> tuple[Path, Path]:
    """PETRA III P25's CXI file converted with its focus-to-sample distance and
    preprocessed, as docs/real-data.md runs it: ``(diffraction store, preprocessed store)``,
    read-only for the tests that share them."""
    from outcore.cli import main

    folder = tmp_path_factory.mktemp("p25")
    cxi = real_data / "ptycho" / "petra3_p25_nearfield" / "PETRAIII_P25_Near_Field_Ptycho.cxi"
    raw, pre = folder / "p25.zarr", folder / "pre.zarr"
    runs = ["--output-dir", str(folder / "runs"), "--cluster", "threads", "--no-progress"]
    assert main(["convert", str(cxi), str(raw), "--attr", "focus_sample_distance=3.65e-3",
                 "--name", "convert", *runs]) == 0
    assert main(["ptycho", "preprocess", "--input", str(raw), "--output", str(pre),
                 "--object-padding", "4", "--name", "pre", *runs]) == 0
    return raw, pre
