#!/bin/bash
# outcore under Slurm with dask-mpi: one MPI job whose rank 0 runs the Dask scheduler, rank 1
# runs the outcore command, and every other rank is one Dask worker pinned to one GPU of its
# node (outcore pins it by its rank among the worker ranks of that node).
#
#   sbatch deploy/slurm-dask-mpi.sh                                  # the command in OUTCORE_*
#   sbatch deploy/slurm-dask-mpi.sh fit-dipoles --input cat.zarr --chunk-size 512 # or given as arguments
#   OUTCORE_ARGS="--input cat.zarr --chunk-size 512" OUTCORE_COMMAND=fit-dipoles sbatch deploy/slurm-dask-mpi.sh
#
# Assumptions (change the #SBATCH lines and the knobs below to match your site):
# - outcore is installed with the `mpi` (and `gpu`) extras in the virtual environment
#   $OUTCORE_VENV on a filesystem every node sees, and mpi4py in it uses the MPI that srun
#   starts: the `mpich` wheel's MPICH with Slurm's PMI2 (`--mpi=pmi2`, the default here), or
#   the site MPI that mpi4py was built against (set OUTCORE_SRUN_MPI to what it needs, e.g.
#   pmix). Set OUTCORE_VENV= (empty) to use the `outcore` already on PATH (a module, conda, a
#   container: OUTCORE_EXE="apptainer exec --nv outcore.sif outcore").
# - Nodes have the same number of GPUs (4 here). Ranks = workers + 2. When the number of GPUs
#   per node is known (OUTCORE_GPUS_PER_NODE, default Slurm's SLURM_GPUS_ON_NODE), the script
#   places the ranks itself: GPUS+2 on the first node (scheduler, client, GPUS workers) and
#   GPUS on every other node, so each worker has a GPU of its own. That is why every node asks
#   for GPUS+2 tasks below; the first node uses them all, the others leave 2 idle. Without a
#   GPU count, srun places the allocation's SLURM_NTASKS ranks as Slurm lays them out.
# - Tasks see every GPU of their node (no --gpus-per-task / --gpu-bind=single): outcore itself
#   gives each worker rank one GPU through CUDA_VISIBLE_DEVICES.
# - The scheduler and workers reach each other over $OUTCORE_INTERFACE (ib0 here: use the name
#   `ip addr` shows on your nodes, or empty for Dask's default).
# - Each worker gets OUTCORE_MEMORY_LIMIT of host memory: 4 x 32 GiB per node here; the
#   allocation must hold that (whole nodes, or --mem).
# - The run directory $OUTCORE_OUTPUT_DIR/$OUTCORE_NAME is on a shared filesystem and does not
#   exist yet (outcore never overwrites one). Its summary.json says where each worker ran.
#
# On failure every rank exits non-zero: outcore shares rank 1's exit code with all ranks and
# aborts the MPI job if the workers have not stopped 30 s after the command ended;
# --kill-on-bad-exit=1 makes Slurm end the step as soon as one rank fails. The script exits
# with srun's exit code.
#SBATCH --job-name=outcore
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=6
#SBATCH --gpus-per-node=4
#SBATCH --time=02:00:00
set -euo pipefail

: "${SLURM_JOB_ID:?not inside a Slurm job: submit this script with sbatch}"
: "${SLURM_NTASKS:?SLURM_NTASKS is not set: give the job --ntasks or --ntasks-per-node}"

# ---- knobs: every site-specific value, overridable from the environment --------------------
# (VAR=value sbatch ..., or sbatch --export=ALL,VAR=value ...). An empty value omits the option.
OUTCORE_VENV=${OUTCORE_VENV-$HOME/outcore/.venv}        # venv to activate; empty: use PATH
OUTCORE_EXE=${OUTCORE_EXE:-outcore}                      # what each rank runs (word-split)
OUTCORE_COMMAND=${OUTCORE_COMMAND:-demo}                 # the outcore verb ...
OUTCORE_ARGS=${OUTCORE_ARGS-}                            # ... and its arguments (word-split)
OUTCORE_INTERFACE=${OUTCORE_INTERFACE-ib0}               # --interface; empty: Dask's default
OUTCORE_MEMORY_LIMIT=${OUTCORE_MEMORY_LIMIT-32GiB}       # --memory-limit per worker
OUTCORE_THREADS_PER_WORKER=${OUTCORE_THREADS_PER_WORKER:-1}
OUTCORE_SPILL_DIR=${OUTCORE_SPILL_DIR-}                  # --spill-dir (node-local scratch)
OUTCORE_DASHBOARD=${OUTCORE_DASHBOARD-127.0.0.1:8787}    # on rank 0's node; ssh -L to see it
OUTCORE_OUTPUT_DIR=${OUTCORE_OUTPUT_DIR:-${SLURM_SUBMIT_DIR:-$PWD}/runs}
OUTCORE_GPUS_PER_NODE=${OUTCORE_GPUS_PER_NODE-${SLURM_GPUS_ON_NODE:-}}  # empty/0: no placement
OUTCORE_SRUN_MPI=${OUTCORE_SRUN_MPI-pmi2}                # srun --mpi=...; empty: site default
OUTCORE_SRUN_ARGS=${OUTCORE_SRUN_ARGS---kill-on-bad-exit=1}  # more srun options (word-split)
# -------------------------------------------------------------------------------------------

log() { echo "outcore-job: $*"; }
fail() { echo "outcore-job: error: $*" >&2; exit 2; }

if [ -n "$OUTCORE_VENV" ]; then
    [ -f "$OUTCORE_VENV/bin/activate" ] || fail "no virtual environment at OUTCORE_VENV=$OUTCORE_VENV"
    # shellcheck disable=SC1091
    source "$OUTCORE_VENV/bin/activate"
fi
read -r -a exe <<< "$OUTCORE_EXE"
if [ "$#" -gt 0 ]; then
    cmd=("$@")
else
    read -r -a cmd <<< "$OUTCORE_COMMAND $OUTCORE_ARGS"
fi
OUTCORE_NAME=${OUTCORE_NAME:-${cmd[0]}-$SLURM_JOB_ID}
run_dir=$OUTCORE_OUTPUT_DIR/$OUTCORE_NAME
[ ! -e "$run_dir" ] || fail "$run_dir already exists; set OUTCORE_NAME or OUTCORE_OUTPUT_DIR"
mkdir -p "$OUTCORE_OUTPUT_DIR"

options=(--cluster mpi --threads-per-worker "$OUTCORE_THREADS_PER_WORKER"
         --output-dir "$OUTCORE_OUTPUT_DIR" --name "$OUTCORE_NAME")
[ -z "$OUTCORE_INTERFACE" ] || options+=(--interface "$OUTCORE_INTERFACE")
[ -z "$OUTCORE_MEMORY_LIMIT" ] || options+=(--memory-limit "$OUTCORE_MEMORY_LIMIT")
[ -z "$OUTCORE_SPILL_DIR" ] || options+=(--spill-dir "$OUTCORE_SPILL_DIR")
[ -z "$OUTCORE_DASHBOARD" ] || options+=(--dashboard-address "$OUTCORE_DASHBOARD")

read -r -a srun_args <<< "$OUTCORE_SRUN_ARGS"
[ -z "$OUTCORE_SRUN_MPI" ] || srun_args=("--mpi=$OUTCORE_SRUN_MPI" ${srun_args[@]+"${srun_args[@]}"})

# Rank placement: GPUS+2 ranks on the first node, GPUS on the others (see the assumptions).
nodes=${SLURM_JOB_NUM_NODES:-${SLURM_NNODES:-1}}
if [ -n "$OUTCORE_GPUS_PER_NODE" ] && [ "$OUTCORE_GPUS_PER_NODE" != 0 ]; then
    gpus=$OUTCORE_GPUS_PER_NODE
    hosts=$(mktemp "${TMPDIR:-/tmp}/outcore-hosts.$SLURM_JOB_ID.XXXXXX")
    trap 'rm -f "$hosts"' EXIT
    first=1
    for node in $(scontrol show hostnames "${SLURM_JOB_NODELIST:?}"); do
        for _ in $(seq $((gpus + 2 * first))); do echo "$node"; done
        first=0
    done > "$hosts"
    ranks=$(wc -l < "$hosts")
    export SLURM_HOSTFILE=$hosts
    srun_args+=(--distribution=arbitrary "--ntasks=$ranks")
    log "placement: $gpus GPU(s) per node; first node: scheduler, client and $gpus workers;" \
        "other nodes: $gpus workers each"
else
    ranks=$SLURM_NTASKS
    log "placement: Slurm's layout of $ranks tasks (set OUTCORE_GPUS_PER_NODE to place them)"
fi
[ "$ranks" -ge 3 ] || fail "$ranks MPI ranks: --cluster mpi needs 3 or more (scheduler, client, a worker)"

export PYTHONUNBUFFERED=1
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$OUTCORE_THREADS_PER_WORKER}
log "job $SLURM_JOB_ID: $ranks ranks on $nodes node(s) = $((ranks - 2)) workers"
log "run directory: $run_dir"
log "srun ${srun_args[*]-} ${exe[*]} ${cmd[*]} ${options[*]}"

set +e
srun ${srun_args[@]+"${srun_args[@]}"} "${exe[@]}" "${cmd[@]}" "${options[@]}"
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
