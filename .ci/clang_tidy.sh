#!/usr/bin/env bash
# Runs clang-tidy (.clang-tidy: bugprone-*, performance-*, cognitive complexity over 25) over the
# project's sources, tests excepted (they double the time and find little). The precompiled
# header is GCC's and clang cannot read it, so this configures a tree without it
# (MLTRAIN_PCH=OFF) for its compile_commands.json; nothing is built. Prints the findings, then
# every function over the complexity threshold, and exits 1 if there is any finding.
# Arguments, if any, are the source files to check instead of all of them.
# Environment: MLTRAIN_TIDY_DIR (the tree, default build/clang-tidy), JOBS (default nproc).
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"
tree=${MLTRAIN_TIDY_DIR:-$repo/build/clang-tidy}
mkdir -p "$tree"
cmake -S . -B "$tree" -G Ninja -DMLTRAIN_PCH=OFF -DBUILD_TESTING=OFF \
  -DMLTRAIN_PYTHON="${MLTRAIN_HOME:-$HOME/.cache/mltrain}/venv/bin/python" >"$tree/configure.log" 2>&1 \
  || { cat "$tree/configure.log"; exit 1; }

if (($# > 0)); then
  sources=("$@")
else
  mapfile -t sources < <(git ls-files --cached --others --exclude-standard \
                           'common/*.cpp' 'model/*.cpp' 'data/*.cpp' 'dist/*.cpp' 'trainer/*.cpp' 'launch/*.cpp' \
                           | sort -u | while read -r f; do [[ -f $f ]] && echo "$f"; done)
fi

# One output file per source, so that parallel runs do not interleave their lines.
out=$tree/tidy
rm -rf "$out" && mkdir -p "$out"
export tree out repo
tidy_one() {
  # The .clang-tidy filter would also match LibTorch's torch/data/*.h; anchor it to this tree.
  clang-tidy -p "$tree" --quiet --header-filter="^$repo/(common|model|data|dist|trainer|launch)/" "$1" \
    >"$out/${1//\//_}.txt" 2>/dev/null || true
}
export -f tidy_one
printf '%s\n' "${sources[@]}" | xargs -P "${JOBS:-$(nproc)}" -I{} bash -c 'tidy_one "$1"' _ {}

# A header included by several sources reports its findings once per source: keep the first.
report=$tree/findings.txt
cat "$out"/*.txt | awk '/^[^ ].*: (warning|error): / { seen_it = seen[$0]++ } !seen_it' >"$report"
count=$(grep -cE ': (warning|error): ' "$report" || true)
echo "clang-tidy: ${#sources[@]} files in ${SECONDS}s, $count finding(s)"
((count > 0)) || exit 0
cat "$report"
echo "functions over the cognitive complexity threshold:"
grep -oE "^[^ ]+: warning: function '[^']+' has cognitive complexity of [0-9]+" "$report" \
  | sed -E "s/^([^ ]+): warning: function '([^']+)' has cognitive complexity of ([0-9]+)/  \3  \2  \1/" \
  | sort -rn || echo "  none"
exit 1
