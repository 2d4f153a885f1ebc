#!/usr/bin/env bash
# The GPU check in one command, for a machine lent for one command of at most ten minutes that has
# the driver, a python3 with torch, CMake, ninja and nvcc, and nothing else of ours: it builds
# mltrain against that torch and the Debian packages carried in bench/gpu-packages/ (made here by
# bench/fetch_gpu_packages.sh), runs `ctest -L gpu`, trains configs/base.yaml for a few hundred
# steps in bf16 through `mpirun -n 1` (so the NCCL path runs), with mltrain's CUDA kernels where
# their tests passed, two of the steps profiled by kind of work (bench/step_profile.py), runs bench/train_throughput.sh in bf16 (with data.document_masking
# too, issue 26) and fp32, and configs/llama-1b.yaml's model in bf16 against torch.compile (on a
# GPU only), with every implementation's peak memory, bench/checkpoint_pause.sh, and, as the budget allows,
# bench/time_to_loss.sh on the base config (one seed, 240 steps). Every stage has its own time
# limit, so one that fails or hangs leaves the others' results; $OUT/results.md sums them up and
# the raw logs lie beside it.
#
#   bash bench/gpu.sh                               # on the GPU machine, from any folder
#   MLTRAIN_GPU_CHECK_DEVICE=cpu bash bench/gpu.sh  # the same stages here on the CPU, smaller
#
# Environment:
#   MLTRAIN_GPU_CHECK_DEVICE    cuda (default) or cpu: the CPU builds against the project's venv,
#                               trains a few steps on a smaller batch and benchmarks the small model
#   OUT                         where results and logs go (default: a new folder under /tmp)
#   MLTRAIN_GPU_CHECK_BUDGET_S  seconds for all stages (default 540 on cuda, 5400 on cpu)
#   MLTRAIN_GPU_CHECK_STEPS     training steps (default 300 on cuda, 10 on cpu)
#   MLTRAIN_GPU_CHECK_BUILD     the build folder (default /tmp/mltrain-gpu-check-build)
#   MLTRAIN_GPU_CHECK_ONLY      the stages to run after the build, by name (default: all), as a
#                               second call on the still warm machine runs those the budget cut:
#                               MLTRAIN_GPU_CHECK_ONLY="bench_1b checkpoint_pause time_to_loss"
#   MLTRAIN_PYTHON              the Python whose torch is built against (default python3 on cuda,
#                               the project's venv on cpu)
#   MLTRAIN_GPU_PACKAGES        the carried packages and shards (default bench/gpu-packages)
set -uo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
device=${MLTRAIN_GPU_CHECK_DEVICE:-cuda}
packages=${MLTRAIN_GPU_PACKAGES:-$repo/bench/gpu-packages}
root=$packages/root
shards=$packages/shards
build=${MLTRAIN_GPU_CHECK_BUILD:-/tmp/mltrain-gpu-check-build}
if [[ -z ${OUT:-} ]]; then
  OUT=$(mktemp -d /tmp/mltrain-gpu-check.XXXXXX)
fi
mkdir -p "$OUT"
# Scratch space (the training run, the benchmark's tables), shared with the stage processes.
work=${MLTRAIN_GPU_CHECK_WORK:-$(mktemp -d /tmp/mltrain-gpu-check-work.XXXXXX)}
export OUT MLTRAIN_GPU_CHECK_WORK=$work

# Per device: the budget, each stage's own cap in seconds, the run's size and the benchmark's.
case $device in
  cuda)
    budget=${MLTRAIN_GPU_CHECK_BUDGET_S:-540}
    declare -A cap=([configure]=120 [build]=330 [ctest]=150 [train]=150 [bench_bf16]=210 [bench_fp32]=180
      [bench_1b]=150 [checkpoint_pause]=120 [time_to_loss]=240)
    python=${MLTRAIN_PYTHON:-$(command -v python3)}
    steps=${MLTRAIN_GPU_CHECK_STEPS:-300}
    train_sets=(train.precision=bf16 dist.backend=nccl train.log_every=10)
    bench_args=(--model base --steps 20 --warmup 5 --reps 2)
    bench_1b_args=(--model llama-1b --steps 6 --warmup 2 --reps 1)
    pause_args=(--reps 2 --steps 16 --every 5)
    loss_args=(--config "$repo/configs/base.yaml" --seeds 1 --steps 240 --eval-every 20
      --set optim.warmup_steps=24 --set train.eval_batches=8)
    ;;
  cpu)
    budget=${MLTRAIN_GPU_CHECK_BUDGET_S:-5400}
    declare -A cap=([configure]=300 [build]=3000 [ctest]=300 [train]=600 [bench_bf16]=900 [bench_fp32]=900
      [bench_1b]=0 [checkpoint_pause]=600 [time_to_loss]=900)
    python=${MLTRAIN_PYTHON:-${MLTRAIN_HOME:-$HOME/.cache/mltrain}/venv/bin/python}
    steps=${MLTRAIN_GPU_CHECK_STEPS:-10}
    train_sets=(train.precision=fp32 dist.backend=mpi train.log_every=2
      data.seq_len=256 data.micro_batch=2 data.grad_accum=1)
    bench_args=(--model small --steps 3 --warmup 2 --reps 1)
    pause_args=(--reps 1 --steps 6 --every 2)
    loss_args=(--seeds 1 --steps 20 --eval-every 10 --set optim.warmup_steps=2)
    ;;
  *) echo "MLTRAIN_GPU_CHECK_DEVICE is cuda or cpu, not $device" >&2; exit 2 ;;
esac

start_s=$SECONDS
say() { printf '[gpu.sh %4ds] %s\n' $((SECONDS - start_s)) "$*"; }

# The carried Debian tree is unpacked, not installed: Open MPI and PMIx find their components,
# help texts and parameters through these variables, the loader and pkg-config through the paths.
use_carried_packages() {
  if [[ ! -d $root ]]; then
    say "no $root: using the system's packages (run bench/fetch_gpu_packages.sh to carry them)"
    return
  fi
  local lib=$root/usr/lib/x86_64-linux-gnu
  export PATH=$root/usr/bin:$PATH
  export LD_LIBRARY_PATH=$lib:$lib/openmpi/lib:$lib/pmix2/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  export OPAL_PREFIX=$root/usr OPAL_SYSCONFDIR=$root/etc/openmpi
  export PMIX_PREFIX=$lib/pmix2 PMIX_DATADIR=$lib/pmix2/share PMIX_LIBDIR=$lib/pmix2/lib
  export PKG_CONFIG_SYSROOT_DIR=$root PKG_CONFIG_LIBDIR=$lib/pkgconfig:$root/usr/share/pkgconfig
}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

# Results: one row per stage, one section per stage that has something to say; results.md is
# rewritten after every stage, so that it is whole even if the machine is taken away mid-run.
rows=()
failed=()
section() { cat >>"$work/sections.md"; }
write_results() {
  {
    echo "# mltrain GPU check ($device), $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo
    echo "| stage | result | seconds | log |"
    echo "| --- | --- | ---: | --- |"
    printf '%s\n' "${rows[@]}"
    echo
    [[ -f $work/sections.md ]] && cat "$work/sections.md"
  } >"$OUT/results.md"
}

# stage NAME LOG FUNCTION: runs FUNCTION with its output appended to $OUT/LOG, for at most the
# stage's cap and never past the budget. timeout needs a program, so the function runs in this
# script started again (bash gpu.sh --stage FUNCTION), whose whole process group timeout ends.
# Returns the function's exit status.
stage() {
  local name=$1 log=$2 function=$3
  if [[ -n ${MLTRAIN_GPU_CHECK_ONLY:-} && $name != configure && $name != build &&
    " $MLTRAIN_GPU_CHECK_ONLY " != *" $name "* ]]; then
    rows+=("| $name | skipped: not in MLTRAIN_GPU_CHECK_ONLY | 0 | |")
    write_results
    return 0
  fi
  local left=$((budget - (SECONDS - start_s))) limit=${cap[$name]}
  ((limit > left)) && limit=$left
  if ((limit < 15)); then
    rows+=("| $name | NOT RUN: the ${budget} s budget is spent | 0 | |")
    failed+=("$name")
    say "STAGE NOT RUN: $name (the budget is spent)"
    write_results
    return 1
  fi
  say "stage $name: at most ${limit} s, log $OUT/$log"
  local began=$SECONDS rc=0
  echo "=== $name: $function" >>"$OUT/$log"
  STAGE_LIMIT_S=$limit timeout -k 15 "$limit" bash "${BASH_SOURCE[0]}" --stage "$function" \
    >>"$OUT/$log" 2>&1 || rc=$?
  local result=ok
  if ((rc == 124 || rc == 137)); then
    result="FAILED: out of time after ${limit} s"
  elif ((rc != 0)); then
    result="FAILED: exit code $rc"
  fi
  rows+=("| $name | $result | $((SECONDS - began)) | $log |")
  if [[ $result != ok ]]; then
    failed+=("$name")
    say "STAGE FAILED: $name: $result; the end of $OUT/$log:"
    tail -n 30 "$OUT/$log" | sed 's/^/    /'
  else
    say "stage $name: ok in $((SECONDS - began)) s"
  fi
  write_results
  return "$rc"
}

not_run() {
  rows+=("| $1 | NOT RUN: $2 | 0 | |")
  failed+=("$1")
  say "STAGE NOT RUN: $1 ($2)"
  write_results
}

describe_machine() {
  echo "## Machine"
  echo
  echo '```'
  if [[ $device == cuda ]]; then
    timeout 30 nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1
  fi
  echo "$(nproc) CPU cores; $(ldd --version 2>&1 | head -1) (the carried libraries need glibc 2.36)"
  g++ --version 2>&1 | head -1
  cmake --version 2>&1 | head -1
  echo "ninja $(ninja --version 2>&1)"
  command -v nvcc >/dev/null && nvcc --version 2>&1 | tail -1
  timeout 60 "$python" -c 'import sys, torch; print(sys.executable, "torch", torch.__version__,
    "CUDA", torch.version.cuda, "available:", torch.cuda.is_available())' 2>&1
  echo '```'
  echo
}

configure() {
  local carried=() cuda_compiler=()
  if [[ -d $root ]]; then
    # -L for xxhash, linked by name alone: ahead of the compiler's own directories, unlike
    # LIBRARY_PATH, so that no other copy of it can win.
    carried=(-DCMAKE_PREFIX_PATH="$root/usr" -DPKG_CONFIG_EXECUTABLE="$root/usr/bin/pkgconf"
      -DMPI_CXX_COMPILER="$root/usr/bin/mpicxx" -DMPIEXEC_EXECUTABLE="$root/usr/bin/mpiexec"
      -DCMAKE_EXE_LINKER_FLAGS="-L$root/usr/lib/x86_64-linux-gnu")
  fi
  if [[ ! -x /usr/local/cuda/bin/nvcc ]] && command -v nvcc >/dev/null; then
    cuda_compiler=(-DCMAKE_CUDA_COMPILER="$(command -v nvcc)")
  fi
  cmake -S "$repo" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMLTRAIN_PYTHON="$python" \
    "${carried[@]}" "${cuda_compiler[@]}"
}

# Only what the stages run: mltrain and the gpu-labelled tests (ctest lists the unbuilt suites as
# _NOT_BUILT tests, which -L gpu leaves out).
build_targets() { ninja -C "$build" -j "$(nproc)" mltrain gpu_tests; }

gpu_tests() { ctest --test-dir "$build" -L gpu --output-on-failure --timeout 120; }

train_base() {
  local sets=() setting warmup=$((steps / 10 > 0 ? steps / 10 : 1)) profile=()
  # Two steps in the middle, traced for summarize_training (a run too short has none to spare).
  ((steps >= 4)) && profile=(train.profile_steps="$((steps / 2))-$((steps / 2 + 1))")
  for setting in "${train_sets[@]}" train.device="$device" train.max_steps="$steps" \
    train.run_dir="$work/run_base" train.eval_every="$steps" train.eval_batches=4 \
    train.ckpt_every="$steps" optim.warmup_steps="$warmup" data.train="$shards/train_*.bin" \
    data.val="$shards/val_*.bin" data.tokenizer="$shards/tokenizer.model" \
    train.kernels="${MLTRAIN_GPU_TRAIN_KERNELS:-auto}" "${profile[@]}"; do
    sets+=(--set "$setting")
  done
  mpirun --oversubscribe --bind-to none -n 1 "$build/bin/mltrain" "$repo/configs/base.yaml" "${sets[@]}"
}

# The run's loss, speed and memory, from its last progress line and its metrics.
summarize_training() {
  cp "$work/run_base/metrics.jsonl" "$OUT/train_metrics.jsonl" 2>/dev/null
  "$python" - "$OUT/train.log" "$OUT/train_metrics.jsonl" "${MLTRAIN_GPU_TRAIN_KERNELS:-auto}" \
    <<'EOF' | section
import json, re, statistics, sys
log, metrics, kernels = sys.argv[1:4]
print(f"## Training configs/base.yaml through mpirun -n 1, train.kernels: {kernels}\n")
try:
    rows = [json.loads(line) for line in open(metrics)]
except OSError:
    print("no metrics.jsonl: see train.log\n")
    sys.exit()
start = next((r for r in rows if r.get("event") == "start"), {})
steps = [r for r in rows if "tokens_per_s" in r]
evals = [r for r in rows if "val_loss" in r]
print(f"- device: {start.get('device')}, {start.get('parameters')} parameters, "
      f"{start.get('tokens_per_step')} tokens per step")
if steps:
    timed = steps[1:] or steps  # the first logged interval holds the warm-up
    rates = [r["tokens_per_s"] for r in timed]
    first, last = steps[0], steps[-1]
    print(f"- loss {first['loss']:.4f} at step {first['step']}, {last['loss']:.4f} at step {last['step']}")
    print(f"- tokens/s: median {statistics.median(rates):,.0f} (min {min(rates):,.0f}, "
          f"max {max(rates):,.0f}) over {len(timed)} logged steps after step {first['step']}")
    print(f"- step time: median {statistics.median(r['step_ms'] for r in timed):.1f} ms, "
          f"of which waiting for data {statistics.median(r['data_ms'] for r in timed):.2f} ms")
for r in evals:
    print(f"- val loss {r['val_loss']:.4f} (ppl {r['val_ppl']:.1f}) at step {r['step']}")
progress = [line for line in open(log) if re.search(r"step \d+/\d+ \| loss", line)]
if progress:
    last = progress[-1]
    speed = re.search(r"\| (MFU [\d.]+%|[\d.]+ GFLOP/s) \|", last)
    memory = re.search(r"mem ([\d.]+) GB", last)
    print(f"- {speed.group(1) if speed else 'speed not logged'}, peak memory "
          f"{memory.group(1) + ' GB' if memory else 'not logged'} (the last progress line)")
    print(f"\n```\n{last.strip()}\n```")
print()
EOF
  # Where the traced steps' time went (issue 25): GEMM, attention, glue, copies, idle gaps.
  local trace
  trace=$(ls "$work"/run_base/profile/steps_*.json 2>/dev/null | head -1)
  if [[ -n $trace ]]; then
    { echo "### Profile of two steps of the training run"; echo
      "$python" "$repo/bench/step_profile.py" "$trace" --markdown 2>&1; echo; } | section
  fi
}

# fused is train.kernels=fused_cuda, mltrain's CUDA kernels, against the ATen layers that auto keeps on
# CUDA until the kernels' GPU tests have passed; first after mltrain, so the budget reaches it.
bench_bf16() { benchmark bf16 "mltrain fused compile eager masked" bench_bf16 "${bench_args[@]}"; }
bench_fp32() { benchmark fp32 "mltrain fused compile eager" bench_fp32 "${bench_args[@]}"; }
# The 1.1B model on one GPU (issue 25's MFU and torch.compile targets): mltrain and compile alone,
# with no matrix-product rate to measure first (MFU is against the GPU's peak).
bench_1b() { BENCH_MATMUL=0 benchmark bf16 "mltrain fused compile" bench_1b "${bench_1b_args[@]}"; }
# benchmark PRECISION VARIANTS NAME ARGS...: the table into $work/NAME.md. masked is document
# masking's cost (issue 26) in the precision training runs in.
benchmark() {
  local precision=$1 variants=$2 name=$3
  shift 3
  # The benchmark ends its own runs at its budget and still prints its table (20 s before the
  # stage's limit, the backstop; a budget too short for any run still gives the table, empty).
  MLTRAIN_BIN_DIR=$build/bin MLTRAIN_PYTHON=$python BENCH_DATA=$shards BENCH_VARIANTS=$variants \
    BENCH_BUDGET_S=$((STAGE_LIMIT_S > 30 ? STAGE_LIMIT_S - 20 : 1)) bash "$repo/bench/train_throughput.sh" \
    --device "$device" --precision "$precision" --log "$OUT/throughput.log" "$@" >"$work/$name.md"
}

# How long training stops at a checkpoint, synchronous against in the background: last, as what
# the budget has left allows.
checkpoint_pause() {
  MLTRAIN_BIN_DIR=$build/bin MLTRAIN_PYTHON=$python BENCH_DATA=$shards \
    bash "$repo/bench/checkpoint_pause.sh" --device "$device" --log "$OUT/checkpoint_pause.log" \
    "${pause_args[@]}" >"$work/checkpoint_pause.md"
}

# Muon against AdamW and the PyTorch reference to a target loss (issue 27): last, as what the
# budget has left allows.
time_to_loss() {
  MLTRAIN_BIN_DIR=$build/bin MLTRAIN_PYTHON=$python BENCH_DATA=$shards \
    bash "$repo/bench/time_to_loss.sh" --device "$device" --out "$OUT/time_to_loss" \
    "${loss_args[@]}" >"$work/time_to_loss.md"
}

if [[ ${1:-} == --stage ]]; then
  "$2"
  exit
fi

exec > >(tee -a "$OUT/gpu_check.log") 2>&1
say "device check on $device: results in $OUT, budget ${budget} s"
use_carried_packages
describe_machine | section
write_results
cat "$work/sections.md"

built=0
if stage configure build.log configure; then
  stage build build.log build_targets && built=1
else
  not_run build "the configure stage failed"
fi
if ((built)); then
  stage ctest ctest.log gpu_tests
  # The training run and its profile take mltrain's CUDA kernels where their tests passed in this
  # call (the profile of the fused step is what issue 25 reads next), the layers of auto otherwise.
  export MLTRAIN_GPU_TRAIN_KERNELS=auto
  [[ ${rows[-1]} == "| ctest | ok |"* ]] && MLTRAIN_GPU_TRAIN_KERNELS=fused_cuda
  if [[ -d $shards ]]; then
    stage train train.log train_base
    summarize_training
  else
    not_run train "no shards in $shards: run bench/fetch_gpu_packages.sh"
  fi
  for name in bench_bf16 bench_fp32 bench_1b; do
    if ((cap[$name] == 0)); then
      rows+=("| $name | skipped: the 1.1B model is benchmarked on a GPU only | 0 | |")
      continue
    fi
    stage "$name" throughput.log "$name"
    [[ -s $work/$name.md ]] && section <"$work/$name.md"
  done
  if [[ -d $shards ]]; then
    stage checkpoint_pause checkpoint_pause.log checkpoint_pause
    [[ -s $work/checkpoint_pause.md ]] && section <"$work/checkpoint_pause.md"
    stage time_to_loss time_to_loss.log time_to_loss
    [[ -s $work/time_to_loss.md ]] && section <"$work/time_to_loss.md"
  else
    for name in checkpoint_pause time_to_loss; do
      not_run "$name" "no shards in $shards: run bench/fetch_gpu_packages.sh"
    done
  fi
else
  for name in ctest train bench_bf16 bench_fp32 bench_1b checkpoint_pause time_to_loss; do
    not_run "$name" "the build failed"
  done
fi
write_results
rm -rf "$work"

echo
cat "$OUT/results.md"
if ((${#failed[@]} > 0)); then
  say "FAILED OR NOT RUN: ${failed[*]}; results in $OUT"
  exit 1
fi
say "all stages passed; results in $OUT"
