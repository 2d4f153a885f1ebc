#!/usr/bin/env bash
# Prepares, here on Debian 12 with the network, what bench/gpu.sh needs on a GPU machine that has
# the driver, torch, CMake, ninja and nvcc but none of our Debian libraries, no mpirun and no
# network: the Debian packages the build, the tests and mpirun need, unpacked into
# bench/gpu-packages/root/ (a tree relocated by environment variables, not installed), and the
# demo corpus prepared into bench/gpu-packages/shards/. Both are ignored by git and travel to the
# GPU machine as one carried path. A second run unpacks anew from the cached .debs.
#   MLPREP          the mlprep binary that prepares the corpus (default build/bin/mlprep)
#   MLTRAIN_HOME    where the downloaded .debs are cached, in gpu-debs/ (default ~/.cache/mltrain)
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out=$repo/bench/gpu-packages
root=$out/root
debs=${MLTRAIN_HOME:-$HOME/.cache/mltrain}/gpu-debs
mlprep=${MLPREP:-$repo/build/bin/mlprep}
multiarch=usr/lib/x86_64-linux-gnu

# Read off `readelf -d` of each library and program below: these are what the build links and what
# mpirun, libmpi and our binaries load, except the C and C++ runtimes every machine has.
packages=(
  # headers, CMake package configs, pkg-config files and the .so links the build links against
  libopenmpi-dev libyaml-cpp-dev libspdlog-dev libfmt-dev nlohmann-json3-dev libcli11-dev
  libgtest-dev libsentencepiece-dev libxxhash-dev libgloo-dev
  # zlib's and libzstd's headers and static archives (data/CMakeLists.txt links the archives)
  zlib1g-dev libzstd-dev
  # pkg-config, which CMake needs to find SentencePiece
  pkgconf pkgconf-bin libpkgconf3
  # mpirun, its help texts and default MCA parameters
  openmpi-bin openmpi-common
  # the shared libraries, and theirs
  libopenmpi3 libpmix2 libhwloc15 libevent-core-2.1-7 libevent-pthreads-2.1-7 libmunge2 libudev1
  libyaml-cpp0.7 libspdlog1.10 libfmt9 libsentencepiece0 libxxhash0
)

# Sonames every machine with glibc and a C++ compiler has: never carried, since an older carried
# copy would shadow the machine's own for every program started under our LD_LIBRARY_PATH.
base_sonames='^(libc|libm|libdl|libpthread|librt|libutil|libresolv|ld-linux-x86-64'
base_sonames+='|libstdc\+\+|libgcc_s|libz)\.so'

# What must be there afterwards; everything else may be pruned.
required=(
  usr/bin/orterun usr/bin/orted usr/bin/opal_wrapper usr/bin/pkgconf
  "$multiarch/libmpi.so.40" "$multiarch/libmpi_cxx.so.40" "$multiarch/pmix2/lib/libpmix.so.2"
  "$multiarch/libyaml-cpp.so.0.7" "$multiarch/libspdlog.so.1.10" "$multiarch/libfmt.so.9"
  "$multiarch/libsentencepiece.so.0" "$multiarch/libxxhash.so.0" "$multiarch/libgtest.a"
  "$multiarch/openmpi/lib/openmpi3/mca_btl_vader.so" "$multiarch/openmpi/lib/openmpi3/mca_pml_ob1.so"
  "$multiarch/openmpi/lib/openmpi3/mca_pmix_ext3x.so" usr/include/yaml-cpp/yaml.h
  usr/include/zlib.h usr/include/zstd.h "$multiarch/libz.a" "$multiarch/libzstd.a"
)

say() { printf '[fetch_gpu_packages] %s\n' "$*"; }

download() {
  mkdir -p "$debs"
  local pkg missing=()
  for pkg in "${packages[@]}"; do
    compgen -G "$debs/${pkg}_*.deb" >/dev/null || missing+=("$pkg")
  done
  if ((${#missing[@]} > 0)); then
    say "downloading ${missing[*]} into $debs"
    # As root apt downloads as its own user, who may not write into $debs: it need not.
    (cd "$debs" && apt-get download -qq -o APT::Sandbox::User=root "${missing[@]}")
  fi
}

unpack() {
  rm -rf "$root"
  mkdir -p "$root"
  local pkg deb
  for pkg in "${packages[@]}"; do
    for deb in "$debs/${pkg}"_*.deb; do dpkg-deb -x "$deb" "$root"; done
  done
}

# update-alternatives makes these names on an installed system (libmpi.so comes as a link into
# /etc/alternatives); a bare unpack has only the .openmpi ones. opal_wrapper reads its flags from
# <name>-wrapper-data.txt, hence mpicxx.
link_alternatives() {
  local bin=$root/usr/bin
  ln -sfn orterun "$bin/mpirun"
  ln -sfn orterun "$bin/mpiexec"
  ln -sfn opal_wrapper "$bin/mpicxx"
  ln -sfn openmpi/lib/libmpi.so "$root/$multiarch/libmpi.so"
}

# Docs, manuals, sources, Java, Fortran, OpenSHMEM and Open MPI's internal headers (mpi.h needs
# only the C++ bindings'); static archives where a shared library exists (GoogleTest ships only
# archives; zlib's and libzstd's are what the build links).
strip_unused() {
  local mpi_include=$root/$multiarch/openmpi/include/openmpi
  rm -rf "$root"/usr/share/{doc,doc-base,man,info,lintian,bug} "$root/usr/src" "$root/$multiarch/fortran"
  rm -rf "$mpi_include"/{opal,orte}
  find "$mpi_include/ompi" -mindepth 1 -maxdepth 1 ! -name mpi -exec rm -rf {} +
  find "$mpi_include/ompi/mpi" -mindepth 1 -maxdepth 1 ! -name cxx -exec rm -rf {} +
  find "$root" \( -name '*java*' -o -name '*mpifh*' -o -name '*usempi*' -o -name '*oshmem*' \
    -o -name 'mca_spml_*' -o -name 'mca_sshmem_*' -o -name 'mca_memheap_*' -o -name 'mca_scoll_*' \
    -o -name 'mca_atomic_*' -o -name 'shmem*' -o -name 'pshmem*' -o -name 'osh*' -o -name 'mpif*' \) \
    -prune -exec rm -rf {} +
  find "$root" -name '*.a' ! -name 'libgtest*.a' ! -name libz.a ! -name libzstd.a -delete
}

elf_files() {
  find "$root" -type f \( -name '*.so*' -o -path '*/bin/*' \) \
    -exec sh -c 'head -c4 "$1" | grep -q ELF' _ {} \; -print
}
needed_sonames() { readelf -d "$1" 2>/dev/null | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'; }

# The sonames a file needs that neither the tree nor a base system provides.
unresolved() {
  local soname
  for soname in $(needed_sonames "$1"); do
    [[ $soname =~ $base_sonames ]] && continue
    [[ -n $(find "$root" -name "$soname" -print -quit) ]] || printf '%s ' "$soname"
  done
}

# MCA components for InfiniBand, libfabric, UCX and PSM need libraries a one-node run never uses:
# they go, rather than the libraries coming along. Repeated, since a removed library can strand
# the components that use it.
prune_unresolvable() {
  local pruned=1 file missing
  while ((pruned)); do
    pruned=0
    while read -r file; do
      missing=$(unresolved "$file")
      [[ -z $missing ]] && continue
      rm -f "$file"
      pruned=1
      say "pruned ${file#"$root"/} (needs $missing)"
    done < <(elf_files)
  done
  find "$root" -xtype l -delete  # the links to what went
}

check_required() {
  local path ok=1
  for path in "${required[@]}"; do
    [[ -e $root/$path ]] || { say "missing after pruning: $path"; ok=0; }
  done
  ((ok)) || exit 1
}

prepare_shards() {
  if [[ -f $out/shards/tokenizer.model ]]; then
    say "shards: $out/shards already prepared (remove it to prepare anew)"
    return
  fi
  [[ -x $mlprep ]] || { say "no mlprep at $mlprep: build mltrain first or set MLPREP"; exit 1; }
  local fortunes
  mapfile -t fortunes < <(find /usr/share/games/fortunes -maxdepth 1 -type f ! -name '*.dat' | sort)
  ((${#fortunes[@]} > 0)) || { say "no fortunes in /usr/share/games/fortunes: run launch/setup.sh"; exit 1; }
  "$mlprep" --input "${fortunes[@]}" --format fortune --vocab-size 4096 --out "$out/shards"
}

download
unpack
link_alternatives
strip_unused
prune_unresolvable
check_required
prepare_shards
glibc=$(elf_files | xargs -r objdump -T 2>/dev/null | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -1)
say "highest glibc symbol version needed: $glibc"
bytes() { du -sb "$1" | cut -f1; }
say "$(bytes "$out") bytes in $out ($(bytes "$root") packages, $(bytes "$out/shards") shards)"
