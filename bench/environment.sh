# Sourced by the bench/ scripts, after they set $repo: the Python with torch ($python, the project's
# venv, else python3; MLTRAIN_PYTHON), mltrain's binaries ($bin_dir; MLTRAIN_BIN_DIR) and the shards
# mltrain trains on ($data: bench/gpu-packages/shards, else data/demo; BENCH_DATA).
python=${MLTRAIN_HOME:-$HOME/.cache/mltrain}/venv/bin/python
[[ -x $python ]] || python=$(command -v python3)
python=${MLTRAIN_PYTHON:-$python}
bin_dir=${MLTRAIN_BIN_DIR:-$repo/build/bin}
data=$repo/bench/gpu-packages/shards
[[ -d $data ]] || data=$repo/data/demo
data=${BENCH_DATA:-$data}
