# Sanitizer and fuzzing builds (docs/testing-hardening.md).
#
#   -DRINGRUN_SANITIZE=address,undefined   ASan + UBSan (any UB aborts: -fno-sanitize-recover)
#   -DRINGRUN_SANITIZE=thread              TSan
#   -DRINGRUN_FUZZ=ON                      the libFuzzer targets of tests/fuzz (clang only); every
#                                          object gets coverage (-fsanitize=fuzzer-no-link). It
#                                          goes with RINGRUN_SANITIZE=address,undefined, so one
#                                          build runs the ASan tests and the fuzzers.
#
# Each wants a build directory of its own (scripts/sanitize.sh uses build-asan and build-tsan).
# gRPC and Protobuf come from Debian, uninstrumented: sanitizer builds link them as shared
# libraries (RINGRUN_STATIC_GRPC is forced OFF), so that their frames are symbolized and
# tests/sanitizers/tsan.supp can name them with called_from_lib:. The static link only saves
# start-up time, which a sanitized program does not care about.
set(RINGRUN_SANITIZE "" CACHE STRING "Sanitizers: empty, address,undefined or thread")
option(RINGRUN_FUZZ "Build the libFuzzer targets of tests/fuzz (clang)" OFF)

if(RINGRUN_SANITIZE)
  string(REPLACE "," ";" _sanitizers "${RINGRUN_SANITIZE}")
  foreach(s ${_sanitizers})
    if(NOT s MATCHES "^(address|undefined|thread)$")
      message(FATAL_ERROR "RINGRUN_SANITIZE: unknown sanitizer '${s}' (address, undefined, thread)")
    endif()
  endforeach()
  if("thread" IN_LIST _sanitizers AND "address" IN_LIST _sanitizers)
    message(FATAL_ERROR "RINGRUN_SANITIZE: thread and address do not combine; use two builds")
  endif()
  set(_flags -fsanitize=${RINGRUN_SANITIZE} -fno-omit-frame-pointer)
  if("undefined" IN_LIST _sanitizers)
    list(APPEND _flags -fno-sanitize-recover=undefined)
  endif()
  add_compile_options(${_flags})
  add_link_options(-fsanitize=${RINGRUN_SANITIZE})
  if("undefined" IN_LIST _sanitizers AND CMAKE_C_COMPILER_ID STREQUAL "Clang")
    # C programs that load the C++ libringrun.so need UBSan's C++ part (vptr checks) too.
    add_link_options("$<$<LINK_LANGUAGE:C>:-fsanitize-link-c++-runtime;-lstdc++>")
  endif()
endif()

if(RINGRUN_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    message(FATAL_ERROR "RINGRUN_FUZZ needs clang (libFuzzer): -DCMAKE_CXX_COMPILER=clang++ "
                        "-DCMAKE_C_COMPILER=clang")
  endif()
  add_compile_options(-fsanitize=fuzzer-no-link)
endif()

if(RINGRUN_SANITIZE OR RINGRUN_FUZZ)
  if(RINGRUN_STATIC_GRPC)
    message(STATUS "ringrun: sanitizer/fuzz build: gRPC and Protobuf linked as shared libraries")
  endif()
  set(RINGRUN_STATIC_GRPC OFF CACHE BOOL "" FORCE)
endif()
