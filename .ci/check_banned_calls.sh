#!/usr/bin/env bash
# Calls the project's C++ may not make, each with the reason and what to call instead. Prints each
# use as file:line and exits 1; exits 0 when there is none.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# pattern (extended regex) | why, and what to use
banned=(
  '\bremove_all[[:space:]]*\(|libtorch.so exports a copy that segfaults where the system libstdc++ lacks what it calls weakly (common/file_tree.h): use remove_tree'
)

mapfile -t files < <(git ls-files --cached --others --exclude-standard '*.h' '*.cpp' \
                       | sort -u | while read -r f; do [[ -f $f ]] && echo "$f"; done)
violations=0
for rule in "${banned[@]}"; do
  pattern=${rule%%|*}
  reason=${rule#*|}
  while IFS= read -r hit; do
    [[ -n $hit ]] || continue
    printf '%s: %s\n' "$(cut -d: -f1,2 <<<"$hit")" "$reason"
    violations=$((violations + 1))
  done < <(grep -nE "$pattern" "${files[@]}" /dev/null | grep -v '^common/file_tree\.h:' || true)
done

if ((violations > 0)); then
  printf 'banned calls: %d use(s)\n' "$violations"
  exit 1
fi
echo "banned calls: none"
