#!/usr/bin/env bash
# The GPU check in one command, for a machine lent for one command of at most ten minutes that has
# the driver, a python3 with torch, CMake, ninja and nvcc, and nothing else of ours: it builds
# mltrain against that torch and the Debian packages carried in bench/gpu-packages/ (made here by
# bench/fetch_gpu_packages.sh), runs `ctest -L gpu`, trains configs/base.yaml for a hundred steps
# in bf16 through `mpirun -n 1` (so the NCCL path runs), two of the steps profiled by kind of work
# (bench/step_profile.py), then benchmarks against torch.compile (bench/train_throughput.sh) the
# base model in bf16 (with data.document_masking too, issue 26), configs/llama-1b.yaml's model in
# bf16 (its MFU against the GPU's peak) and the base model in fp32, with every implementation's
# peak memory, the 1.1B model under dist.zero_stage=3 on its one GPU against the same without
# (issue 44: a world of one must cost nothing), and, as the budget allows, bench/time_to_loss.sh on the base config (one seed) and
# bench/checkpoint_pause.sh. The training run and the benchmarks take mltrain's CUDA kernels
# (train.kernels: fused_cuda, the `fused` rows) where their tests passed in the same call, else
# the ATen layers of train.kernels: auto (the `mltrain` rows). The stages run in the order of what
# their results are worth, each with its own time limit, so that one that fails or hangs leaves the
# others' results, and the budget cuts the least worth first.
#
# What comes back from the machine is at most 8 files, so $OUT holds results.md (the stages and
# every table), gpu_check.log (the console), logs.tar.gz (each stage's log, the training run's
# metrics.jsonl) and, where they were made, train_profile.json.gz (the trace of the profiled
# steps) and time_to_loss.png; each is rewritten after every stage, so that they are whole even if
# the machine is taken away mid-run.
#
#   bash bench/gpu.sh                               # on the GPU machine, from any folder
#   MLTRAIN_GPU_CHECK_DEVICE=cpu bash bench/gpu.sh  # the same stages here on the CPU, smaller
#
# Environment:
#   MLTRAIN_GPU_CHECK_DEVICE    cuda (default) or cpu: the CPU builds against the project's venv,
#                               trains a few steps on a smaller batch and benchmarks the small model
#   OUT                         where results and logs go (default: a new folder under /tmp)
#   MLTRAIN_GPU_CHECK_BUDGET_S  seconds for all stages (default 550 on cuda, 5400 on cpu)
#   MLTRAIN_GPU_CHECK_STEPS     training steps (default 100 on cuda, 10 on cpu)
#   MLTRAIN_GPU_CHECK_BUILD     the build folder (default /tmp/mltrain-gpu-check-build); a second
#                               call on the same machine, while it is still warm, builds nothing
#   MLTRAIN_GPU_CHECK_ONLY      the stages to run after the build, by name (default: all), e.g.
#                               MLTRAIN_GPU_CHECK_ONLY="ctest bench_fp32 time_to_loss"
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

# Per device: the budget, each stage's own cap in seconds, the run's size and the benchmarks'
# (bench_run_limit: the most one benchmark run may take, so that a hung one leaves the stage time
# for the others).
case $device in
  cuda)
    budget=${MLTRAIN_GPU_CHECK_BUDGET_S:-550}
    declare -A cap=([configure]=60 [build]=240 [ctest]=120 [train]=90 [bench_bf16]=170
      [bench_1b]=200 [bench_fp32]=120 [bench_1b_zero3]=160 [time_to_loss]=120
      [checkpoint_pause]=90)
    declare -A bench_run_limit=([bench_bf16]=90 [bench_1b]=170 [bench_fp32]=100
      [bench_1b_zero3]=75)
    python=${MLTRAIN_PYTHON:-$(command -v python3)}
    steps=${MLTRAIN_GPU_CHECK_STEPS:-100}
    train_sets=(train.precision=bf16 dist.backend=nccl train.log_every=10)
    bench_bf16_args=(--model base --steps 20 --warmup 5 --reps 2)
    bench_fp32_args=(--model base --steps 20 --warmup 5 --reps 1)
    bench_1b_args=(--model llama-1b --steps 6 --warmup 2 --reps 1)
    pause_args=(--reps 1 --steps 16 --every 5)
    # A micro-batch a step (16 x 1024 tokens): 120 steps are about 1.3 passes over the fortunes,
    # short of the overfitting that 240 steps of 65,536 tokens (ten passes) measured.
    loss_args=(--config "$repo/configs/base.yaml" --seeds 1 --steps 120 --eval-every 20
      --set data.grad_accum=1 --set optim.warmup_steps=12 --set train.eval_batches=8)
    ;;
  cpu)
    budget=${MLTRAIN_GPU_CHECK_BUDGET_S:-5400}
    declare -A cap=([configure]=300 [build]=3000 [ctest]=300 [train]=600 [bench_bf16]=900
      [bench_1b]=0 [bench_fp32]=900 [bench_1b_zero3]=0 [time_to_loss]=900 [checkpoint_pause]=600)
    declare -A bench_run_limit=([bench_bf16]=400 [bench_1b]=0 [bench_fp32]=400 [bench_1b_zero3]=0)
    python=${MLTRAIN_PYTHON:-${MLTRAIN_HOME:-$HOME/.cache/mltrain}/venv/bin/python}
    steps=${MLTRAIN_GPU_CHECK_STEPS:-10}
    train_sets=(train.precision=fp32 dist.backend=mpi train.log_every=2
      data.seq_len=256 data.micro_batch=2 data.grad_accum=1)
    bench_bf16_args=(--model small --steps 3 --warmup 2 --reps 1)
    bench_fp32_args=("${bench_bf16_args[@]}")
    pause_args=(--reps 1 --steps 6 --every 2)
    loss_args=(--seeds 1 --steps 20 --eval-every 10 --set optim.warmup_steps=2)
    ;;
  *) echo "MLTRAIN_GPU_CHECK_DEVICE is cuda or cpu, not $device" >&2; exit 2 ;;
esac
# Each stage's log, gathered into $OUT/logs.tar.gz.
logs=$work/logs
mkdir -p "$logs"

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

# Results: one row per stage, one section per stage that has something to say; results.md and
# the files beside it are rewritten after every stage.
rows=()
failed=()
section() { cat >>"$work/sections.md"; }
# The trace of the training run's profiled steps, where it has been written.
profile_trace() { find "$work/run_base/profile" -name 'steps_*.json' 2>/dev/null | head -1; }
write_results() {
  {
    echo "# mltrain GPU check ($device), $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo
    echo "| stage | result | seconds | log, in logs.tar.gz |"
    echo "| --- | --- | ---: | --- |"
    printf '%s\n' "${rows[@]}"
    echo
    [[ -f $work/sections.md ]] && cat "$work/sections.md"
  } >"$OUT/results.md"
  tar -czf "$OUT/logs.tar.gz" -C "$work" logs
  local trace
  trace=$(profile_trace)
  if [[ -n $trace && ! -f $OUT/train_profile.json.gz ]]; then
    gzip -c "$trace" >"$OUT/train_profile.json.gz"
  fi
  if [[ -f $work/time_to_loss/time_to_loss.png ]]; then
    cp "$work/time_to_loss/time_to_loss.png" "$OUT/"
  fi
}

# stage NAME LOG FUNCTION: runs FUNCTION with its output appended to $logs/LOG, for at most the
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
  say "stage $name: at most ${limit} s, log $log"
  local began=$SECONDS rc=0
  echo "=== $name: $function" >>"$logs/$log"
  STAGE_NAME=$name STAGE_LIMIT_S=$limit timeout -k 15 "$limit" bash "${BASH_SOURCE[0]}" \
    --stage "$function" >>"$logs/$log" 2>&1 || rc=$?
  local result=ok
  if ((rc == 124 || rc == 137)); then
    result="FAILED: out of time after ${limit} s"
  elif ((rc != 0)); then
    result="FAILED: exit code $rc"
  fi
  rows+=("| $name | $result | $((SECONDS - began)) | $log |")
  if [[ $result != ok ]]; then
    failed+=("$name")
    say "STAGE FAILED: $name: $result; the end of $log:"
    tail -n 30 "$logs/$log" | sed 's/^/    /'
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

# Whether this call's ctest ran every CudaKernels test and each passed: the CUDA kernels rest on
# those alone, so that another GPU test's failure (the memory plan's, say) does not keep them out
# of the training run and the benchmarks.
cuda_kernels_passed() {
  local expected passed
  expected=$("$build/bin/gpu_tests" --gtest_list_tests --gtest_filter='CudaKernels.*' | grep -c '^  ')
  passed=$(grep -cE 'CudaKernels\.[A-Za-z0-9_]+ \.* +Passed' "$logs/ctest.log" 2>/dev/null)
  ((expected > 0 && passed == expected))
}

# Four at a time: each test is a process of its own, whose start (the CUDA context, the libraries)
# takes most of its time; none measures time, and the memory plan's test measures its own
# process's allocations alone.
gpu_tests() { ctest --test-dir "$build" -L gpu --output-on-failure --timeout 120 -j 4; }

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
  cp "$work/run_base/metrics.jsonl" "$logs/train_metrics.jsonl" 2>/dev/null
  "$python" - "$logs/train.log" "$logs/train_metrics.jsonl" "${MLTRAIN_GPU_TRAIN_KERNELS:-auto}" \
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
  trace=$(profile_trace)
  if [[ -n $trace ]]; then
    { echo "### Profile of two steps of the training run"; echo
      "$python" "$repo/bench/step_profile.py" "$trace" --markdown 2>&1; echo; } | section
  fi
}

# The benchmarks against torch.compile, each with the layers the training run takes ($kernels:
# fused, mltrain's CUDA kernels, or mltrain, the ATen layers), first, so that the budget reaches
# them. In bf16 the other is run too (what the CUDA kernels gain), and document masking's cost
# (issue 26, with the ATen layers). fp32 runs with TF32 off, as the references do.
bench_bf16() {
  local others=mltrain
  [[ $kernels == mltrain ]] && others=""
  benchmark bf16 "$kernels compile $others masked" "${bench_bf16_args[@]}"
}
bench_fp32() { benchmark fp32 "$kernels compile" "${bench_fp32_args[@]}"; }
# The 1.1B model on one GPU (issue 25's MFU and torch.compile targets): the achieved FLOP/s taken
# against the GPU's dense bf16 peak, which makes that column the MFU; the runs' directories in
# memory (/dev/shm), where each mltrain run's last checkpoint, 13 GB, is written in seconds.
bench_1b() {
  use_memory_for_1b_runs
  local peak
  peak=$("$python" -c 'import torch
name = torch.cuda.get_device_name()
# NVIDIA datasheets, dense bf16 (trainer/machine/device.cpp has the same table).
print({"NVIDIA H100 80GB HBM3": 989.5e12, "NVIDIA H200": 989.5e12, "NVIDIA H100 PCIe": 756.5e12,
       "NVIDIA H100 NVL": 835.5e12, "NVIDIA H200 NVL": 835.5e12}.get(name, ""), name, sep="\t")')
  # An unknown GPU has no peak: then the column says "not measured".
  BENCH_MATMUL=0 BENCH_MATMUL_FLOPS="${peak%%$'\t'*}" \
    BENCH_MATMUL_SOURCE="the dense bf16 peak of the ${peak#*$'\t'} by NVIDIA's datasheet: the column is the MFU" \
    benchmark bf16 "$kernels compile" "${bench_1b_args[@]}"
}
# The runs' directories in memory, where there is room for two runs' 13 GB checkpoints at once.
use_memory_for_1b_runs() {
  local shm_free
  shm_free=$(df --output=avail -B1 /dev/shm 2>/dev/null | tail -1)
  [[ -w /dev/shm && ${shm_free:-0} -gt 40000000000 ]] && export TMPDIR=/dev/shm
}
# The 1.1B model under dist.zero_stage=3 on its one GPU against the same run without sharding
# (issue 44): a world of one shards nothing, so its tokens/s and peak memory must be the same.
bench_1b_zero3() {
  use_memory_for_1b_runs
  BENCH_MATMUL=0 benchmark bf16 "mltrain zero3" "${bench_1b_args[@]}"
}
# benchmark PRECISION VARIANTS ARGS...: the table into $work/$STAGE_NAME.md.
benchmark() {
  local precision=$1 variants=$2
  shift 2
  # The benchmark ends its own runs at its budget and still prints its table (20 s before the
  # stage's limit, the backstop; a budget too short for any run still gives the table, empty).
  MLTRAIN_BIN_DIR=$build/bin MLTRAIN_PYTHON=$python BENCH_DATA=$shards BENCH_VARIANTS=$variants \
    BENCH_BUDGET_S=$((STAGE_LIMIT_S > 30 ? STAGE_LIMIT_S - 20 : 1)) \
    BENCH_RUN_LIMIT_S=${bench_run_limit[$STAGE_NAME]} bash "$repo/bench/train_throughput.sh" \
    --device "$device" --precision "$precision" --log "$logs/throughput.log" "$@" \
    >"$work/$STAGE_NAME.md"
}

# How long training stops at a checkpoint, synchronous against in the background.
checkpoint_pause() {
  printf '### Checkpoint pause: bench/checkpoint_pause.sh %s\n\n' "${pause_args[*]}" \
    >"$work/checkpoint_pause.md"
  MLTRAIN_BIN_DIR=$build/bin MLTRAIN_PYTHON=$python BENCH_DATA=$shards \
    bash "$repo/bench/checkpoint_pause.sh" --device "$device" --log "$logs/checkpoint_pause.log" \
    "${pause_args[@]}" >>"$work/checkpoint_pause.md"
}

# Muon against AdamW and the PyTorch reference to a target loss (issue 27).
time_to_loss() {
  printf '### Time to a target loss: bench/time_to_loss.sh %s\n\n' "${loss_args[*]#"$repo/"}" \
    >"$work/time_to_loss.md"
  MLTRAIN_BIN_DIR=$build/bin MLTRAIN_PYTHON=$python BENCH_DATA=$shards \
    bash "$repo/bench/time_to_loss.sh" --device "$device" --out "$work/time_to_loss" \
    "${loss_args[@]}" >>"$work/time_to_loss.md"
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
after_build=(ctest train bench_bf16 bench_1b bench_fp32 bench_1b_zero3 time_to_loss
  checkpoint_pause)
if ((built)); then
  # The training run, its profile and the benchmarks take mltrain's CUDA kernels where their tests
  # passed in this call, the layers of auto otherwise.
  export MLTRAIN_GPU_TRAIN_KERNELS=auto kernels=mltrain
  stage ctest ctest.log gpu_tests
  if cuda_kernels_passed; then
    MLTRAIN_GPU_TRAIN_KERNELS=fused_cuda kernels=fused
  fi
  for name in "${after_build[@]:1}"; do
    if [[ $name != bench_* && ! -d $shards ]]; then
      not_run "$name" "no shards in $shards: run bench/fetch_gpu_packages.sh"
    elif ((cap[$name] == 0)); then
      rows+=("| $name | skipped: the 1.1B model is benchmarked on a GPU only | 0 | |")
    elif [[ $name == train ]]; then
      stage train train.log train_base
      # A run cut short still has its metrics so far.
      [[ ${rows[-1]} == "| train | skipped"* ]] || summarize_training
    else
      log=$name.log
      [[ $name == bench_* ]] && log=throughput.log
      stage "$name" "$log" "$name"
      [[ -s $work/$name.md ]] && section <"$work/$name.md"
    fi
  done
else
  for name in "${after_build[@]}"; do
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
