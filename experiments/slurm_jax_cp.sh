#!/usr/bin/env bash
# JAX context parallelism across nodes: one JAX process per node with all of
# its GPUs; jax.distributed finds the coordinator from SLURM's environment
# (--jax_distributed_auto). cp_size is the total GPU count; rows are written
# by process 0 only. Submit from the repository root:
#   sbatch --nodes=2 --gpus-per-node=8 experiments/slurm_jax_cp.sh
#SBATCH --job-name=lcab-cp-jax
#SBATCH --ntasks-per-node=1
#SBATCH --exclusive
#SBATCH --time=02:00:00
set -euo pipefail
gpus_per_node=${SLURM_GPUS_PER_NODE:-8}
cp_size=$(( SLURM_JOB_NUM_NODES * ${gpus_per_node##*:} ))
export XLA_PYTHON_CLIENT_PREALLOCATE=false NCCL_NVLS_ENABLE=0
srun python -m lcab.experiments --flagfile=experiments/cp_jax.flags \
  --jax_distributed_auto --cp_size="$cp_size" \
  --git_commit="$(git rev-parse HEAD)" --noprogress \
  --out="results/slurm-${SLURM_JOB_ID}-jax-cp${cp_size}" "$@"
