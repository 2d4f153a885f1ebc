#!/usr/bin/env bash
# Data-parallel training on this machine: N ranks under mpirun, one per GPU (or N CPU ranks with
# --set train.device=cpu, which all-reduce over MPI).
#   bash launch/local_ranks.sh 8 configs/base.yaml
#   bash launch/local_ranks.sh 2 configs/smoke.yaml --set train.device=cpu --set train.threads=1
# As root, Open MPI also needs OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1.
set -euo pipefail
ranks=${1:?usage: launch/local_ranks.sh RANKS CONFIG.yaml [mltrain options]}
shift
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
exec mpirun --oversubscribe -n "$ranks" --bind-to none "$repo/build/bin/mltrain" "$@"
