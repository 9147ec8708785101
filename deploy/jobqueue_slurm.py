"""An adaptive outcore cluster on Slurm with dask-jobqueue: one GPU job per Dask worker.

Run it where ``sbatch`` works (a login node, or a small long-running job), in the
environment that has outcore, with dask-jobqueue installed (``pip install dask-jobqueue``;
it is not a dependency of outcore)::

    python deploy/jobqueue_slurm.py --queue gpu --account myproj --maximum 8 \\
        -- fit-dipoles --input catalog.zarr --chunk-size 4096

This process runs the Dask scheduler. dask-jobqueue submits one Slurm job per worker, each
asking for one GPU (Slurm then makes only that GPU visible to the worker), ``--cores`` CPUs
and ``--memory`` of host memory, for ``--walltime``. The cluster scales between
``--minimum`` and ``--maximum`` workers with the load (``cluster.adapt``). Once ``--minimum``
workers have joined, the outcore command after ``--`` runs against the scheduler's address,
exactly as ``outcore COMMAND ... --cluster tcp://HOST:PORT`` would from another shell; the run
directory's summary.json records the workers that were there when it started. When the
command ends, the worker jobs are cancelled and this script exits with its exit code.

From Python, the same cluster is joined with::

    import outcore.cluster
    client = outcore.cluster.start(cluster.scheduler_address)   # a distributed.Client

Assumptions: the worker jobs run the same Python (``--python``, default this one) from a
filesystem that the compute nodes see; the nodes can reach this host on ``--interface``;
every worker has the same memory limit (outcore plans for the smallest worker, so workers that
join later keep the plan valid). ``--memory-limit``, ``--workers`` and ``--interface`` cannot be
given to the outcore command here: the workers' jobs set them. The workers are plain Dask
workers (no dask-cuda device-memory spilling). Use ``--dry-run`` to print one worker's job
script without submitting anything.
"""

from __future__ import annotations

import argparse
import sys


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    argv = list(sys.argv[1:] if argv is None else argv)
    command: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, command = argv[:cut], argv[cut + 1:]
    p = argparse.ArgumentParser(
        prog="jobqueue_slurm.py",
        description="Run an outcore command on an adaptive dask-jobqueue SLURMCluster.",
        epilog="Everything after -- is the outcore command and its arguments.",
    )
    p.add_argument("--queue", default=None, help="Slurm partition (#SBATCH -p)")
    p.add_argument("--account", default=None, help="Slurm account (#SBATCH -A)")
    p.add_argument("--gpus-per-worker", type=int, default=1, help="GPUs each worker job asks for")
    p.add_argument("--cores", type=int, default=8, help="CPUs per worker job")
    p.add_argument("--threads-per-worker", type=int, default=1,
                   help="Dask threads in each worker (tasks it runs at once)")
    p.add_argument("--memory", default="64GiB", help="host memory per worker job and worker")
    p.add_argument("--walltime", default="02:00:00", help="time limit of each worker job")
    p.add_argument("--interface", default=None, help="network interface (ib0, eth0, ...)")
    p.add_argument("--local-directory", default=None,
                   help="node-local scratch where workers spill, e.g. '$TMPDIR'")
    p.add_argument("--log-directory", default="dask-worker-logs", help="worker jobs' logs")
    p.add_argument("--job-directive", action="append", default=[], metavar="OPTION",
                   help="another #SBATCH option for worker jobs, e.g. --constraint=a100")
    p.add_argument("--prologue", action="append", default=[], metavar="LINE",
                   help="a shell line run before each worker, e.g. 'module load cuda'")
    p.add_argument("--python", default=sys.executable, help="Python that runs the workers")
    p.add_argument("--minimum", type=int, default=1, help="fewest workers (adaptive)")
    p.add_argument("--maximum", type=int, default=4, help="most workers (adaptive)")
    p.add_argument("--wait", type=float, default=600.0,
                   help="seconds to wait for --minimum workers before giving up")
    p.add_argument("--dashboard-address", default="127.0.0.1:8787",
                   help="the scheduler's dashboard (loopback: reach it with ssh -L)")
    p.add_argument("--dry-run", action="store_true",
                   help="print a worker's job script and the outcore command; submit nothing")
    args = p.parse_args(argv)
    if not command and not args.dry_run:
        p.error("give the outcore command after --, e.g. -- demo --no-progress")
    if args.minimum < 1 or args.maximum < args.minimum:
        p.error("need 1 <= --minimum <= --maximum: outcore plans for the workers it finds")
    return args, command


def main(argv: list[str] | None = None) -> int:
    args, command = parse_args(argv)
    try:
        from dask_jobqueue import SLURMCluster
    except ImportError:
        print("jobqueue_slurm.py: dask-jobqueue is not installed; it is not a dependency of"
              " outcore. Fix: pip install dask-jobqueue (in the environment that runs outcore).",
              file=sys.stderr)
        return 2

    gpu_directives = [f"--gpus={args.gpus_per_worker}"] if args.gpus_per_worker else []
    cluster = SLURMCluster(
        queue=args.queue,
        account=args.account,
        cores=args.threads_per_worker,      # Dask threads per worker ...
        job_cpu=args.cores,                 # ... and the CPUs the job asks Slurm for
        processes=1,                        # one worker per job, so one worker per GPU
        memory=args.memory,
        walltime=args.walltime,
        interface=args.interface,
        local_directory=args.local_directory,
        log_directory=args.log_directory,
        python=args.python,
        job_extra_directives=[*gpu_directives, *args.job_directive],
        job_script_prologue=args.prologue,
        worker_extra_args=["--resources", f"GPU={args.gpus_per_worker}"],
        scheduler_options={"dashboard_address": args.dashboard_address},
    )
    try:
        outcore_argv = [*command, "--cluster", cluster.scheduler_address]
        if args.dry_run:
            print(cluster.job_script())
            print("outcore", " ".join(outcore_argv))
            return 0
        print(f"scheduler {cluster.scheduler_address}, dashboard {cluster.dashboard_link}",
              flush=True)
        cluster.adapt(minimum=args.minimum, maximum=args.maximum)
        from distributed import Client

        with Client(cluster) as client:
            print(f"waiting up to {args.wait:.0f} s for {args.minimum} worker job(s) ...",
                  flush=True)
            try:
                client.wait_for_workers(args.minimum, timeout=args.wait)
            except TimeoutError:
                print(f"jobqueue_slurm.py: fewer than {args.minimum} worker(s) joined within"
                      f" {args.wait:.0f} s. Fix: check the worker jobs (squeue --me, the logs"
                      f" in {args.log_directory}/), or raise --wait.", file=sys.stderr)
                return 1

        from outcore.cli import main as outcore_main

        return int(outcore_main(outcore_argv) or 0)
    finally:
        cluster.close()


if __name__ == "__main__":
    sys.exit(main())
