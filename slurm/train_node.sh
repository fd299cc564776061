#!/usr/bin/env bash
# One training node of slurm/grpo.sbatch: `accelerate launch ARGS...` with this node's machine rank, which is its
# task's rank in the training step (srun sets SLURM_PROCID; the step runs one task per node, in node order).
set -euo pipefail
exec accelerate launch --machine_rank "${SLURM_PROCID:?run by srun, one task per node}" "$@"
