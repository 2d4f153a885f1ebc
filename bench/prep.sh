#!/usr/bin/env bash
# Corpus preparation side by side: mlprep against bench/reference_prep.py (Python sentencepiece in a
# multiprocessing pool and numpy shards, as llm.c's fineweb.py prepares FineWeb), on a generated
# jsonl corpus, plain and zstd-compressed, at each thread count, both with the same tokenizer and
# no validation split. The runs alternate, repetition after repetition. For each it reports the
# wall time, MB/s of jsonl, tokens/s and the peak RSS (/usr/bin/time -v), whether mlprep's shards
# are the reference's bytes, and the ratio of throughputs (the goal: mlprep at least 2x). With two
# corpus sizes, mlprep's peak RSS at each shows whether memory grows with the corpus.
#
#   bench/prep.sh [--mb "SIZES"] [--threads "COUNTS"] [--reps N] [--log FILE]
#
# --mb: corpus sizes in MB of jsonl (default "200 1000"; the issue's scale is 2000); --threads:
# thread counts (default "1 2"). The throughput table is of the largest size. Environment:
#   BENCH_PREP_COMPRESSIONS  "none zstd" (default), "none", "gzip zstd"...
#   MLTRAIN_BIN_DIR  where mlprep is (default build/bin)
#   MLTRAIN_PYTHON   the Python with sentencepiece and numpy (default the project's venv)
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
sizes="200 1000" thread_counts="1 2" reps=1 log=""
while (($# > 0)); do
  case $1 in
    --mb) sizes=$2 ;;
    --threads) thread_counts=$2 ;;
    --reps) reps=$2 ;;
    --log) log=$2 ;;
    *) echo "unknown argument $1 (see the comment at the top of $0)" >&2; exit 2 ;;
  esac
  shift 2
done
# shellcheck source=bench/environment.sh
source "$repo/bench/environment.sh"
compressions=${BENCH_PREP_COMPRESSIONS:-none zstd}

work=$(mktemp -d /tmp/prep_bench.XXXXXX)
trap 'rm -rf "$work"' EXIT
log=${log:-$work/prep.log}
say() { echo "[prep] $*" >&2; }

# A corpus of `mb` MB of jsonl: fortunes (English and Chinese, from Debian's packages), drawn with
# a fixed seed, each with a number that makes it a document of its own.
make_corpus() {
  local mb=$1 out=$2
  "$python" - "$mb" "$out" <<'EOF'
import glob, json, random, sys
mb, out = int(sys.argv[1]), sys.argv[2]
documents = []
for path in sorted(glob.glob("/usr/share/games/fortunes/*")):
    if path.endswith((".dat", ".u8")):
        continue
    try:
        text = open(path, encoding="utf-8", errors="replace").read()
    except IsADirectoryError:
        continue
    documents += [d.strip() for d in text.split("\n%\n") if d.strip()]
rng = random.Random(1337)
written, n = 0, 0
with open(out, "w") as f:
    while written < mb * 1_000_000:
        line = json.dumps({"text": f"{rng.choice(documents)} ({n})"}, ensure_ascii=False) + "\n"
        f.write(line)
        written += len(line.encode())
        n += 1
EOF
}

# Runs a command under /usr/bin/time -v; prints "seconds peak_rss_kb".
timed() {
  local report=$work/time.txt
  /usr/bin/time -v -o "$report" "$@" >>"$log" 2>&1
  local wall rss
  wall=$(sed -n 's/.*Elapsed (wall clock) time (h:mm:ss or m:ss): //p' "$report" |
    awk -F: '{ s = 0; for (i = 1; i <= NF; ++i) s = s * 60 + $i; print s }')
  rss=$(sed -n 's/.*Maximum resident set size (kbytes): //p' "$report")
  echo "$wall $rss"
}

# The tokens in a directory's shards, from their headers.
count_tokens() {
  "$python" -c 'import glob, sys, numpy as np
print(sum(int(np.fromfile(p, dtype=np.int32, count=3)[2]) for p in glob.glob(sys.argv[1] + "/*.bin")))' "$1"
}

same_shards() {
  local a=$1 b=$2 file
  for file in "$b"/*.bin; do cmp -s "$file" "$a/$(basename "$file")" || { echo no; return; }; done
  [[ $(ls "$a"/*.bin | wc -l) == $(ls "$b"/*.bin | wc -l) ]] && echo yes || echo no
}

largest=$(tr ' ' '\n' <<<"$sizes" | sort -n | tail -1)
rows=()
rss_rows=()
for mb in $sizes; do
  corpus=$work/corpus_$mb.jsonl
  say "generating a $mb MB jsonl corpus"
  make_corpus "$mb" "$corpus"
  [[ " $compressions " == *" zstd "* ]] && zstd -q -T0 -f "$corpus" -o "$corpus.zstd"
  [[ " $compressions " == *" gzip "* ]] && gzip -k -f -c "$corpus" >"$corpus.gzip"
  if [[ ! -f $work/tokenizer/tokenizer.model ]]; then
    say "training the tokenizer both use (mlprep, 4096 pieces)"
    "$bin_dir/mlprep" --input "$corpus" --format jsonl --vocab-size 4096 --tokenizer-sample-mb 50 \
      --out "$work/tokenizer" >>"$log" 2>&1
  fi
  [[ $mb == "$largest" ]] && bytes=$(stat -c %s "$corpus")
  for compression in $compressions; do
    input=$corpus
    [[ $compression != none ]] && input=$corpus.$compression
    for threads in $thread_counts; do
      [[ $mb != "$largest" && $threads != "${thread_counts##* }" ]] && continue
      for ((rep = 1; rep <= reps; ++rep)); do
        rm -rf "$work/mlprep" "$work/reference"
        say "$mb MB, $compression, $threads thread(s), repetition $rep: mlprep"
        read -r ours_s ours_rss < <(timed "$bin_dir/mlprep" --input "$input" --format jsonl \
          --tokenizer "$work/tokenizer/tokenizer.model" --val-fraction 0 --threads "$threads" \
          --out "$work/mlprep")
        rss_rows+=("| $mb | $compression | $threads | $(awk -v k="$ours_rss" 'BEGIN { printf "%.0f", k / 1024 }') |")
        [[ $mb != "$largest" ]] && continue
        say "$mb MB, $compression, $threads thread(s), repetition $rep: reference"
        read -r ref_s ref_rss < <(timed "$python" "$repo/bench/reference_prep.py" --input "$input" \
          --tokenizer "$work/tokenizer/tokenizer.model" --threads "$threads" --out "$work/reference")
        tokens=$(count_tokens "$work/mlprep")
        same=$(same_shards "$work/mlprep" "$work/reference")
        rows+=("$compression $threads $ours_s $ours_rss $ref_s $ref_rss $tokens $same")
      done
    done
  done
done

"$python" - "$largest" "$bytes" "${rows[@]}" <<'EOF'
import statistics, sys
mb, jsonl_bytes = sys.argv[1], int(sys.argv[2])
runs = {}
for row in sys.argv[3:]:
    compression, threads, ours, ours_rss, ref, ref_rss, tokens, same = row.split()
    runs.setdefault((compression, int(threads)), []).append(
        (float(ours), int(ours_rss), float(ref), int(ref_rss), int(tokens), same))
print(f"\n### Corpus preparation: {mb} MB of jsonl, {jsonl_bytes / 1e6:,.0f} MB\n")
print("| input | threads | mlprep s | mlprep MB/s | mlprep Mtokens/s | mlprep peak RSS MiB | "
      "reference s | reference MB/s | reference peak RSS MiB | mlprep / reference | same shards |")
print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
for (compression, threads), values in sorted(runs.items()):
    ours = statistics.median(v[0] for v in values)
    ref = statistics.median(v[2] for v in values)
    tokens = values[0][4]
    print(f"| {compression} | {threads} | {ours:.1f} | {jsonl_bytes / 1e6 / ours:.1f} | "
          f"{tokens / 1e6 / ours:.2f} | {max(v[1] for v in values) / 1024:.0f} | {ref:.1f} | "
          f"{jsonl_bytes / 1e6 / ref:.1f} | {max(v[3] for v in values) / 1024:.0f} | "
          f"{ref / ours:.2f}x | {'yes' if all(v[5] == 'yes' for v in values) else 'NO'} |")
print("\nMB/s counts the uncompressed jsonl; the tokenizer (4096 pieces, trained once by mlprep) is "
      "given to both, so neither trains one; both write every document to train shards in order.")
EOF
echo
echo "mlprep's peak RSS at each corpus size (the tokenizer given, so this is the streaming alone):"
echo
echo "| corpus MB | input | threads | peak RSS MiB |"
echo "| ---: | --- | ---: | ---: |"
printf '%s\n' "${rss_rows[@]}"
