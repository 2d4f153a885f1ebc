#!/usr/bin/env bash
# Data-parallel training without MPI, the way torchrun starts ranks: N processes on this node, each
# given RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT. CPU ranks
# all-reduce over Gloo, GPU ranks over NCCL (one GPU each); they meet at a store that rank 0 serves
# at MASTER_ADDR:MASTER_PORT (dist.rendezvous).
#   bash launch/ranks.sh 8 configs/base.yaml
#   bash launch/ranks.sh 2 configs/smoke.yaml --set train.device=cpu --set train.threads=1 --set train.run_dir=runs/smoke-2
# On several nodes, run it on each with the same MASTER_ADDR (the first node's address) and
# MASTER_PORT, NNODES the number of nodes and NODE_RANK this node's place among them:
#   NNODES=2 NODE_RANK=0 MASTER_ADDR=node01 MASTER_PORT=29500 bash launch/ranks.sh 8 configs/base.yaml
#   NNODES=2 NODE_RANK=1 MASTER_ADDR=node01 MASTER_PORT=29500 bash launch/ranks.sh 8 configs/base.yaml
# torchrun itself starts mltrain the same way (it sets the same variables):
#   torchrun --nproc-per-node=8 --no-python build/bin/mltrain configs/base.yaml
#
# Ctrl-C (or SIGTERM or SIGHUP to this script) stops the run with a checkpoint: the script sends
# SIGTERM to every rank, and the ranks finish their step, checkpoint and exit 0; a second Ctrl-C
# kills them at once. A rank that fails makes the script stop the others (SIGTERM), and exit as it did.
set -euo pipefail
if ((BASH_VERSINFO[0] * 100 + BASH_VERSINFO[1] < 501)); then
  echo "ranks.sh needs bash 5.1 or newer (wait -n -p), and this is $BASH_VERSION" >&2
  exit 2
fi
usage="usage: launch/ranks.sh RANKS CONFIG.yaml [mltrain options]"
# Bad input is said with the usage, exit 2 (mltrain's code for it), before any rank starts:
# bash's arithmetic would take a word for a variable's name, and 0 or -1 for no ranks at all.
refuse() {
  printf 'ranks.sh: %s\n%s\n' "$1" "$usage" >&2
  exit 2
}
# $2, the value of $1, as a whole number from $4 (default 1) to $3, in base 10 whatever its
# leading zeros; at most 7 digits, so that bash's arithmetic cannot wrap it around.
whole_number() {
  local name=$1 text=$2 most=$3 least=${4:-1}
  if [[ ! $text =~ ^[0-9]{1,7}$ ]] || ((10#$text < least || 10#$text > most)); then
    refuse "$name must be a whole number from $least to $most, got \"$text\""
  fi
  echo $((10#$text))
}
(($# > 0)) || refuse "RANKS and CONFIG.yaml are missing"
if [[ $1 == -h || $1 == --help ]]; then
  echo "$usage"
  exit 0
fi
# More ranks on one node than it has GPUs or cores is a slip, and would start that many processes.
ranks=$(whole_number RANKS "$1" 1024) || exit 2
shift
(($# > 0)) || refuse "CONFIG.yaml is missing"
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
mltrain=${MLTRAIN_BIN:-$repo/build/bin/mltrain}  # another build's, for its tests
# The nodes' ranks together within mltrain's limit on a run's (kMostRanks, dist/world.h).
nnodes=$(whole_number NNODES "${NNODES:-1}" $((1048576 / ranks))) || exit 2
node_rank=$(whole_number NODE_RANK "${NODE_RANK:-0}" $((nnodes - 1)) 0) || exit 2
export MASTER_ADDR=${MASTER_ADDR:-127.0.0.1}
MASTER_PORT=$(whole_number MASTER_PORT "${MASTER_PORT:-29500}" 65535) || exit 2
export MASTER_PORT
export WORLD_SIZE=$((nnodes * ranks)) LOCAL_WORLD_SIZE=$ranks

trap '' PIPE  # the ranks still have a checkpoint to save when a reader of the output goes away
pids=()
stopping=0
stop_ranks() {
  if ((stopping)); then
    kill -KILL "${pids[@]}" 2>/dev/null || true
    echo "ranks.sh: stopped the ranks at once, without a checkpoint" >&2 || true
    return
  fi
  stopping=1
  kill -TERM "${pids[@]}" 2>/dev/null || true
  echo "ranks.sh: the ranks checkpoint after this step and stop (interrupt again to stop them at once)" >&2 || true
}
trap stop_ranks INT TERM HUP

# Each rank in a process group of its own, so that a Ctrl-C at the terminal reaches this script
# alone, which passes it on as above.
set -m
for ((local_rank = 0; local_rank < ranks; ++local_rank)); do
  RANK=$((node_rank * ranks + local_rank)) LOCAL_RANK=$local_rank \
    "$mltrain" "$@" </dev/null &
  pids+=($!)
done
set +m

# The first rank to fail decides the exit code, and the others are told to stop (SIGTERM), as
# torchrun does: they would otherwise wait for it until dist.timeout_s.
status=0
live=("${pids[@]}")
while ((${#live[@]} > 0)); do
  finished="" code=0
  wait -n -p finished "${live[@]}" || code=$?
  [[ -n ${finished:-} ]] || continue  # a trapped signal ended the wait
  for i in "${!live[@]}"; do [[ ${live[$i]} == "$finished" ]] && unset 'live[i]'; done
  if ((code != 0 && status == 0)); then
    status=$code
    ((stopping)) || kill -TERM "${live[@]}" 2>/dev/null || true
  fi
done
exit "$status"
