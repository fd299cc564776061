#!/usr/bin/env bash
# One training node of slurm/grpo.sbatch: `accelerate launch ARGS...` with this node's machine rank, which is its
# task's rank in the training step (srun sets SLURM_PROCID; the step runs one task per node, in node order).
set -euo pipefail
# Its output: $GRPO_LOG_DIR/train-<node>.log, named for Slurm's name of the node (srun's %N is the host's name).
[[ -z ${GRPO_LOG_DIR:-} ]] || exec >>"$GRPO_LOG_DIR/train-${SLURMD_NODENAME:?run by srun}.log" 2>&1
# The weight sync with a vLLM server ($GRPO_VLLM_SERVER) rendezvouses at the address vLLM's get_ip() finds, which is
# 0.0.0.0 on a node without a default route: this node's address towards the server, unless VLLM_HOST_IP is set.
if [[ -n ${GRPO_VLLM_SERVER:-} && -z ${VLLM_HOST_IP:-} ]]; then
  server_ip=$(getent ahostsv4 "$GRPO_VLLM_SERVER" | awk 'NR == 1 {print $1}') || true
  VLLM_HOST_IP=$(ip -4 -o route get "${server_ip:-0.0.0.0}" 2>/dev/null | sed -n 's/.* src \([0-9.]*\).*/\1/p') || true
  VLLM_HOST_IP=${VLLM_HOST_IP:-$(hostname -I | awk '{print $1}')}
  export VLLM_HOST_IP
fi
exec accelerate launch --machine_rank "${SLURM_PROCID:?run by srun, one task per node}" "$@"
