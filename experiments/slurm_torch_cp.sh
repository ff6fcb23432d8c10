#!/usr/bin/env bash
# PyTorch context parallelism across nodes: torchrun on every node, one
# process per GPU, meeting through torchrun's c10d rendezvous on the first
# node. Under torchrun the CLI runs as one rank (it starts nothing itself);
# cp_size is the total GPU count; rows are written by rank 0 only.
# Submit from the repository root:
#   sbatch --nodes=2 --gpus-per-node=8 experiments/slurm_torch_cp.sh
#SBATCH --job-name=lcab-cp-torch
#SBATCH --ntasks-per-node=1
#SBATCH --exclusive
#SBATCH --time=02:00:00
set -euo pipefail
gpus_per_node=${SLURM_GPUS_PER_NODE:-8}
gpus_per_node=${gpus_per_node##*:}
cp_size=$(( SLURM_JOB_NUM_NODES * gpus_per_node ))
head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
export NCCL_NVLS_ENABLE=0
srun torchrun --nnodes="$SLURM_JOB_NUM_NODES" --nproc_per_node="$gpus_per_node" \
  --rdzv_backend=c10d --rdzv_endpoint="${head_node}:29500" --rdzv_id="$SLURM_JOB_ID" \
  -m lcab.experiments --flagfile=experiments/cp_torch.flags --cp_size="$cp_size" \
  --git_commit="$(git rev-parse HEAD)" --noprogress \
  --out="results/slurm-${SLURM_JOB_ID}-torch-cp${cp_size}" "$@"
