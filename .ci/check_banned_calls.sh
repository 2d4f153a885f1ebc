#!/usr/bin/env bash
# Calls the project's C++ may not make, each with the reason and what to call instead. Prints each
# use as file:line and exits 1; exits 0 when there is none.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# pattern (extended regex) %% files it applies to (extended regex) %% why, and what to use
product='^(common|data|dist|model|trainer|launch)/'
banned=(
  '\bremove_all[[:space:]]*\(%%.%%libtorch.so exports a copy that segfaults where the system libstdc++ lacks what it calls weakly (common/file_tree.h): use remove_tree'
  'std::ifstream|YAML::LoadFile|(\.|->)Load[[:space:]]*\(%%'"$product"'%%opens whatever a path names, and a named pipe blocks it for ever: read a given file through common/input_file.h (InputFile, read_text_file)'
)

mapfile -t files < <(git ls-files --cached --others --exclude-standard '*.h' '*.cpp' '*.cu' \
                       | sort -u | while read -r f; do [[ -f $f ]] && echo "$f"; done)
violations=0
for rule in "${banned[@]}"; do
  pattern=${rule%%'%%'*}
  rest=${rule#*'%%'}
  scope=${rest%%'%%'*}
  reason=${rest#*'%%'}
  mapfile -t scoped < <(printf '%s\n' "${files[@]}" | grep -E "$scope" | grep -v '^common/file_tree\.h$' || true)
  ((${#scoped[@]} > 0)) || continue
  while IFS= read -r hit; do
    [[ -n $hit ]] || continue
    printf '%s: %s\n' "$(cut -d: -f1,2 <<<"$hit")" "$reason"
    violations=$((violations + 1))
  done < <(grep -nE "$pattern" "${scoped[@]}" /dev/null || true)
done

if ((violations > 0)); then
  printf 'banned calls: %d use(s)\n' "$violations"
  exit 1
fi
echo "banned calls: none"
