# Build options for developers and CI:
#   MLTRAIN_PCH       ON (default): one precompiled header of the LibTorch includes, reused by every
#                     target. OFF for clang tools, which cannot read GCC's .gch files.
#   MLTRAIN_WERROR    ON: warnings in project code are errors.
#   MLTRAIN_SANITIZE  address or thread: builds every project target with that sanitizer.
option(MLTRAIN_PCH "Precompile the LibTorch headers" ON)
option(MLTRAIN_WERROR "Treat warnings in project code as errors" OFF)
set(MLTRAIN_SANITIZE "" CACHE STRING "Sanitizer for project code: address, thread or empty")
set_property(CACHE MLTRAIN_SANITIZE PROPERTY STRINGS "" address thread)

if(MLTRAIN_SANITIZE STREQUAL "address" OR MLTRAIN_SANITIZE STREQUAL "thread")
  add_compile_options(-fsanitize=${MLTRAIN_SANITIZE} -fno-omit-frame-pointer)
  add_link_options(-fsanitize=${MLTRAIN_SANITIZE})
elseif(NOT MLTRAIN_SANITIZE STREQUAL "")
  message(FATAL_ERROR "MLTRAIN_SANITIZE is \"${MLTRAIN_SANITIZE}\": use address, thread or leave it empty")
endif()

# Makes `target` reuse mltrain_model's precompiled LibTorch header, when there is one.
function(mltrain_use_pch target)
  if(MLTRAIN_PCH)
    target_precompile_headers(${target} REUSE_FROM mltrain_model)
  endif()
endfunction()
