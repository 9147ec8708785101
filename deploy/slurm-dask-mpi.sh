#!/bin/bash
# outcore under Slurm with dask-mpi: rank 0 runs the scheduler, rank 1 runs the command, every
# other rank is one worker pinned to one GPU of its node.
#
# Assumes: outcore installed with the mpi (and gpu) extras in $OUTCORE_VENV on a shared
# filesystem; GPU nodes with 4 GPUs each; an InfiniBand interface named ib0 (use the name
# `ip addr` shows on your nodes). Ranks = workers + 2: here 2 nodes x 4 GPUs = 8 workers;
# block placement puts 6 ranks on node 1 (scheduler, client, 4 workers) and 4 on node 2, so
# every worker has a GPU of its own. Each worker gets --memory-limit of host RAM: 4 x 32 GiB
# per node here.
#SBATCH --job-name=outcore
#SBATCH --nodes=2
#SBATCH --ntasks=10
#SBATCH --ntasks-per-node=6
#SBATCH --gpus-per-node=4
#SBATCH --time=02:00:00
set -euo pipefail
OUTCORE_VENV=${OUTCORE_VENV:-$HOME/outcore/.venv}
source "$OUTCORE_VENV/bin/activate"

# One command per job; the run directory lands under --output-dir and is refused if it exists.
srun --mpi=pmi2 outcore demo --cluster mpi --interface "${OUTCORE_INTERFACE:-ib0}" \
    --memory-limit 32GiB --output-dir "${SLURM_SUBMIT_DIR}/runs" --name "demo-${SLURM_JOB_ID}"
