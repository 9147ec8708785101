#!/bin/bash
# outcore under PBS Pro / OpenPBS / Torque with dask-mpi: one MPI job whose rank 0 runs the Dask
# scheduler, rank 1 runs the outcore command, and every other rank is one Dask worker pinned to
# one GPU of its node (outcore pins it by its rank among the worker ranks of that node).
#
#   qsub deploy/pbs-dask-mpi.sh
#   qsub -v OUTCORE_COMMAND=fit-dipoles,OUTCORE_ARGS="--input cat.zarr --chunk-size 512" deploy/pbs-dask-mpi.sh
#
# Assumptions (change the #PBS lines and the knobs below to match your site):
# - outcore is installed with the `mpi` (and `gpu`) extras in the virtual environment
#   $OUTCORE_VENV on a filesystem every node sees. Set OUTCORE_VENV= (empty) to use the
#   `outcore` already on PATH (a module, conda, a container: OUTCORE_EXE="apptainer exec --nv
#   outcore.sif outcore").
# - The launcher is the `mpiexec` on PATH when the job starts (the site's, e.g. from
#   `module load`), else the venv's (MPICH Hydra from the `mpich` wheel); OUTCORE_MPIEXEC
#   names another. It must start the MPI that mpi4py in the venv uses. It is given
#   `-n RANKS -hostfile $PBS_NODEFILE` (Hydra, Intel MPI and Open MPI read that; Cray PALS
#   wants --hostfile: set OUTCORE_MPIEXEC_ARGS). Hydra reaches the other nodes over ssh, so
#   passwordless ssh between the job's nodes is assumed.
# - Ranks = workers + 2 = the lines of the node file (OUTCORE_NRANKS overrides). The select
#   below gives the first node 6 MPI ranks (scheduler, client, 4 workers) and the second 4
#   (4 workers), in that order, so each worker has a GPU of its own. Torque has no such
#   chunks: ask for nodes=2:ppn=6:gpus=4 and set OUTCORE_GPUS_PER_NODE=4, and the script
#   writes its own host file (GPUS+2 ranks on the first node, GPUS on the others).
# - Every rank sees all GPUs of its node: outcore gives each worker rank one of them through
#   CUDA_VISIBLE_DEVICES.
# - The scheduler and workers reach each other over $OUTCORE_INTERFACE (ib0 here: use the name
#   `ip addr` shows on your nodes, or empty for Dask's default).
# - Each worker gets OUTCORE_MEMORY_LIMIT of host memory (4 x 32 GiB per node here).
# - The run directory $OUTCORE_OUTPUT_DIR/$OUTCORE_NAME is on a shared filesystem and does not
#   exist yet (outcore never overwrites one). Its summary.json says where each worker ran.
#
# On failure every rank exits non-zero: outcore shares rank 1's exit code with all ranks and
# aborts the MPI job if the workers have not stopped 30 s after the command ended. The script
# exits with mpiexec's exit code.
#PBS -N outcore
#PBS -l select=1:ncpus=6:mpiprocs=6:ngpus=4+1:ncpus=4:mpiprocs=4:ngpus=4
#PBS -l place=scatter
#PBS -l walltime=02:00:00
#PBS -j oe
##PBS -l nodes=2:ppn=6:gpus=4        (Torque: use this instead, with OUTCORE_GPUS_PER_NODE=4)
set -euo pipefail

: "${PBS_JOBID:?not inside a PBS job: submit this script with qsub}"
: "${PBS_NODEFILE:?PBS_NODEFILE is not set: the job has no node file}"
cd "${PBS_O_WORKDIR:-$PWD}"

# ---- knobs: every site-specific value, overridable from the environment (qsub -v VAR=...) ---
# An empty value omits the option.
OUTCORE_VENV=${OUTCORE_VENV-$HOME/outcore/.venv}        # venv to activate; empty: use PATH
OUTCORE_EXE=${OUTCORE_EXE:-outcore}                      # what each rank runs (word-split)
OUTCORE_COMMAND=${OUTCORE_COMMAND:-demo}                 # the outcore verb ...
OUTCORE_ARGS=${OUTCORE_ARGS-}                            # ... and its arguments (word-split)
OUTCORE_INTERFACE=${OUTCORE_INTERFACE-ib0}               # --interface; empty: Dask's default
OUTCORE_MEMORY_LIMIT=${OUTCORE_MEMORY_LIMIT-32GiB}       # --memory-limit per worker
OUTCORE_THREADS_PER_WORKER=${OUTCORE_THREADS_PER_WORKER:-1}
OUTCORE_SPILL_DIR=${OUTCORE_SPILL_DIR-}                  # --spill-dir (node-local scratch)
OUTCORE_DASHBOARD=${OUTCORE_DASHBOARD-127.0.0.1:8787}    # on rank 0's node; ssh -L to see it
OUTCORE_OUTPUT_DIR=${OUTCORE_OUTPUT_DIR:-$PWD/runs}
OUTCORE_GPUS_PER_NODE=${OUTCORE_GPUS_PER_NODE-}          # set: write the host file (Torque)
OUTCORE_NRANKS=${OUTCORE_NRANKS-}                        # empty: the lines of the host file
OUTCORE_MPIEXEC=${OUTCORE_MPIEXEC:-$(command -v mpiexec || true)}  # before the venv's PATH
OUTCORE_MPIEXEC_ARGS=${OUTCORE_MPIEXEC_ARGS-}            # empty: -hostfile HOSTFILE
# -------------------------------------------------------------------------------------------

log() { echo "outcore-job: $*"; }
fail() { echo "outcore-job: error: $*" >&2; exit 2; }

if [ -n "$OUTCORE_VENV" ]; then
    [ -f "$OUTCORE_VENV/bin/activate" ] || fail "no virtual environment at OUTCORE_VENV=$OUTCORE_VENV"
    # shellcheck disable=SC1091
    source "$OUTCORE_VENV/bin/activate"
fi
OUTCORE_MPIEXEC=${OUTCORE_MPIEXEC:-$(command -v mpiexec || true)}
[ -n "$OUTCORE_MPIEXEC" ] || fail "no mpiexec on PATH: load your MPI module or set OUTCORE_MPIEXEC"
read -r -a exe <<< "$OUTCORE_EXE"
if [ "$#" -gt 0 ]; then
    cmd=("$@")
else
    read -r -a cmd <<< "$OUTCORE_COMMAND $OUTCORE_ARGS"
fi
jobid=${PBS_JOBID%%.*}
OUTCORE_NAME=${OUTCORE_NAME:-${cmd[0]}-$jobid}
run_dir=$OUTCORE_OUTPUT_DIR/$OUTCORE_NAME
[ ! -e "$run_dir" ] || fail "$run_dir already exists; set OUTCORE_NAME or OUTCORE_OUTPUT_DIR"
mkdir -p "$OUTCORE_OUTPUT_DIR"

options=(--cluster mpi --threads-per-worker "$OUTCORE_THREADS_PER_WORKER"
         --output-dir "$OUTCORE_OUTPUT_DIR" --name "$OUTCORE_NAME")
[ -z "$OUTCORE_INTERFACE" ] || options+=(--interface "$OUTCORE_INTERFACE")
[ -z "$OUTCORE_MEMORY_LIMIT" ] || options+=(--memory-limit "$OUTCORE_MEMORY_LIMIT")
[ -z "$OUTCORE_SPILL_DIR" ] || options+=(--spill-dir "$OUTCORE_SPILL_DIR")
[ -z "$OUTCORE_DASHBOARD" ] || options+=(--dashboard-address "$OUTCORE_DASHBOARD")

# Rank placement: the node file as PBS wrote it (one line per MPI rank, in rank order), or
# GPUS+2 ranks on the first node and GPUS on the others when OUTCORE_GPUS_PER_NODE is set.
hosts=$PBS_NODEFILE
if [ -n "$OUTCORE_GPUS_PER_NODE" ] && [ "$OUTCORE_GPUS_PER_NODE" != 0 ]; then
    gpus=$OUTCORE_GPUS_PER_NODE
    hosts=$(mktemp "${TMPDIR:-/tmp}/outcore-hosts.$jobid.XXXXXX")
    trap 'rm -f "$hosts"' EXIT
    first=1
    for node in $(awk '!seen[$0]++' "$PBS_NODEFILE"); do
        for _ in $(seq $((gpus + 2 * first))); do echo "$node"; done
        first=0
    done > "$hosts"
    log "placement: $gpus GPU(s) per node; first node: scheduler, client and $gpus workers;" \
        "other nodes: $gpus workers each"
else
    log "placement: the node file's order, one rank per line"
fi
ranks=${OUTCORE_NRANKS:-$(wc -l < "$hosts")}
nodes=$(sort -u "$hosts" | wc -l)
[ "$ranks" -ge 3 ] || fail "$ranks MPI ranks: --cluster mpi needs 3 or more (scheduler, client, a worker)"
if [ -n "$OUTCORE_MPIEXEC_ARGS" ]; then
    read -r -a mpiexec_args <<< "$OUTCORE_MPIEXEC_ARGS"
else
    mpiexec_args=(-hostfile "$hosts")
fi

export PYTHONUNBUFFERED=1
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$OUTCORE_THREADS_PER_WORKER}
log "job $PBS_JOBID: $ranks ranks on $nodes node(s) = $((ranks - 2)) workers"
log "run directory: $run_dir"
log "$OUTCORE_MPIEXEC -n $ranks ${mpiexec_args[*]} ${exe[*]} ${cmd[*]} ${options[*]}"

set +e
"$OUTCORE_MPIEXEC" -n "$ranks" "${mpiexec_args[@]}" "${exe[@]}" "${cmd[@]}" "${options[@]}"
code=$?
set -e

if [ -f "$run_dir/summary.json" ] && command -v python3 > /dev/null; then
    python3 - "$run_dir/summary.json" <<'EOF' || true
import json, sys
s = json.load(open(sys.argv[1]))
workers = (s.get("cluster") or {}).get("workers") or []
print(f"outcore-job: status {s.get('status')}, {len(workers)} workers")
for w in workers:
    gpu = " ".join(x for x in (w.get("gpu_name"), w.get("gpu_uuid")) if x) or "no GPU"
    print(f"outcore-job:   {w.get('address')} on {w.get('hostname')}: {gpu}")
EOF
fi
log "exit code $code"
exit "$code"
