# Checks what a static link of libxserv.a brings into a host program: every strong global symbol
# of the archive's objects (xserv.cpp's and the internal layers') must be the C ABI (xserv_*) or
# live in namespace xserv. A helper with C linkage or at global scope would clash with a host's
# own function of that name at link time (clang once gave the engine helpers of capi/xserv.cpp C
# linkage inside its extern "C" block; only the shared library's export list was checked then).
# Weak and unique symbols (inline functions, template instances) merge and are not checked; nvcc's
# host stubs of kernels in xserv's anonymous namespaces (__device_stub__ followed by the kernel's
# mangled name, which holds a hash of its file) and AddressSanitizer's ODR indicators of xserv's
# globals (__odr_asan. followed by the global's name) are global but cannot meet a host's name.
# Usage: cmake -DNM=nm -DOBJECTS="a.o|libb.a" -P check_static_symbols.cmake
cmake_minimum_required(VERSION 3.25)
set(bad "")
set(n 0)
string(REPLACE "|" ";" OBJECTS "${OBJECTS}")
foreach(object IN LISTS OBJECTS)
  execute_process(COMMAND ${NM} -C -g --defined-only ${object}
                  OUTPUT_VARIABLE out RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${NM} -C -g --defined-only ${object} failed (${rc})")
  endif()
  string(REPLACE ";" "\\;" out "${out}")
  string(REPLACE "\n" ";" lines "${out}")
  foreach(line IN LISTS lines)
    # "0000000000012340 T xserv::Model::load(...)": strong definitions are T, D, B, R (and the
    # small-data G, S); W, V, u are weak or unique.
    if(NOT line MATCHES "^[0-9a-f]* ([TDBRGS]) (.+)$")
      continue()
    endif()
    set(name "${CMAKE_MATCH_2}")
    math(EXPR n "${n} + 1")
    if(name MATCHES "^xserv_" OR name MATCHES "^xserv::" OR name MATCHES "^__device_stub__Z[A-Z]*N5xserv" OR
       name MATCHES "^__odr_asan(_gen_|\\.)(xserv_|_Z[A-Z]*N5xserv)" OR
       name MATCHES "^(vtable|typeinfo|typeinfo name|guard variable|VTT|construction vtable|non-virtual thunk to|virtual thunk to) for xserv::")
      continue()
    endif()
    list(APPEND bad "${object}: ${line}")
  endforeach()
endforeach()
if(bad)
  list(JOIN bad "\n  " text)
  message(FATAL_ERROR "global symbols outside the C ABI and namespace xserv (a static link "
                      "would clash with a host's own names):\n  ${text}")
endif()
if(n EQUAL 0)
  message(FATAL_ERROR "no global symbols found in ${OBJECTS}")
endif()
message(STATUS "${n} global symbols, each xserv_* or in namespace xserv")
