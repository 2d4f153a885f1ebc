#!/usr/bin/env bash
# The whole benchmark suite in one command, written up in bench/RESULTS.md: the machine (CPU model
# and flags, cores, memory, load, torch), then in turn
#   1. the limit: this machine's fp32 and bf16 matrix-product rates at each model's GEMM shapes
#      (bench/matmul_rate.py), through the torch the benchmarks use;
#   2. training throughput (bench/train_throughput.sh): mltrain, PyTorch eager and torch.compile,
#      interleaved, for the base and the small model in fp32 and bf16, with each one's FLOP/s as a
#      fraction of the matrix-product rate of its precision and mltrain's overheads;
#   3. data-parallel scaling (bench/allreduce.sh): 1 rank x 2 threads against 2 ranks x 1 thread,
#      overlap on and off, at the same global batch;
#   4. peak memory per rank (bench/memory.sh): train.kernels=fused against aten;
# each with the exact command that made it, the date, and a "Reading the numbers" section left for
# the conclusions. Progress goes to stderr, the logs to a folder it names. About 30 minutes on an
# idle machine of 2 cores (bf16 there runs fewer steps: without AVX512-BF16 or AMX-BF16 it is
# emulated, an order of magnitude slower); the numbers are only as good as the machine is idle.
#
#   bash bench/run_all.sh                 # CPU; writes bench/RESULTS.md
#   BENCH_QUICK=1 BENCH_RESULTS=/tmp/r.md bash bench/run_all.sh   # a rehearsal: 1 rep, 2 steps
#
# Environment:
#   BENCH_QUICK        1: every benchmark at 1 repetition, 2 timed steps after 1 (a rehearsal)
#   BENCH_RESULTS      where the write-up goes (default bench/RESULTS.md)
#   BENCH_LOG_DIR      where the logs go (default a new folder under /tmp)
#   BENCH_DEVICE       cpu (default) or cuda: the device of the limit, throughput and memory
#                      sections (data-parallel scaling is on the CPU either way)
#   BENCH_SECTIONS     which to run (default "limit throughput allreduce memory")
#   BENCH_MODELS       the models of the limit and throughput sections (default "base small")
#   BENCH_PRECISIONS   their precisions (default "fp32 bf16")
#   BENCH_MAIN_MODEL   the model of the allreduce and memory sections (default base)
#   BENCH_REPS, BENCH_STEPS, BENCH_WARMUP  throughput and allreduce runs (default 3, 10, 3)
#   BENCH_BF16_REPS, BENCH_BF16_STEPS, BENCH_BF16_WARMUP, BENCH_BF16_BUDGET_S  bf16 throughput
#                      tables (default as fp32 with no budget, but on a CPU that emulates bf16
#                      2 repetitions of 2 steps after 1, each table cut off at 600 s)
#   BENCH_MEMORY_STEPS steps of a memory run (default 3); BENCH_MEMORY_BATCHES as bench/memory.sh
#   BENCH_THREADS      CPU threads of every run (default all cores); the rest as the scripts say
#   MLTRAIN_BIN_DIR, MLTRAIN_PYTHON, BENCH_DATA  as the scripts say
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=bench/environment.sh
source "$repo/bench/environment.sh"
export MLTRAIN_PYTHON=$python
results=${BENCH_RESULTS:-$repo/bench/RESULTS.md}
logs=${BENCH_LOG_DIR:-$(mktemp -d /tmp/mltrain-bench.XXXXXX)}
mkdir -p "$logs"
device=${BENCH_DEVICE:-cpu}
sections=${BENCH_SECTIONS:-limit throughput allreduce memory}
models=${BENCH_MODELS:-base small}
precisions=${BENCH_PRECISIONS:-fp32 bf16}
main_model=${BENCH_MAIN_MODEL:-base}
threads=${BENCH_THREADS:-$(nproc)}
export BENCH_THREADS=$threads
quick=${BENCH_QUICK:-0}

cpu_flags=$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null | cut -d: -f2 || true)
has_flag() { grep -qw "$1" <<<"$cpu_flags"; }
emulated_bf16=0
if [[ $device == cpu ]] && ! has_flag avx512_bf16 && ! has_flag amx_bf16; then emulated_bf16=1; fi

if [[ $quick == 1 ]]; then
  reps=1 steps=2 warmup=1 bf16_reps=1 bf16_steps=2 bf16_warmup=1 memory_steps=1
  bf16_budget=${BENCH_BF16_BUDGET_S:-0}
else
  reps=${BENCH_REPS:-3} steps=${BENCH_STEPS:-10} warmup=${BENCH_WARMUP:-3}
  memory_steps=${BENCH_MEMORY_STEPS:-3}
  if ((emulated_bf16)); then
    bf16_reps=${BENCH_BF16_REPS:-2} bf16_steps=${BENCH_BF16_STEPS:-2}
    bf16_warmup=${BENCH_BF16_WARMUP:-1} bf16_budget=${BENCH_BF16_BUDGET_S:-600}
  else
    bf16_reps=${BENCH_BF16_REPS:-$reps} bf16_steps=${BENCH_BF16_STEPS:-$steps}
    bf16_warmup=${BENCH_BF16_WARMUP:-$warmup} bf16_budget=${BENCH_BF16_BUDGET_S:-0}
  fi
fi

start_s=$SECONDS
say() { printf '[run_all %4ds] %s\n' $((SECONDS - start_s)) "$*" >&2; }
body=$logs/body.md
: >"$body"
failures=()

# Runs one benchmark: NAME, then the command (env assignments first, as env takes them). Its
# stdout, through $format (default cat), is its section of the write-up, with the command above
# it; stderr goes to the console and to the log NAME.err.
bench() {
  local name=$1 rc=0 shown
  shift
  shown=$(printf '%q ' "$@")
  shown=${shown% }
  shown=${shown//$repo\//}
  say "$name: $shown"
  printf '\nCommand: `%s` (load average before it: %s)\n' "$shown" \
    "$(cut -d' ' -f1 /proc/loadavg)" >>"$body"
  (cd "$repo" && env "$@") >"$logs/$name.md" 2> >(tee "$logs/$name.err" >&2) || rc=$?
  ${format:-cat} "$logs/$name.md" >>"$body"
  if ((rc != 0)); then
    failures+=("$name (exit code $rc)")
    printf '\n**%s exited with code %s**: see %s.\n' "$name" "$rc" "$logs/$name.err" >>"$body"
    say "$name: exit code $rc"
  fi
}

# bench/matmul_rate.py's output for the write-up: its human lines as a list, then its table.
format_matmul() {
  echo
  sed -e '/_flops_per_s /d' -e 's/^\(matmul_rate\|fp32\|bf16\): /- &/' "$1"
}

# The model's dimensions for bench/matmul_rate.py, at the micro-batch bench/train_throughput.sh
# gives it on this device.
matmul_flags() {
  local base_batch="--seq-len 256 --micro-batch 2"
  [[ $device == cuda ]] && base_batch="--seq-len 1024 --micro-batch 16"
  case $1 in
    base) echo "--vocab-size 4096 --d-model 512 --n-layers 12 --n-q-heads 8 --n-kv-heads 2" \
      "--head-dim 64 --d-ffn 1408 $base_batch" ;;
    small) echo "--vocab-size 4096 --d-model 128 --n-layers 4 --n-q-heads 4 --n-kv-heads 2" \
      "--head-dim 32 --d-ffn 352 --seq-len 128 --micro-batch 16" ;;
    *) echo "unknown model $1" >&2; return 2 ;;
  esac
}

# lscpu's value of a field, or nothing.
cpu_field() { lscpu 2>/dev/null | sed -n "s/^$1:[[:space:]]*//p" | head -1; }

# The machine as rows of a markdown table.
describe_machine() {
  local name hypervisor flag flags="" cores torch cache=$repo/build/CMakeCache.txt build
  name=$(cpu_field 'Model name')
  [[ -n $name ]] || name=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)
  hypervisor=$(cpu_field 'Hypervisor vendor')
  for flag in avx2 avx512f avx512_bf16 amx_bf16; do
    if has_flag "$flag"; then flags+="$flag yes, "; else flags+="$flag **no**, "; fi
  done
  cores="$(cpu_field 'Socket(s)') socket(s) x $(cpu_field 'Core(s) per socket') core(s) x"
  cores+=" $(cpu_field 'Thread(s) per core') thread(s)"
  torch=$("$python" -c 'import torch; print(torch.__version__ + ", CPU capability "
    + torch.backends.cpu.get_cpu_capability() + ", CUDA " + str(torch.version.cuda))' 2>&1 | tail -1)
  build=$bin_dir/mltrain
  if [[ $bin_dir == "$repo/build/bin" && -f $cache ]]; then
    build+=", $(sed -n 's/^CMAKE_BUILD_TYPE:STRING=//p' "$cache") build of"
    build+=" $(date -u -r "$bin_dir/mltrain" '+%Y-%m-%d %H:%M UTC'), LibTorch from"
    build+=" \`$(sed -n 's/^Torch_DIR:PATH=//p' "$cache")\`"
  fi
  echo "| | |"
  echo "| --- | --- |"
  echo "| CPU | ${name:-unknown} ($(cpu_field 'Vendor ID'), family $(cpu_field 'CPU family')," \
    "model $(cpu_field 'Model'))${hypervisor:+, under a $hypervisor hypervisor} |"
  echo "| CPU flags | ${flags%, } |"
  echo "| cores | $(nproc) available to this run; $cores |"
  echo "| caches | L2 $(cpu_field 'L2 cache'), L3 $(cpu_field 'L3 cache') |"
  echo "| memory | $(awk '/^MemTotal/ {printf "%.1f GiB", $2 / 1048576}' /proc/meminfo) |"
  echo "| load average at the start | $(cut -d' ' -f1-3 /proc/loadavg) (1, 5, 15 minutes) |"
  echo "| kernel | $(uname -sr) |"
  echo "| torch (the references, the matmul rate) | $torch |"
  echo "| mltrain | $build |"
  echo "| MPI | $(mpirun --version 2>/dev/null | head -1 || true) |"
  if [[ $device == cuda ]] && command -v nvidia-smi >/dev/null; then
    echo "| GPU | $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader |
      head -1) |"
  fi
}

# What the scripts read from the environment besides their arguments, for the write-up.
env_text="BENCH_THREADS=$threads MLTRAIN_PYTHON=$python"
for variable in MLTRAIN_BIN_DIR BENCH_DATA BENCH_SEQ_LEN BENCH_MICRO_BATCH BENCH_GRAD_ACCUM \
  BENCH_VARIANTS BENCH_BUDGET_S BENCH_MATMUL BENCH_MEMORY_KERNELS BENCH_RUN_TIMEOUT_S \
  BENCH_MPIRUN BENCH_MPI_BIND; do
  [[ -n ${!variable:-} ]] && env_text+=" $variable=$(printf '%q' "${!variable}")"
done

say "logs in $logs; the write-up goes to $results"
# Work of others on the cores stalls every parallel region of a run with several threads (each
# waits for its slowest thread), so a busy machine makes the tables measure the load.
load_at_start=$(cut -d' ' -f1 /proc/loadavg)
busy=$(awk -v load="$load_at_start" 'BEGIN { print (load >= 0.5) ? 1 : 0 }')
((busy)) && say "warning: the load average is $load_at_start before anything runs: the machine" \
  "is not idle, and the numbers will show it"
machine=$(describe_machine)
started=$(date -u '+%Y-%m-%d %H:%M UTC')

declare -A matmul_rate
if [[ " $sections " == *" limit "* ]]; then
  echo -e "\n## The limit: matrix-product rates\n" >>"$body"
  echo "The FLOP-weighted rate of one micro-batch's training GEMMs (every linear layer's forward," \
    "input-gradient and weight-gradient product and attention's six batched products, each timed" \
    "alone; bench/matmul_rate.py says how), at each model's shapes and $threads threads. The" \
    "throughput tables take their fractions against these." >>"$body"
  for model in $models; do
    read -ra flags <<<"$(matmul_flags "$model")"
    echo -e "\n### $model model" >>"$body"
    format=format_matmul bench "matmul_$model" "$python" "$repo/bench/matmul_rate.py" \
      --device "$device" --threads "$threads" "${flags[@]}" --markdown
    for precision in fp32 bf16; do
      rate=$(sed -n "s/^${precision}_flops_per_s //p" "$logs/matmul_$model.md" | tail -1)
      [[ -n $rate ]] && matmul_rate[$model.$precision]=$rate
    done
  done
fi

if [[ " $sections " == *" throughput "* ]]; then
  echo -e "\n## Training throughput\n" >>"$body"
  echo -n "Each table is one bench/train_throughput.sh: fp32 $reps repetitions of $steps timed" \
    "steps after $warmup, bf16 $bf16_reps of $bf16_steps after $bf16_warmup" >>"$body"
  ((bf16_budget > 0)) && echo -n ", each bf16 table cut off at ${bf16_budget} s" >>"$body"
  if ((emulated_bf16)); then
    echo " (this CPU has neither AVX512-BF16 nor AMX-BF16: bf16 is emulated, and slow)." >>"$body"
  else
    echo "." >>"$body"
  fi
  for precision in $precisions; do
    for model in $models; do
      r=$reps s=$steps w=$warmup given=()
      if [[ $precision == bf16 ]]; then
        r=$bf16_reps s=$bf16_steps w=$bf16_warmup
        ((bf16_budget > 0)) && given+=("BENCH_BUDGET_S=$bf16_budget")
      fi
      [[ -n ${matmul_rate[$model.$precision]:-} ]] &&
        given+=("BENCH_MATMUL_FLOPS=${matmul_rate[$model.$precision]}")
      bench "throughput_${model}_$precision" "${given[@]}" bash "$repo/bench/train_throughput.sh" \
        --device "$device" --model "$model" --precision "$precision" --steps "$s" --warmup "$w" \
        --reps "$r" --log "$logs/throughput_${model}_$precision.log"
    done
  done
fi

if [[ " $sections " == *" allreduce "* ]]; then
  echo -e "\n## Data-parallel scaling on the CPU" >>"$body"
  bench allreduce bash "$repo/bench/allreduce.sh" --model "$main_model" --ranks 2 --steps "$steps" \
    --warmup "$warmup" --reps "$reps" --log "$logs/allreduce.log"
fi

if [[ " $sections " == *" memory "* ]]; then
  echo -e "\n## Peak memory" >>"$body"
  memory_batches="2x256 8x256"
  [[ $device == cuda ]] && memory_batches=16x1024
  ((quick == 1)) && memory_batches=${memory_batches%% *}
  memory_batches=${BENCH_MEMORY_BATCHES:-$memory_batches}
  bench memory BENCH_MEMORY_BATCHES="$memory_batches" bash "$repo/bench/memory.sh" \
    --device "$device" --model "$main_model" --steps "$memory_steps" --log "$logs/memory.log"
fi

{
  echo "# Benchmark results"
  echo
  echo "Made by \`bash bench/run_all.sh\`$( ((quick == 1)) && echo ' with BENCH_QUICK=1')" \
    "on $started, finished $(date -u '+%Y-%m-%d %H:%M UTC') ($(((SECONDS - start_s) / 60)) min)." \
    "Each section below gives the exact command of each table, from the repository root, with" \
    "\`$env_text\` in the environment."
  if ((busy)); then
    echo
    echo "**The machine was not idle: the load average was $load_at_start before the first" \
      "benchmark. Other work on the cores stalls every multi-threaded run; the tables show it.**"
  fi
  if ((quick == 1)); then
    echo
    echo "**A rehearsal (BENCH_QUICK=1: one repetition of two steps): not numbers to conclude from.**"
  fi
  echo
  echo "## The machine"
  echo
  echo "$machine"
  echo "| load average at the end | $(cut -d' ' -f1-3 /proc/loadavg) |"
  if ((${#failures[@]} > 0)); then
    echo
    echo "**Failed:** ${failures[*]}; the logs were in $logs."
  fi
  cat "$body"
  echo
  echo "## Reading the numbers"
  echo
  echo "TODO (the engineer): the conclusions from the tables above, against the issue's targets:"
  echo "mltrain against eager and torch.compile, each trainer's fraction of the matrix-product rate,"
  echo "loader wait under 1% and time outside forward, backward and the optimizer under 2% of the"
  echo "step, 2 ranks at 95% or more of one rank's tokens/s, and the peak memory drop of the chunked"
  echo "loss."
} >"$results.tmp"
mv "$results.tmp" "$results"
say "wrote $results$( ((${#failures[@]} > 0)) && echo "; failed: ${failures[*]}")"
((${#failures[@]} == 0))
