# ccache keeps its cache outside the checkout (its default, ~/.cache/ccache). With paths taken
# relative to the checkout and the working directory left out of the hash, a fresh clone in another
# folder (CI) hits the cache too. The sloppiness lets ccache cache translation units that use the
# precompiled torch header.
find_program(CCACHE_PROGRAM ccache)
if(CCACHE_PROGRAM)
  set(CMAKE_CXX_COMPILER_LAUNCHER
      ${CMAKE_COMMAND} -E env
      CCACHE_BASEDIR=${CMAKE_SOURCE_DIR} CCACHE_NOHASHDIR=1
      CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime
      ${CCACHE_PROGRAM})
  # nvcc too (model/kernels/cuda_launch.cu), with the same settings.
  set(CMAKE_CUDA_COMPILER_LAUNCHER ${CMAKE_CXX_COMPILER_LAUNCHER})
  message(STATUS "ccache: ${CCACHE_PROGRAM}")
endif()
