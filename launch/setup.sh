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

install_debian_packages
install_python_packages
say "ready: LibTorch $("$venv/bin/python" -c 'import torch; print(torch.__version__)') from $venv"
