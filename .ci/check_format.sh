#!/usr/bin/env bash
# Checks that every C++ and CUDA file of the project (tracked, or new and not ignored, so that it
# also runs before a commit) is formatted as .clang-format says. Prints the files that are not (fix
# them with `clang-format -i FILE`) and exits 1 if there is any.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

mapfile -t files < <(git ls-files --cached --others --exclude-standard '*.h' '*.cpp' '*.cu' \
                       | sort -u | while read -r f; do [[ -f $f ]] && echo "$f"; done)
unformatted=()
for file in "${files[@]}"; do
  clang-format --dry-run --Werror "$file" >/dev/null 2>&1 || unformatted+=("$file")
done
if ((${#unformatted[@]} > 0)); then
  echo "not formatted as .clang-format says (clang-format -i FILE):"
  printf '  %s\n' "${unformatted[@]}"
  echo "format: ${#unformatted[@]} of ${#files[@]} files to reformat"
  exit 1
fi
echo "format: ${#files[@]} files as .clang-format says"
