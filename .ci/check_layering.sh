#!/usr/bin/env bash
# The include arrows of ARCHITECTURE.md, checked: model/, data/ and dist/ include (of the project's
# folders) only common/ and themselves; trainer/ includes neither launch/, tests/ nor bench/.
# Inside trainer/ the sub-folders point down too: config/ includes no other; machine/, optim/ and
# report/ include only config/; checkpoint/ adds optim/; run/ may include them all. Inside model/
# likewise: kernels/ includes no other; layers/ only kernels/; interop/ and generation/ not each
# other.
# Prints each include that breaks them as file:line and exits 1; exits 0 when they all hold.
# Only #include "folder/..." of a project folder counts, so third-party quoted includes pass.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

project_folders='common|model|data|dist|trainer|launch|tests|bench'
violations=0

# check FOLDER FORBIDDEN...: no file of FOLDER may include a header of a FORBIDDEN folder.
check() {
  local folder=$1
  shift
  local forbidden
  forbidden=$(IFS='|'; echo "$*")
  local files hits hit
  # Tracked files and new ones not yet added, so that the check runs before a commit too.
  mapfile -t files < <(git ls-files --cached --others --exclude-standard \
                         "$folder/*.h" "$folder/*.cpp" "$folder/*.cu" \
                         | sort -u | while read -r f; do [[ -f $f ]] && echo "$f"; done)
  ((${#files[@]} > 0)) || return 0
  hits=$(grep -nE "^[[:space:]]*#[[:space:]]*include[[:space:]]+\"($forbidden)/" "${files[@]}" /dev/null || true)
  [[ -n $hits ]] || return 0
  while IFS= read -r hit; do
    printf '%s: %s/ may not include %s\n' "$(cut -d: -f1,2 <<<"$hit")" "$folder" \
      "$(sed -E 's/[^"]*"([^"]+)".*/\1/' <<<"$hit")"
    violations=$((violations + 1))
  done <<<"$hits"
}

others() {  # the project folders other than common/ and $1
  tr '|' '\n' <<<"$project_folders" | grep -vx -e common -e "$1"
}

for folder in model data dist; do
  mapfile -t forbidden < <(others "$folder")
  check "$folder" "${forbidden[@]}"
done
check trainer launch tests bench
# Each trainer/ sub-folder may not include the ones listed after it.
check trainer/config trainer/machine trainer/optim trainer/report trainer/checkpoint trainer/run
check trainer/machine trainer/optim trainer/report trainer/checkpoint trainer/run
check trainer/optim trainer/machine trainer/report trainer/checkpoint trainer/run
check trainer/report trainer/machine trainer/optim trainer/checkpoint trainer/run
check trainer/checkpoint trainer/machine trainer/report trainer/run
check model/kernels model/layers model/interop model/generation
check model/layers model/interop model/generation
check model/interop model/generation
check model/generation model/interop

if ((violations > 0)); then
  printf 'layering: %d include(s) break the arrows of ARCHITECTURE.md\n' "$violations"
  exit 1
fi
echo "layering: model/, data/, dist/ include only common/ and themselves;" \
  "trainer/ no launch/, tests/, bench/; the sub-folders of trainer/ and model/ point down"
