"""Benchmark: seconds per ptychography iteration and object error, outcore's engine in each
residency vs quantEM (and any peer with a runner), with matched settings.

Prints one JSON line per tool and case (DESIGN.md, "Benchmark lines"), then one summary line
per comparison. Each *setting* (``--settings``: ``base`` one probe mode, fixed positions;
``modes3`` three probe modes; ``refine`` position refinement from the first iteration on) is
run by every tool with the same batch size (``--batch``, several allowed), and every line
carries ``object_error`` (``outcore.ptycho.reconstruction.quality.object_error`` of the tool's
final object against the truth, after global phase, scale and phase ramp; a benchmark runs few
iterations, so it compares tools, it is no converged error). One simulated stack (a raster
of ``--scan`` x ``--scan`` positions, ``--step`` object pixels apart, ``--k`` x ``--k``
patterns of a smooth complex object seen through a defocused aperture probe, straight from
the far-field model, noise-free) is reconstructed by

- ``outcore``: ``outcore.ptycho.reconstruction.engine.run`` on a local cluster of 1 and 2 worker
  processes (one thread each, ``--workers``; ``--cluster threads``: workers in this process),
  once per residency (``--residency``: ``device`` keeps each
  shard's amplitudes resident, ``host`` keeps them in host memory and copies each sub-batch,
  ``disk`` reads each sub-batch from the zarr store, the next one in a thread), each case on
  a fresh cluster so that its peak worker memory is its own; ``--repeats`` runs each case
  that many times, the residencies alternating, and takes the median over all their
  iterations. The stack lies in a zarr store
  in a temporary folder, uncompressed, ``--chunk`` positions per chunk (64: what
  ``outcore ptycho preprocess`` writes); its pages stay in the page cache unless
  ``--disk-cold`` drops them after every iteration. On the numpy backend ``device`` and
  ``host`` both hold the amplitudes in the worker's memory and cut each sub-batch out with the
  same copy, so their difference here is only that of ``host``'s prefetch thread. With
  ``--backend cupy`` the shards compute on the GPU: ``device`` keeps the amplitudes in GPU
  memory, ``host`` in pinned host memory copied up each sub-batch, ``disk`` reads them and
  copies them up.
  ``--worker-malloc``: each case runs on workers as outcore starts them (``outcore``:
  glibc's mmap and trim thresholds at ``outcore.cluster.WORKER_MMAP_BYTES`` and
  ``WORKER_TRIM_BYTES``), and again with dask's own ``pre-spawn-environ`` (``dask``:
  ``MALLOC_TRIM_THRESHOLD_=65536``, which turns off glibc's adaptive mmap threshold, so
  every temporary over 128 KiB of the kernels is a fresh ``mmap`` with its page faults,
  about doubling the kernels' time);
- ``outcore-kernels``: the same batches, sub-batches and updates as a plain loop
  (``outcore.ptycho.reconstruction.solver.serial``, the engine's numpy twin) in this process, no
  cluster: the compute the engine schedules, so that ``engine 1 worker - kernels`` is the
  engine's own cost (actor calls, transfers, the state after each iteration);
  ``engine_overhead_s_per_step`` spreads it over
  the steps; ``--backend cupy`` runs the engine on the GPU, the loop stays on the host;
- ``quantem``: quantEM's ``Ptychography`` (single slice, far field, pixelated object and probe,
  amplitude L2 loss) on the same patterns, positions, probe guess and batch size, through
  ``benchmarks/peers/quantem_runner.py`` in its own venv (``make_quantem_venv.sh``), with
  ``torch.set_num_threads`` 1 and 2 (``--quantem-threads``), in its analytic-gradient mode
  (``gd``: ePIE-normalised gradient, SGD) and its autograd mode with Adam (``adam``), and
  its multi-process mode (``--quantem-ranks 2``, the default: ``device=[0, 1]``, 2 ranks over
  gloo, one thread each, autograd and Adam only), whose iterations are timed inside rank 0 and
  whose ``fixed_s_per_call`` (process start, rendezvous, state in and out) is reported apart.
  torch's threads are OpenMP's, whose default wait policy spins: with 2 threads on this
  shared machine that costs several times the work, so the 2-thread cases run again with
  ``OMP_WAIT_POLICY=PASSIVE`` (``--quantem-omp``; ``case.omp_wait_policy``). Without the
  venv its line says so (``"value": null``, ``"skipped"``).

Peers (``--tools``): ``quantem`` as above; any other name ``NAME`` is run as
``benchmarks/peers/.venv-NAME/bin/python benchmarks/peers/NAME_runner.py DATA.npz --batch B
--iterations N --threads T [T ...] --probe-modes M [--learn-positions] --seed S
--object-dir DIR`` (the hook for ``ptychi``, whose runner lives with its venv script
``make_ptychi_venv.sh``): DATA.npz holds ``amplitudes`` (n, K, K) float32 centred,
``top_left`` (n, 2), ``guess`` (M, K, K) (the starting modes), ``probe``, ``truth``,
``scan`` and ``step``; the runner prints one JSON line per case in the fields above (its
``case`` a dict, ``value`` the median seconds per iteration, ``walls_s``), and may name in
``object_file`` a ``.npy`` of its final object (Ny, Nx), from which the error is computed
here. Without the venv its line says so (``"value": null``, ``"skipped"``).

Every tool runs ``--iterations`` timed iterations after one warm-up iteration (shard loads,
imports, first-touch allocations), on the same global batches of ``--batch`` positions
(outcore's own permutation; quantEM's shuffle draws other batches of the same size).
``value`` is the median seconds of one iteration (``walls_s``: each of them), ``mean_s``
their mean; ``ms_per_pattern_per_iteration`` divides the median by the positions;
``cpu_s_per_iteration`` is the mean CPU seconds of the tool's processes per iteration
(outcore: its workers and this process, which holds the scheduler; quantEM's ranks: rank 0
only), steadier on this shared machine (``load_avg`` says how shared).
``peak_worker_bytes``: the largest worker's peak resident memory (the kernel's high-water
mark, ``outcore.runner.peak_worker_rss``); quantEM's ``peak_rss_bytes``: its process and the
ranks it spawned, sampled every 20 ms.

The summary lines (``tool: "summary"``) give ``host`` and ``disk`` over ``device`` as a
fraction of an iteration, outcore on one worker against quantEM's fastest one-thread mode,
and outcore on 2 workers against quantEM's fastest case of any kind, each with its goal.
The tools are compared by their mean seconds per iteration (a run's time over its
iterations): with refined positions outcore's iterations do not all cost the same (new
Gauss-Newton matrices every ``curvature_every``-th), and a median would leave those out.

    python benchmarks/bench_ptycho.py                     # 32 x 32 positions of 64 x 64
    python benchmarks/bench_ptycho.py --scan 16 --iterations 3 --quantem-ranks 0  # make bench
    python benchmarks/bench_ptycho.py --scan 64 --chunk 16 --disk-cold
    python benchmarks/bench_ptycho.py --backend cupy --workers 1 --worker-malloc outcore \
        --no-quantem --memory-limit 16GiB               # on a GPU (benchmarks/gpu/run.sh)
    python benchmarks/bench_ptycho.py --settings base modes3 refine --batch 64 256 \
        --quantem-python benchmarks/peers/.venv-quantem/bin/python
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import dask
import numpy as np
import psutil
import zarr
from common import add_backend, check_backend, line, machine

import outcore
from outcore import cluster
from outcore.ptycho.reconstruction import engine, solver
from outcore.ptycho.reconstruction import model as physics
from outcore.ptycho.reconstruction import probe as probes
from outcore.ptycho.reconstruction.model import Model
from outcore.ptycho.reconstruction.quality import illuminated, object_error
from outcore.runner import peak_worker_rss
from outcore.runs import versions

BENCH = "ptycho"
METRIC = "s_per_iteration"
HERE = Path(__file__).resolve().parent
PEERS = HERE / "peers"
QUANTEM_PYTHON = PEERS / ".venv-quantem" / "bin" / "python"
#: Goals of issue #13: host and disk residency over device, as a fraction of an iteration;
#: outcore on one worker against quantEM on one thread (2x), on 2 workers against the best
#: peer of any kind (1.7x).
HOST_GOAL, DISK_GOAL, ONE_CORE_GOAL, TWO_WORKER_GOAL = 0.05, 0.15, 2.0, 1.7
#: This process's environment at start: dask's nannies write their ``pre-spawn-environ``
#: (``MALLOC_TRIM_THRESHOLD_``) into it, and neither later clusters nor the peer should see
#: what an earlier cluster left there.
START_ENVIRON = dict(os.environ)
#: When this run started (local time, to the second): every line of one run carries it.
RUN = time.strftime("%Y-%m-%dT%H:%M:%S")
#: The matched settings: probe modes and position refinement.
SETTINGS = {"base": {"modes": 1, "refine": False}, "modes3": {"modes": 3, "refine": False},
            "refine": {"modes": 1, "refine": True}}


# --- the stack ------------------------------------------------------------------------------


@dataclass
class Scan:
    truth: np.ndarray  # (Ny, Nx) complex64
    probe: np.ndarray  # (K, K) complex64, the true probe
    guess: np.ndarray  # (K, K) complex64, the starting probe (from the mean pattern)
    top_left: np.ndarray  # (n, 2) int64, row-major raster
    amplitudes: np.ndarray  # (n, K, K) float32, zero frequency at K // 2
    scan: int  # positions per side
    step: int  # object pixels between neighbours


def aperture_probe(k: int, radius: float, defocus: float) -> np.ndarray:
    """A circular aperture of ``radius`` detector pixels with a quadratic (defocus) phase, as
    the real-space (K, K) probe, peak 1."""
    ky, kx = np.mgrid[:k, :k] - k // 2
    pupil = (ky**2 + kx**2 < radius**2) * np.exp(1j * defocus * (ky**2 + kx**2))
    probe = np.fft.fftshift(np.fft.ifft2(np.fft.ifftshift(pupil)))
    return (probe / np.abs(probe).max()).astype(np.complex64)


def simulate(scan: int, k: int, step: int, block: int = 256) -> Scan:
    """A raster of ``scan x scan`` positions over a smooth amplitude/phase object, patterns
    from the far-field model (``reconstruct.model.intensities``), noise-free; the probe guess
    keeps the mean pattern's amplitude with a defocus phase, as a starting probe is made from
    data."""
    size = (scan - 1) * step + k
    yy, xx = np.mgrid[:size, :size]
    truth = ((0.7 + 0.3 * np.cos(xx / 5.0) * np.sin(yy / 7.0))
             * np.exp(0.8j * np.sin(xx / 9.0 + yy / 13.0))).astype(np.complex64)
    probe = aperture_probe(k, k / 4, 0.02 * np.pi)
    rows, cols = np.meshgrid(np.arange(scan) * step, np.arange(scan) * step, indexing="ij")
    top_left = np.stack([rows.ravel(), cols.ravel()], axis=1).astype(np.int64)
    amplitudes = np.empty((len(top_left), k, k), np.float32)
    for lo in range(0, len(top_left), block):  # bounded scratch for big scans
        amplitudes[lo:lo + block] = np.sqrt(physics.intensities(truth, probe,
                                                                top_left[lo:lo + block]))
    ky, kx = np.mgrid[:k, :k] - k // 2
    pupil = np.sqrt((amplitudes.astype(np.float64)**2).mean(axis=0)) \
        * np.exp(0.02j * np.pi * (ky**2 + kx**2))
    guess = np.fft.fftshift(np.fft.ifft2(np.fft.ifftshift(pupil), norm="ortho"))
    return Scan(truth, probe, guess.astype(np.complex64), top_left, amplitudes, scan, step)


def write_store(scan: Scan, path: Path, chunk: int, compression: str) -> Path:
    """The amplitudes as the zarr v3 array ``amplitudes`` of the group ``path``."""
    from zarr.codecs import BloscCodec

    compressors = None if compression == "none" else \
        (BloscCodec(cname="zstd", clevel=1, shuffle="bitshuffle"),)
    group = zarr.open_group(path, mode="w-", zarr_format=3)
    array = group.create_array("amplitudes", shape=scan.amplitudes.shape,
                               chunks=(chunk, *scan.amplitudes.shape[1:]), dtype="float32",
                               compressors=compressors)
    array[:] = scan.amplitudes
    return path


def drop_page_cache(path: Path) -> None:
    """Ask the kernel to forget the cached pages of every file under ``path``."""
    for file in path.rglob("*"):
        if file.is_file():
            fd = os.open(file, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


# --- outcore ---------------------------------------------------------------------------------


def settings_of(args: argparse.Namespace, residency: str, setting: str, batch: int
                ) -> engine.Settings:
    # the probe (and, refined, the positions) are updated from the first iteration on, so
    # that every iteration costs the same
    chosen = SETTINGS[setting]
    return engine.Settings(iterations=1 + args.iterations, batch_size=batch,
                           residency=residency, sub_batch=args.sub_batch, probe_start=0,
                           seed=args.seed, probe_modes=chosen["modes"],
                           refine_positions=chosen["refine"], refine_from=0,
                           position_bound=float(args.step))


def start_probe(scan: Scan, setting: str) -> np.ndarray:
    """The starting probe modes (M, K, K) of a setting (the same for every tool)."""
    return probes.initial_modes(scan.guess, SETTINGS[setting]["modes"])


def error_of(scan: Scan, obj: np.ndarray) -> float:
    """The object's error against the truth on the well-lit pixels."""
    obj = np.asarray(obj).reshape(scan.truth.shape)
    return round(object_error(obj, scan.truth, illuminated(scan.probe, scan.top_left,
                                                           scan.truth.shape)), 6)


def cpu_seconds(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        times = psutil.Process(pid).cpu_times()
        total += times.user + times.system
    return total


def steps_per_iteration(n: int, batch: int | None) -> int:
    return 1 if batch is None else -(-n // batch)


def case_of(args: argparse.Namespace, n: int, setting: str, batch: int, **more) -> dict:
    return {"n": n, "k": args.k, "scan": args.scan, "step": args.step, "batch": batch,
            "settings": setting, "probe_modes": SETTINGS[setting]["modes"],
            "refine_positions": SETTINGS[setting]["refine"], **more}


def emit(tool: str, case: dict, walls: list[float], n: int, cpu: list[float] | None = None,
         **extra) -> dict:
    """One s-per-iteration line; ``cpu`` holds the CPU seconds of each timed iteration."""
    median = statistics.median(walls)
    more: dict = {"mean_s": round(statistics.fmean(walls), 6),
                  "ms_per_pattern_per_iteration": round(1e3 * median / n, 5)}
    if cpu:  # the mean: psutil counts CPU time in 10 ms ticks, too coarse for a median
        more["cpu_s_per_iteration"] = round(statistics.fmean(cpu), 5)
        more["cpu_ms_per_pattern_per_iteration"] = round(1e3 * statistics.fmean(cpu) / n, 5)
    return line(BENCH, tool, case, METRIC, median, walls, **more, **extra,
                walls_s=[round(w, 4) for w in walls],
                load_avg=[round(x, 2) for x in os.getloadavg()], run=RUN)


@contextmanager
def worker_malloc(variant: str) -> Iterator[None]:
    """The workers' glibc settings: ``outcore``, as ``outcore.cluster`` starts them;
    ``dask``, dask's ``pre-spawn-environ`` as it is (outcore's setting switched off)."""
    os.environ.clear()
    os.environ.update(START_ENVIRON)
    original = cluster.workers.worker_environ
    if variant == "dask":
        cluster.workers.worker_environ = lambda: dict(
            dask.config.get("distributed.nanny.pre-spawn-environ"))
    try:
        yield
    finally:
        cluster.workers.worker_environ = original
        os.environ.clear()
        os.environ.update(START_ENVIRON)


@dataclass
class OutcoreRun:
    case: dict
    walls: list[float]
    cpu: list[float]
    extra: dict


def bench_outcore(args: argparse.Namespace, scan: Scan, store: Path, workers: int,
                  residency: str, malloc: str, setting: str, batch: int) -> OutcoreRun:
    """One engine run on a fresh cluster: its case, the wall and CPU seconds of each timed
    iteration, and the rest of its line."""
    n = len(scan.top_left)
    settings = settings_of(args, residency, setting, batch)
    with (worker_malloc(malloc),
          cluster.connect(args.cluster, workers=workers, memory_limit=args.memory_limit)
          as client):
        pids = list(dict.fromkeys([os.getpid(), *client.run(os.getpid).values()]))  # threads: one
        marks: list[tuple[float, float, float]] = []  # (reached, callback done, CPU seconds)
        losses: list[float] = []
        cold = args.disk_cold and residency == "disk"

        def on_iteration(iteration: int, loss: float, state: engine.State) -> None:
            reached = time.perf_counter()
            cpu = cpu_seconds(pids)
            losses.append(loss)
            if cold:
                drop_page_cache(store)
            marks.append((reached, time.perf_counter(), cpu))

        if cold:
            drop_page_cache(store)
        start = time.perf_counter()
        result = engine.run(client, store, scan.top_left,
                            np.ones(scan.truth.shape, np.complex64), start_probe(scan, setting),
                            settings, chunk=args.chunk, on_iteration=on_iteration,
                            backend=args.backend)
        peaks = peak_worker_rss(client)
    # iteration i runs from the end of callback i - 1 to callback i; the first is the warm-up
    walls = [marks[i][0] - marks[i - 1][1] for i in range(1, len(marks))]
    cpu = [marks[i][2] - marks[i - 1][2] for i in range(1, len(marks))]
    case = case_of(args, n, setting, batch, sub_batch=args.sub_batch, workers=workers,
                   cluster=args.cluster, residency=residency, chunk=args.chunk,
                   compression=args.compression, disk_cold=cold, worker_malloc=malloc,
                   backend=args.backend)
    return OutcoreRun(case, walls, cpu, {
        "warmup_s": round(marks[0][0] - start, 4),
        "steps_per_iteration": steps_per_iteration(n, batch),
        "peak_worker_bytes": max(peaks.values()), "loss_first_last": [losses[0], losses[-1]],
        "object_error": error_of(scan, result.obj)})


def emit_outcore(runs: list[OutcoreRun], n: int) -> dict:
    """One line of the ``--repeats`` runs of a case: the median and mean over every timed
    iteration of all of them; the peak memory is the largest, the rest the last run's."""
    extra = {**runs[-1].extra, "peak_worker_bytes": max(r.extra["peak_worker_bytes"]
                                                        for r in runs), "repeats": len(runs)}
    return emit("outcore", runs[0].case, [w for r in runs for w in r.walls], n,
                [c for r in runs for c in r.cpu], **extra)


def bench_kernels(args: argparse.Namespace, scan: Scan, setting: str, batch: int) -> dict:
    """The engine's batches, sub-batches and updates as a plain loop in this process
    (``solver.serial``, the engine's numpy twin)."""
    n = len(scan.top_left)
    settings = settings_of(args, "device", setting, batch)
    marks: list[tuple[float, float]] = []
    losses: list[float] = []

    def on_iteration(iteration: int, loss: float, state: solver.State) -> None:
        marks.append((time.perf_counter(), time.process_time()))
        losses.append(loss)

    start = (time.perf_counter(), time.process_time())
    state = solver.State(np.ones((1, *scan.truth.shape), np.complex64),
                         start_probe(scan, setting), scan.top_left.astype(np.float64))
    state, _ = solver.serial(lambda p: scan.amplitudes[p], state, settings, Model(),
                             on_iteration=on_iteration)
    marks.insert(0, start)
    walls = [b[0] - a[0] for a, b in zip(marks[1:-1], marks[2:], strict=True)]
    cpu = [b[1] - a[1] for a, b in zip(marks[1:-1], marks[2:], strict=True)]
    return emit("outcore-kernels", case_of(args, n, setting, batch, sub_batch=args.sub_batch,
                                           workers=0, residency="in-process"),
                walls, n, cpu, warmup_s=round(marks[1][0] - marks[0][0], 4),
                steps_per_iteration=steps_per_iteration(n, batch),
                loss_first_last=[losses[0], losses[-1]],
                object_error=error_of(scan, state.obj))


# --- peers -----------------------------------------------------------------------------------


def peer_python(args: argparse.Namespace, tool: str) -> Path:
    """The peer's interpreter: ``--quantem-python`` for quantEM, else its venv's."""
    if tool == "quantem":
        return Path(args.quantem_python)
    return PEERS / f".venv-{tool}" / "bin" / "python"


def peer_skipped(args: argparse.Namespace, tool: str, n: int, setting: str, batch: int,
                 why: str) -> dict:
    record = {"bench": BENCH, "tool": tool,
              "case": case_of(args, n, setting, batch, threads=args.quantem_threads),
              "metric": METRIC, "value": None, "skipped": why, "run": RUN, "machine": machine(),
              "versions": {"outcore": outcore.__version__, **versions()}}
    print(json.dumps(record), flush=True)
    return record


def peer_commands(args: argparse.Namespace, tool: str, data: Path, objects: Path,
                  setting: str, batch: int) -> list[tuple[list[str], dict]]:
    """The runner's command lines and environments: for quantEM one per OpenMP wait policy
    (its gd/adam modes and ranks, see the module doc), for other peers one."""
    chosen = SETTINGS[setting]
    common = ["--batch", str(batch), "--iterations", str(args.iterations), "--seed",
              str(args.seed), "--probe-modes", str(chosen["modes"]), "--object-dir",
              str(objects)] + (["--learn-positions"] if chosen["refine"] else [])
    runner = str(PEERS / f"{tool}_runner.py")
    if tool != "quantem":  # torch's OpenMP threads wait passively (see quantEM's below)
        return [([runner, str(data), "--threads", *map(str, args.quantem_threads), *common],
                 {**START_ENVIRON, "OMP_WAIT_POLICY": "PASSIVE"})]
    # quantEM's analytic-gradient mode takes neither probe modes nor positions
    modes = [m for m in args.quantem_modes if m == "adam" or setting == "base"] or ["adam"]
    commands = []
    for number, policy in enumerate(args.quantem_omp):
        # OpenMP's wait policy only matters with more than one thread: a second policy runs
        # only those cases again; the ranks run with the first
        threads = args.quantem_threads if number == 0 else \
            [t for t in args.quantem_threads if t > 1]
        if not threads:
            continue
        ranks = args.quantem_ranks if number == 0 else 0
        env = dict(START_ENVIRON)
        if policy == "passive":
            env["OMP_WAIT_POLICY"] = "PASSIVE"
        commands.append(([runner, str(data), "--threads", *map(str, threads), "--modes",
                          *modes, "--ranks", str(ranks), *common], env))
    return commands


def bench_peer(args: argparse.Namespace, tool: str, scan: Scan, work: Path, setting: str,
               batch: int) -> list[dict]:
    """The peer's lines for one setting and batch size (see the module doc)."""
    n = len(scan.top_left)
    python = peer_python(args, tool)
    if not python.exists():
        return [peer_skipped(args, tool, n, setting, batch,
                             f"no {tool} environment at {python}: run "
                             f"benchmarks/peers/make_{tool}_venv.sh")]
    data = work / f"{tool}-{setting}-{batch}.npz"
    objects = work / f"{tool}-{setting}-{batch}-objects"
    objects.mkdir()
    np.savez(data, amplitudes=scan.amplitudes, top_left=scan.top_left,
             guess=start_probe(scan, setting), probe=scan.probe, truth=scan.truth,
             scan=np.array([scan.scan, scan.scan]), step=np.array(scan.step))
    records = []
    for command, env in peer_commands(args, tool, data, objects, setting, batch):
        try:
            done = subprocess.run([str(python), *command], capture_output=True, text=True,
                                  env=env, timeout=args.quantem_timeout)
        except subprocess.TimeoutExpired:
            records.append(peer_skipped(args, tool, n, setting, batch,
                                        f"timed out after {args.quantem_timeout} s"))
            continue
        for text in done.stdout.splitlines():
            if text.startswith("{"):
                record = json.loads(text)
                record["case"] = {**case_of(args, n, setting, batch), **record["case"]}
                if record.get("object_file"):
                    record["object_error"] = error_of(scan, np.load(record.pop("object_file")))
                record["machine"] = machine()
                record["load_avg"] = [round(x, 2) for x in os.getloadavg()]
                record["run"] = RUN
                print(json.dumps(record), flush=True)
                records.append(record)
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
            why = "killed (out of memory?)" if done.returncode < 0 else f"exit {done.returncode}"
            records.append(peer_skipped(args, tool, n, setting, batch,
                                        f"{tool}_runner {why}: {' | '.join(tail)}"))
    return records


# --- summary ---------------------------------------------------------------------------------


def summary(name: str, case: dict, value: float | None, goal: str, met: bool | None,
            **extra) -> None:
    record = {"bench": BENCH, "tool": "summary", "case": {"comparison": name, **case},
              "metric": name, "value": None if value is None else round(value, 4),
              "goal": goal, "met": met, **extra, "run": RUN, "machine": machine(),
              "versions": {"outcore": outcore.__version__, **versions()}}
    print(json.dumps(record), flush=True)


def mean_s(line_: dict) -> float:
    """A line's mean seconds per iteration (a peer runner's line has only ``walls_s``)."""
    return line_.get("mean_s") or statistics.fmean(line_["walls_s"])


def summarise(outcore_lines: dict, kernels_lines: dict, peers: list[dict], n: int) -> None:
    """``outcore_lines`` by (setting, batch, worker malloc, workers, residency),
    ``kernels_lines`` by (setting, batch); ``peers``: every peer's lines."""
    for setting, batch in dict.fromkeys((s, b) for s, b, _, _, _ in outcore_lines):
        timed = [r for r in peers if r.get("value") is not None
                 and r["case"].get("settings") == setting and r["case"].get("batch") == batch]
        single = [r for r in timed if r["case"].get("threads") == 1
                  and r["case"].get("ranks", 1) == 1]
        n_steps = steps_per_iteration(n, batch)
        kernels_line = kernels_lines.get((setting, batch))
        where = {"settings": setting, "batch": batch}
        for malloc in dict.fromkeys(m for s, b, m, _, _ in outcore_lines
                                    if (s, b) == (setting, batch)):
            lines = {(w, r): v for (s, b, m, w, r), v in outcore_lines.items()
                     if (s, b, m) == (setting, batch, malloc)}
            case = {**where, "worker_malloc": malloc}
            for workers in sorted({w for w, _ in lines}):
                device = lines.get((workers, "device"))
                for residency, goal in (("host", HOST_GOAL), ("disk", DISK_GOAL)):
                    other = lines.get((workers, residency))
                    if device is None or other is None:
                        continue
                    frac = other["value"] / device["value"] - 1
                    cpu_frac = other["cpu_s_per_iteration"] / device["cpu_s_per_iteration"] - 1
                    summary(f"{residency}_over_device", {**case, "workers": workers}, frac,
                            f"< {goal:.0%} of an iteration", frac < goal,
                            cpu_fraction=round(cpu_frac, 4),
                            s_per_iteration={residency: other["value"],
                                             "device": device["value"]})
            one = lines.get((1, "device"))
            if one is not None and kernels_line is not None:
                overhead = one["value"] - kernels_line["value"]
                summary("engine_overhead_s_per_step", {**case, "workers": 1}, overhead / n_steps,
                        "informational", None, engine_s_per_iteration=one["value"],
                        kernels_s_per_iteration=kernels_line["value"],
                        overhead_fraction=round(overhead / one["value"], 4),
                        cpu_overhead_s_per_step=round(
                            (one["cpu_s_per_iteration"] - kernels_line["cpu_s_per_iteration"])
                            / n_steps, 5))
            for tool in dict.fromkeys(r["tool"] for r in single):
                best = min((r for r in single if r["tool"] == tool), key=mean_s)
                if one is None:
                    continue
                goal = ONE_CORE_GOAL if tool == "quantem" else 1.0
                ratio = mean_s(best) / mean_s(one)
                summary(f"{tool}_1thread_over_outcore_1worker", case, ratio, f">= {goal}",
                        ratio >= goal, peer_case=best["case"], peer_s=round(mean_s(best), 4),
                        outcore_s=round(mean_s(one), 4),
                        median_ratio=round(best["value"] / one["value"], 4),
                        peer_object_error=best.get("object_error"),
                        outcore_object_error=one.get("object_error"))
            two = lines.get((2, "device"))
            if two is not None and timed:
                best = min(timed, key=mean_s)
                ratio = mean_s(best) / mean_s(two)
                summary("best_peer_over_outcore_2workers", case, ratio, f">= {TWO_WORKER_GOAL}",
                        ratio >= TWO_WORKER_GOAL, peer=best["tool"], peer_case=best["case"],
                        peer_s=round(mean_s(best), 4), outcore_s=round(mean_s(two), 4),
                        median_ratio=round(best["value"] / two["value"], 4),
                        peer_fixed_s_per_call=best.get("fixed_s_per_call"),
                        peer_object_error=best.get("object_error"),
                        outcore_object_error=two.get("object_error"))


# --- main -------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scan", type=int, default=32, help="positions per side of the raster")
    parser.add_argument("--k", type=int, default=64, help="detector pixels per side")
    parser.add_argument("--step", type=int, default=8, help="object pixels between positions")
    parser.add_argument("--batch", type=int, nargs="+", default=[128],
                        help="positions per update (global), one case each")
    parser.add_argument("--settings", nargs="+", default=["base"], choices=sorted(SETTINGS),
                        help="matched settings: base, modes3 (3 probe modes), refine "
                             "(position refinement)")
    parser.add_argument("--tools", nargs="+", default=["outcore", "quantem", "ptychi"],
                        help="outcore and the peers to time (a peer NAME needs "
                             "benchmarks/peers/NAME_runner.py and its venv, see the doc)")
    parser.add_argument("--sub-batch", type=int, default=64,
                        help="positions an outcore shard computes at once")
    parser.add_argument("--iterations", type=int, default=10,
                        help="timed iterations (after one warm-up)")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeats", type=int, default=1,
                        help="engine runs of each outcore case, the residencies alternating "
                             "(forwards, then backwards); a line's median is over the timed "
                             "iterations of all its runs")
    parser.add_argument("--residency", nargs="+", default=list(engine.RESIDENCIES),
                        choices=engine.RESIDENCIES,
                        help="residencies of the base setting (the others run on device)")
    parser.add_argument("--cluster", choices=["local", "threads"], default="local",
                        help="outcore's workers: processes (local) or threads of this "
                             "process (threads, in-process workers)")
    parser.add_argument("--memory-limit", default="2GiB", help="memory_limit of each worker")
    parser.add_argument("--worker-malloc", nargs="+", choices=["outcore", "dask"],
                        default=["outcore"],
                        help="workers' glibc settings: outcore's (trim and mmap thresholds "
                             "of 4 and 8 MiB) and/or dask's own (trim threshold 64 KiB)")
    parser.add_argument("--chunk", type=int, default=64, help="positions per zarr chunk")
    parser.add_argument("--compression", choices=["none", "zstd"], default="none")
    parser.add_argument("--disk-cold", action="store_true",
                        help="drop the store's cached pages after every iteration (disk)")
    parser.add_argument("--kernels", action=argparse.BooleanOptionalAction, default=True,
                        help="time the kernels in a plain loop too (the engine's floor)")
    parser.add_argument("--quantem-python", default=str(QUANTEM_PYTHON))
    parser.add_argument("--quantem-threads", type=int, nargs="+", default=[1, 2],
                        help="threads of each peer's cases")
    parser.add_argument("--quantem-modes", nargs="+", default=["gd", "adam"],
                        choices=["gd", "adam"])
    parser.add_argument("--quantem-ranks", type=int, default=2,
                        help="also time quantEM's multi-process mode with this many ranks "
                             "(0: not; each call costs 10-20 s of process start-up here)")
    parser.add_argument("--quantem-omp", nargs="+", choices=["default", "passive"],
                        default=["default", "passive"],
                        help="OpenMP wait policies of quantEM's runs: the first for every "
                             "case, a second for the cases with more than one thread again "
                             "(passive: OMP_WAIT_POLICY=PASSIVE)")
    parser.add_argument("--quantem-timeout", type=float, default=1800.0,
                        help="seconds a peer's call may take")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed of outcore's batch permutations and quantEM's rng")
    add_backend(parser, "where outcore's engine and kernels compute (quantEM: on the CPU)")
    args = parser.parse_args()
    check_backend(parser, args.backend)

    scan = simulate(args.scan, args.k, args.step)
    n = len(scan.top_left)
    batches = sorted({min(b, n) for b in args.batch})  # a small scan: one batch of all
    outcore_lines: dict = {}
    kernels_lines: dict = {}
    peers: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="bench-ptycho-") as tmp:
        work = Path(tmp)
        store = write_store(scan, work / "scan.zarr", args.chunk, args.compression)
        for setting in args.settings:
            for batch in batches:
                if "outcore" in args.tools:
                    if args.kernels:
                        kernels_lines[setting, batch] = bench_kernels(args, scan, setting, batch)
                    residencies = args.residency if setting == "base" else ["device"]
                    for malloc in args.worker_malloc:
                        for workers in args.workers:
                            runs: dict[str, list[OutcoreRun]] = {r: [] for r in residencies}
                            for repeat in range(args.repeats):  # forwards, then backwards
                                for residency in (residencies if repeat % 2 == 0
                                                  else residencies[::-1]):
                                    runs[residency].append(bench_outcore(
                                        args, scan, store, workers, residency, malloc,
                                        setting, batch))
                            for residency, found in runs.items():
                                outcore_lines[setting, batch, malloc, workers, residency] = \
                                    emit_outcore(found, n)
                for tool in args.tools:
                    if tool != "outcore":
                        peers += bench_peer(args, tool, scan, work, setting, batch)
    summarise(outcore_lines, kernels_lines, peers, n)


if __name__ == "__main__":
    main()
