#!/usr/bin/env bash
# Runs a command as on a machine without a CUDA toolkit, which is what a fresh machine is:
#   bash tests/launch/without_cuda_toolkit.sh COMMAND [ARGUMENT...]
# It runs in a mount namespace of its own (root, unshare) in which every toolkit directory
# (/usr/local/cuda*, /opt/cuda*) is an empty tmpfs, as are /usr/local/include and /usr/local/lib
# where they hold CUDA's headers or runtime, and nvcc and its tools in /usr/local/bin are empty
# files. Before the command runs it checks that no nvcc is there and that the compiler finds no
# cuda_runtime.h; if either is still there it exits 1. The machine outside is not touched.
set -euo pipefail

# The mounts below are made only in a mount namespace of this script's own, never in its caller's:
# the script always runs itself again under unshare (which execs, so the caller stays the parent),
# and that second stage mounts only where its namespace differs from the caller's.
if [[ ${1:-} != --in-own-namespace ]]; then
  exec unshare --mount --propagation private bash "$0" --in-own-namespace "$@"
fi
shift
own=$(readlink /proc/self/ns/mnt)
callers=$(readlink "/proc/$PPID/ns/mnt" || true)
if [[ -z $own || -z $callers || $own == "$callers" ]]; then
  echo "without_cuda_toolkit.sh: not in a mount namespace of its own; nothing was hidden" >&2
  exit 1
fi

shopt -s nullglob
# A link (/usr/local/cuda) is hidden where it leads, wherever that is.
for dir in /usr/local/cuda* /opt/cuda*; do
  if [[ -d $dir ]]; then mount -t tmpfs none "$(realpath "$dir")"; fi
done
for dir in /usr/local/include /usr/local/lib; do
  pieces=("$dir"/cuda*.h "$dir"/libcudart*)
  if ((${#pieces[@]} > 0)); then mount -t tmpfs none "$dir"; fi
done
for tool in nvcc ptxas nvlink fatbinary cudafe++ bin2c __nvcc_device_query cuobjdump nvdisasm; do
  if [[ -e /usr/local/bin/$tool ]]; then mount --bind /dev/null "/usr/local/bin/$tool"; fi
done
PATH=$(tr ':' '\n' <<<"$PATH" | grep -v -i cuda | paste -sd:)
export PATH

if nvcc --version >/dev/null 2>&1 || [[ -e /usr/local/cuda/bin/nvcc ]]; then
  echo "without_cuda_toolkit.sh: an nvcc is still there: $(command -v nvcc || echo /usr/local/cuda/bin/nvcc)" >&2
  exit 1
fi
if echo '#include <cuda_runtime.h>' | g++ -x c++ -fsyntax-only - >/dev/null 2>&1; then
  echo "without_cuda_toolkit.sh: the compiler still finds cuda_runtime.h" >&2
  exit 1
fi
exec "$@"
