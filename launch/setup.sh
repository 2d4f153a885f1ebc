#!/usr/bin/env bash
# Installs everything mltrain needs to build and run, idempotently: the Debian packages and a
# virtualenv holding the pinned torch wheel (whose LibTorch we link against). A second run checks
# and returns in about a second. The virtualenv lives outside the checkout, in $MLTRAIN_HOME
# (default ~/.cache/mltrain), so fresh clones (CI) reuse it.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
mltrain_home=${MLTRAIN_HOME:-$HOME/.cache/mltrain}
venv=$mltrain_home/venv
requirements=$repo/launch/requirements.txt

debian_packages=(
  # build
  build-essential cmake ninja-build ccache git
  # the house rules: .ci/check_format.sh and .ci/clang_tidy.sh
  clang-format clang-tidy
  # libraries
  libopenmpi-dev openmpi-bin libyaml-cpp-dev libspdlog-dev libfmt-dev libgtest-dev libgmock-dev
  libsentencepiece-dev sentencepiece nlohmann-json3-dev libxxhash-dev libcli11-dev
  # Gloo's headers, which c10d's ProcessGroupGloo.hpp includes (the torch wheel has its code)
  libgloo-dev
  # mlprep's compressed inputs, and the command-line tools its tests compress with
  zlib1g-dev libzstd-dev gzip zstd
  # the Python that hosts the torch wheel
  python3 python3-venv
  # real text for the bundled demo corpus and the data tests: English and Chinese fortunes
  fortunes fortunes-zh
  # the loss curve
  gnuplot-nox
)

say() { printf '[setup] %s\n' "$*"; }

missing_debian_packages() {
  local pkg
  for pkg in "${debian_packages[@]}"; do
    dpkg-query -W -f='${Status}\n' "$pkg" 2>/dev/null | grep -q '^install ok installed$' || printf '%s\n' "$pkg"
  done
}

install_debian_packages() {
  local missing
  mapfile -t missing < <(missing_debian_packages)
  if ((${#missing[@]} == 0)); then
    say "Debian packages: all ${#debian_packages[@]} present"
    return
  fi
  local sudo=""
  [[ $(id -u) -eq 0 ]] || sudo="sudo"
  say "Debian packages: installing ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
}

# The stamp records the requirements the virtualenv was built from; a changed pin rebuilds it.
install_python_packages() {
  local stamp=$venv/.mltrain-requirements
  if [[ -x $venv/bin/python ]] && cmp -s "$requirements" "$stamp"; then
    say "Python packages: $venv matches launch/requirements.txt"
    return
  fi
  say "Python packages: installing $(grep -v '^#' "$requirements" | xargs) into $venv (a few GB, once)"
  mkdir -p "$mltrain_home"
  [[ -x $venv/bin/python ]] || python3 -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --progress-bar off --disable-pip-version-check -r "$requirements"
  cp "$requirements" "$stamp"
}

# The CUDA toolkit the build compiles and links against: the compiler pieces (nvcc, NVVM, the CUDA
# C++ headers) at the exact cuda-toolkit version that the torch wheel requires for its own runtime
# libraries, laid out with those libraries as a toolkit in $venv/cuda, where CMake looks first.
# Every machine builds with the same toolkit, pinned with the wheel, whatever CUDA it has installed
# (or none: a GPU machine needs only the driver). A CPU-only wheel needs none.
install_cuda_toolkit() {
  local version toolkit=$venv/cuda
  version=$("$venv/bin/python" -c 'import importlib.metadata, re
for requirement in importlib.metadata.requires("torch") or []:
    pin = re.match(r"cuda-toolkit(\[[^]]*\])?==([0-9.]+)", requirement)
    if pin:
        print(pin.group(2))')
  if [[ -z $version ]]; then
    say "CUDA toolkit: none needed (a CPU-only torch wheel)"
    return
  fi
  if [[ -x $toolkit/bin/nvcc ]] && [[ $(cat "$toolkit/.mltrain-cuda-toolkit" 2>/dev/null) == "$version" ]]; then
    say "CUDA toolkit: $toolkit ($version, pinned with the torch wheel)"
    return
  fi
  say "CUDA toolkit: installing cuda-toolkit $version's compiler into $venv (about 250 MB, once)"
  "$venv/bin/python" -m pip install --quiet --progress-bar off --disable-pip-version-check \
    "cuda-toolkit[nvcc,nvvm,crt,cccl]==$version"
  # The wheels unpack into one tree, site-packages/nvidia/cuNN, which lacks two things of a toolkit
  # that nvcc and CMake look for: lib64/ and the libraries' unversioned names.
  local wheel_tree
  wheel_tree=$("$venv/bin/python" -c 'import pathlib, sysconfig, torch
print(pathlib.Path(sysconfig.get_paths()["purelib"]) / "nvidia" / ("cu" + torch.version.cuda.split(".")[0]))')
  rm -rf "$toolkit.new"
  mkdir -p "$toolkit.new/bin" "$toolkit.new/lib64"
  ln -s "$wheel_tree/include" "$toolkit.new/include"
  ln -s "$wheel_tree/nvvm" "$toolkit.new/nvvm"
  local file name
  shopt -s nullglob
  for file in "$wheel_tree"/bin/*; do ln -s "$file" "$toolkit.new/bin/"; done
  for file in "$wheel_tree"/lib/*; do
    ln -s "$file" "$toolkit.new/lib64/"
    name=$(basename "$file")
    if [[ $name == *.so.* ]] && [[ ! -e $toolkit.new/lib64/${name%%.so.*}.so ]]; then
      ln -s "$name" "$toolkit.new/lib64/${name%%.so.*}.so"
    fi
  done
  echo "$version" >"$toolkit.new/.mltrain-cuda-toolkit"
  rm -rf "$toolkit"
  mv "$toolkit.new" "$toolkit"
  say "CUDA toolkit: $toolkit ($("$toolkit/bin/nvcc" --version | tail -1))"
}

install_debian_packages
install_python_packages
install_cuda_toolkit
say "ready: LibTorch $("$venv/bin/python" -c 'import torch; print(torch.__version__)') from $venv"
