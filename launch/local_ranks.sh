#!/usr/bin/env bash
# Data-parallel training on this machine: N ranks under mpirun, one per GPU (or N CPU ranks with
# --set train.device=cpu, which all-reduce over MPI).
#   bash launch/local_ranks.sh 8 configs/base.yaml
#   bash launch/local_ranks.sh 2 configs/smoke.yaml --set train.device=cpu --set train.threads=1 --set train.run_dir=runs/smoke-2
# As root (as the README's set-up runs), the script gives Open MPI the two variables it asks for
# before it starts ranks as root: OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1.
#
# Ctrl-C (or SIGTERM or SIGHUP to this script) stops the run with a checkpoint: the script sends
# SIGUSR1 to mpirun, which forwards it to every rank, and the ranks finish their step, checkpoint
# and exit 0. mpirun's own answer to Ctrl-C would kill them too soon to save: Open MPI 4 sends
# SIGTERM, then SIGKILL, each odls_base_sigkill_timeout (1 s) apart, and Open MPI 5 a quarter second
# apart. A second Ctrl-C stops the ranks at once, without a checkpoint.
set -euo pipefail
usage="usage: launch/local_ranks.sh RANKS CONFIG.yaml [mltrain options]"
# Bad input is said with the usage, exit 2 (mltrain's code for it), before mpirun starts: given
# `-n 0`, mpirun starts a rank on every slot instead of none.
refuse() {
  printf 'local_ranks.sh: %s\n%s\n' "$1" "$usage" >&2
  exit 2
}
(($# > 0)) || refuse "RANKS and CONFIG.yaml are missing"
if [[ $1 == -h || $1 == --help ]]; then
  echo "$usage"
  exit 0
fi
# At most 7 digits, so that bash's arithmetic cannot wrap the number around; more ranks on one
# machine than it has GPUs or cores is a slip, and would start that many processes.
if [[ ! $1 =~ ^[0-9]{1,7}$ ]] || ((10#$1 < 1 || 10#$1 > 1024)); then
  refuse "RANKS must be a whole number from 1 to 1024, got \"$1\""
fi
ranks=$((10#$1))
shift
(($# > 0)) || refuse "CONFIG.yaml is missing"
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
mltrain=${MLTRAIN_BIN:-$repo/build/bin/mltrain}  # another build's, for its tests

# Open MPI refuses to start ranks as root unless told so twice. This launcher starts them on this
# machine only, for the user who runs it.
if [[ $(id -u) -eq 0 ]]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi

# The script goes on when what reads its output goes away (`... | tee log`, and Ctrl-C): its
# ranks still have a checkpoint to save.
trap '' PIPE
mpirun_pid=""
stopping=0
# The signal first, then the word: a terminal that hung up, or a tee that is gone, may refuse it.
stop_ranks() {
  [[ -n $mpirun_pid ]] || exit 130  # nothing started yet
  if ((stopping)); then
    kill -TERM "$mpirun_pid" 2>/dev/null || true
    echo "local_ranks.sh: stopping the ranks at once, without a checkpoint" >&2 || true
    return
  fi
  stopping=1
  kill -USR1 "$mpirun_pid" 2>/dev/null || true
  echo "local_ranks.sh: the ranks checkpoint after this step and stop (interrupt again to stop them at once)" >&2 || true
}
trap stop_ranks INT TERM HUP

# mpirun runs in a process group of its own (job control), so that a Ctrl-C at the terminal
# reaches this script alone; then it may not read the terminal, and mltrain reads no input.
set -m
mpirun --oversubscribe -n "$ranks" --bind-to none --stdin none "$mltrain" "$@" &
mpirun_pid=$!

# A trapped signal ends `wait` early: wait again until mpirun has exited, and exit as it did.
while true; do
  status=0
  wait "$mpirun_pid" || status=$?
  kill -0 "$mpirun_pid" 2>/dev/null || exit "$status"
done
