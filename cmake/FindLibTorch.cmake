# LibTorch comes from the pinned torch wheel in the virtualenv that launch/setup.sh creates. The
# wheel is a CUDA build: its CMake config enables CUDA against a toolkit whose major version must
# match the wheel's. A GPU is not needed to build or to run on the CPU.
if(DEFINED ENV{MLTRAIN_HOME})
  set(_mltrain_home "$ENV{MLTRAIN_HOME}")
else()
  set(_mltrain_home "$ENV{HOME}/.cache/mltrain")
endif()
set(MLTRAIN_PYTHON "${_mltrain_home}/venv/bin/python" CACHE FILEPATH
    "Python of the virtualenv holding the torch wheel (made by launch/setup.sh)")
if(NOT EXISTS "${MLTRAIN_PYTHON}")
  message(FATAL_ERROR "No Python at MLTRAIN_PYTHON=${MLTRAIN_PYTHON}: run launch/setup.sh first")
endif()

execute_process(
  COMMAND "${MLTRAIN_PYTHON}" -c
          "import sys, torch, torch.utils; print(torch.utils.cmake_prefix_path); print(torch.__version__); print(torch.version.cuda or ''); print(sys.prefix)"
  OUTPUT_VARIABLE _torch_info OUTPUT_STRIP_TRAILING_WHITESPACE
  RESULT_VARIABLE _torch_result)
if(NOT _torch_result EQUAL 0)
  message(FATAL_ERROR "${MLTRAIN_PYTHON} cannot import torch: run launch/setup.sh")
endif()
string(REPLACE "\n" ";" _torch_info "${_torch_info}")
list(GET _torch_info 0 _torch_prefix)
list(GET _torch_info 1 MLTRAIN_TORCH_VERSION)
list(GET _torch_info 2 _torch_cuda)
list(GET _torch_info 3 _python_prefix)

if(_torch_cuda)
  # The toolkit: the one whose nvcc is given as CMAKE_CUDA_COMPILER; else the one launch/setup.sh
  # lays out in the virtualenv, pinned with the wheel; else /usr/local/cuda.
  if(NOT CMAKE_CUDA_COMPILER)
    foreach(_toolkit "${_python_prefix}/cuda" /usr/local/cuda)
      if(EXISTS "${_toolkit}/bin/nvcc")
        set(CMAKE_CUDA_COMPILER "${_toolkit}/bin/nvcc")
        # Torch's config finds the toolkit twice (FindCUDA, then FindCUDAToolkit): both from here.
        set(CUDA_TOOLKIT_ROOT_DIR "${_toolkit}")
        set(CUDAToolkit_ROOT "${_toolkit}")
        break()
      endif()
    endforeach()
    if(NOT CMAKE_CUDA_COMPILER)
      message(FATAL_ERROR "torch ${MLTRAIN_TORCH_VERSION} is a CUDA ${_torch_cuda} build and no CUDA toolkit was "
                          "found in ${_python_prefix}/cuda or /usr/local/cuda: run launch/setup.sh, which "
                          "installs the one pinned with the wheel, or name one with -DCMAKE_CUDA_COMPILER=")
    endif()
  endif()
  # Naming the architectures spares torch's config probing for a GPU (there is none on build
  # machines), and CMake 3.25 knows no CUDA dialect past C++17. Torch's config turns the list into
  # the -gencode flags of every CUDA source (and CMAKE_CUDA_ARCHITECTURES off): mltrain's own
  # kernels (model/kernels/cuda_launch.cu) are machine code for Ampere and Hopper, and PTX that
  # newer GPUs compile when they load it. They link the CUDA runtime LibTorch loads (shared), so
  # that they launch on the streams it makes.
  set(CMAKE_CUDA_STANDARD 17)
  if(NOT TORCH_CUDA_ARCH_LIST)
    set(TORCH_CUDA_ARCH_LIST "8.0;9.0+PTX")
  endif()
  set(CMAKE_CUDA_RUNTIME_LIBRARY Shared)
  enable_language(CUDA)
  set(MLTRAIN_CUDA_KERNELS ON)
  find_package(CUDAToolkit REQUIRED)
  string(REGEX MATCH "^[0-9]+" _wheel_cuda_major "${_torch_cuda}")
  if(NOT _wheel_cuda_major STREQUAL CUDAToolkit_VERSION_MAJOR)
    message(FATAL_ERROR "torch ${MLTRAIN_TORCH_VERSION} is built for CUDA ${_torch_cuda} but the toolkit "
                        "at ${CUDAToolkit_BIN_DIR} is ${CUDAToolkit_VERSION}: pin a wheel for that CUDA "
                        "in launch/requirements.txt")
  endif()
endif()

# The wheel ships its own fmt (12.x) headers in torch/include, which would shadow the Debian fmt that
# Debian's spdlog is built against (and does not compile with fmt 12). A directory holding only a
# link to the system's fmt headers, put before torch's, makes every target see the one fmt it links.
# The LibTorch headers we include do not use fmt.
find_path(MLTRAIN_FMT_INCLUDE_DIR fmt/core.h REQUIRED)
set(_fmt_shadow "${CMAKE_BINARY_DIR}/fmt_before_torch")
file(MAKE_DIRECTORY "${_fmt_shadow}")
file(CREATE_LINK "${MLTRAIN_FMT_INCLUDE_DIR}/fmt" "${_fmt_shadow}/fmt" SYMBOLIC)

list(APPEND CMAKE_PREFIX_PATH "${_torch_prefix}")
find_package(Torch REQUIRED)
message(STATUS "LibTorch ${MLTRAIN_TORCH_VERSION} (CUDA ${_torch_cuda}) from ${_torch_prefix}")

# TorchConfig puts its include directories on torch_cpu as ordinary ones; as system includes their
# warnings stay out of our -Wall -Wextra.
get_target_property(_torch_includes torch_cpu INTERFACE_INCLUDE_DIRECTORIES)
set_target_properties(torch_cpu PROPERTIES INTERFACE_SYSTEM_INCLUDE_DIRECTORIES "${_torch_includes}")

# What the project's targets link to use LibTorch.
add_library(mltrain_torch INTERFACE)
target_include_directories(mltrain_torch SYSTEM BEFORE INTERFACE "${_fmt_shadow}")
target_link_libraries(mltrain_torch INTERFACE torch)
# libtorch.so and libtorch_cpu.so export copies of std::filesystem functions, and libtorch.so's
# remove_all segfaults when our code's calls bind to it. Naming libstdc++ before any object puts it
# first among the executable's libraries with Debian's toolchain, so the dynamic linker binds std::
# symbols to it; with Ubuntu 24.04's it did not (bench/GPU_RESULTS.md), hence common/file_tree.h.
target_link_options(mltrain_torch INTERFACE "LINKER:--push-state,--no-as-needed" -lstdc++ "LINKER:--pop-state")

# ATen's at::parallel_for is inline: compiled without -fopenmp it runs serially, in the caller's
# thread, so mltrain's own CPU kernels would use one core. With -fopenmp its OpenMP regions must
# run on LibTorch's thread pool, not a second one: the wheel ships its own libgomp.so.1, and
# linking that one (not the compiler's -lgomp) makes both the same runtime, sized by
# at::set_num_threads. Every target compiles with the flag, so that they share one precompiled
# header.
find_library(MLTRAIN_TORCH_GOMP NAMES libgomp.so.1 gomp HINTS "${TORCH_INSTALL_PREFIX}/lib" NO_DEFAULT_PATH)
if(MLTRAIN_TORCH_GOMP)
  target_compile_options(mltrain_torch INTERFACE $<$<COMPILE_LANGUAGE:CXX>:-fopenmp>)
  target_link_libraries(mltrain_torch INTERFACE "${MLTRAIN_TORCH_GOMP}")
else()
  message(FATAL_ERROR "No libgomp.so.1 beside LibTorch in ${TORCH_INSTALL_PREFIX}/lib: without it mltrain's CPU "
                      "kernels would run on one thread and the flag that flushes denormals would miss ATen's "
                      "threads; reinstall the torch wheel (launch/setup.sh)")
endif()

# NCCL from the wheel's nvidia-nccl package: the library LibTorch itself loads, found beside torch.
get_filename_component(_site_packages "${_torch_prefix}/../../.." ABSOLUTE)
find_path(MLTRAIN_NCCL_INCLUDE_DIR nccl.h HINTS "${_site_packages}/nvidia/nccl/include" NO_DEFAULT_PATH)
find_library(MLTRAIN_NCCL_LIBRARY NAMES nccl libnccl.so.2 HINTS "${_site_packages}/nvidia/nccl/lib" NO_DEFAULT_PATH)
if(NOT MLTRAIN_NCCL_INCLUDE_DIR OR NOT MLTRAIN_NCCL_LIBRARY)
  message(FATAL_ERROR "NCCL not found in ${_site_packages}/nvidia/nccl: reinstall the torch wheel (launch/setup.sh)")
endif()
add_library(mltrain_nccl INTERFACE)
target_include_directories(mltrain_nccl SYSTEM INTERFACE "${MLTRAIN_NCCL_INCLUDE_DIR}")
target_link_libraries(mltrain_nccl INTERFACE "${MLTRAIN_NCCL_LIBRARY}")
message(STATUS "NCCL: ${MLTRAIN_NCCL_LIBRARY}")
