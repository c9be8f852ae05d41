# check_headers.cmake -- every public header must compile on its own (and twice in a row).
#
# Run as a ctest test (see tests/CMakeLists.txt):
#   cmake -DCONFIG=<build>/tests/check_headers_config.cmake -P cmake/check_headers.cmake
#
# CONFIG is generated at configure time and sets:
#   CHECK_CXX          the C++ compiler
#   CHECK_HEADER_ROOT  the directory holding asyncps/ (headers are globbed now, at test time,
#                      so headers added after configuring are checked too)
#   CHECK_INCLUDES     -I directories (our include/)
#   CHECK_SYSTEM_INCLUDES  -isystem directories (Asio, Eigen, Boost, xxHash)
#   CHECK_DEFINITIONS  preprocessor definitions (NAME or NAME=VALUE)
#   CHECK_FLAGS        extra flags (warnings)
#   CHECK_WORK_DIR     where the one-line translation units are written
# Optional: -DJOBS=<n> compilers run at once (default: number of logical cores).
#
# For each header H a TU containing `#include <H>` twice is compiled with
#   <CXX> -std=c++20 -fsyntax-only -x c++ ...
# (a TU rather than the header itself, so `#pragma once` does not warn "in main file"); the
# headers that depend on ASYNCPS_SEPARATE_COMPILATION again with it defined (see below).

cmake_minimum_required(VERSION 3.25)

if(NOT DEFINED CONFIG OR NOT EXISTS "${CONFIG}")
  message(FATAL_ERROR "check_headers.cmake: pass -DCONFIG=<generated config file>")
endif()
include("${CONFIG}")

if(NOT DEFINED JOBS)
  if(DEFINED ENV{CMAKE_BUILD_PARALLEL_LEVEL} AND "$ENV{CMAKE_BUILD_PARALLEL_LEVEL}" MATCHES "^[1-9][0-9]*$")
    set(JOBS "$ENV{CMAKE_BUILD_PARALLEL_LEVEL}")
  else()
    cmake_host_system_information(RESULT JOBS QUERY NUMBER_OF_LOGICAL_CORES)
  endif()
endif()
if(NOT JOBS MATCHES "^[1-9][0-9]*$")
  set(JOBS 1)
endif()

file(GLOB_RECURSE headers RELATIVE "${CHECK_HEADER_ROOT}" "${CHECK_HEADER_ROOT}/asyncps/*.hpp")
list(SORT headers)
list(LENGTH headers n_headers)
if(n_headers EQUAL 0)
  message(FATAL_ERROR "check_headers.cmake: no headers under ${CHECK_HEADER_ROOT}/asyncps")
endif()

set(base_args -std=c++20 -fsyntax-only)
foreach(dir IN LISTS CHECK_INCLUDES)
  list(APPEND base_args "-I${dir}")
endforeach()
foreach(dir IN LISTS CHECK_SYSTEM_INCLUDES)
  list(APPEND base_args -isystem "${dir}")
endforeach()
foreach(def IN LISTS CHECK_DEFINITIONS)
  list(APPEND base_args "-D${def}")
endforeach()
list(APPEND base_args ${CHECK_FLAGS})

file(MAKE_DIRECTORY "${CHECK_WORK_DIR}")

# Separate compilation (asyncps/detail/config.hpp): asyncps/src.hpp is compiled only with
# ASYNCPS_SEPARATE_COMPILATION (it stops with an #error without it); the headers whose text
# differs in that mode (those that include config.hpp, or a header that does, directly:
# transport/tcp.hpp) are checked in it too. The impl/*.ipp files are not headers of their own.
set(header_only_headers ${headers})
list(REMOVE_ITEM header_only_headers asyncps/src.hpp)
set(separate_headers)
foreach(header IN LISTS headers)
  file(STRINGS "${CHECK_HEADER_ROOT}/${header}" hits
       REGEX "asyncps/(detail/config|transport/tcp|src)\\.hpp|ASYNCPS_SEPARATE_COMPILATION")
  if(hits OR header STREQUAL "asyncps/src.hpp")
    list(APPEND separate_headers "${header}")
  endif()
endforeach()

# The compiler's arguments for one check: `base_args`, plus the macro when `separate` is 1.
function(check_args out separate)
  set(args ${base_args})
  if(separate)
    list(APPEND args -DASYNCPS_SEPARATE_COMPILATION)
  endif()
  set(${out} ${args} PARENT_SCOPE)
endfunction()

# Each check is a TU including its header twice, compiled with `base_args` (plus
# -DASYNCPS_SEPARATE_COMPILATION for the second set). The checks are dealt round-robin to JOBS
# chains; the chains run at once (execute_process runs its COMMANDs concurrently), each one
# compiling its checks in turn (this script again, with CHECK_CHAIN set), so a slow header
# holds up only its own chain, not a whole batch. Each chain writes one line per check to
# <list>.result: "ok|<index>" or "FAIL|<index>" (a failure is compiled again below, alone, to
# show its diagnostics).
if(DEFINED CHECK_CHAIN)
  file(STRINGS "${CHECK_CHAIN}" entries)
  set(out "")
  foreach(entry IN LISTS entries)
    string(REPLACE "|" ";" fields "${entry}")
    list(GET fields 0 index)
    list(GET fields 1 tu)
    list(GET fields 2 separate)
    check_args(args ${separate})
    execute_process(COMMAND "${CHECK_CXX}" ${args} -x c++ "${tu}"
      RESULT_VARIABLE result OUTPUT_QUIET ERROR_QUIET)
    if(result STREQUAL "0")
      string(APPEND out "ok|${index}\n")
    else()
      string(APPEND out "FAIL|${index}\n")
    endif()
  endforeach()
  file(WRITE "${CHECK_CHAIN}.result" "${out}")
  return()
endif()

set(check_tus)
set(check_names)
set(check_separate)
foreach(set_name IN ITEMS header_only separate)
  if(set_name STREQUAL "header_only")
    set(hdrs ${header_only_headers})
    set(suffix "")
    set(tag "")
    set(separate 0)
  else()
    set(hdrs ${separate_headers})
    set(suffix _separate)
    set(tag " (separate compilation)")
    set(separate 1)
  endif()
  foreach(header IN LISTS hdrs)
    string(MAKE_C_IDENTIFIER "${header}" stem)
    set(tu "${CHECK_WORK_DIR}/${stem}${suffix}.cpp")
    set(content "// generated by cmake/check_headers.cmake\n#include <${header}>\n#include <${header}>\n")
    if(EXISTS "${tu}")
      file(READ "${tu}" old)
    else()
      set(old "")
    endif()
    if(NOT old STREQUAL content)
      file(WRITE "${tu}" "${content}")
    endif()
    list(APPEND check_tus "${tu}")
    list(APPEND check_names "${header}${tag}")
    list(APPEND check_separate ${separate})
  endforeach()
endforeach()

list(LENGTH check_tus n_checks)
math(EXPR last "${n_checks} - 1")
set(commands)
set(chain_files)
math(EXPR last_chain "${JOBS} - 1")
foreach(chain RANGE 0 ${last_chain})
  set(list_text "")
  foreach(i RANGE ${chain} ${last} ${JOBS})
    list(GET check_tus ${i} tu)
    list(GET check_separate ${i} separate)
    string(APPEND list_text "${i}|${tu}|${separate}\n")
  endforeach()
  set(chain_file "${CHECK_WORK_DIR}/chain_${chain}.txt")
  file(WRITE "${chain_file}" "${list_text}")
  file(REMOVE "${chain_file}.result")
  list(APPEND chain_files "${chain_file}")
  list(APPEND commands COMMAND "${CMAKE_COMMAND}" "-DCONFIG=${CONFIG}" "-DCHECK_CHAIN=${chain_file}"
       -P "${CMAKE_CURRENT_LIST_FILE}")
  if(chain EQUAL last)
    break()  # fewer checks than JOBS
  endif()
endforeach()
execute_process(${commands} OUTPUT_QUIET)

# The results, in the checks' order.
foreach(chain_file IN LISTS chain_files)
  if(NOT EXISTS "${chain_file}.result")
    message(FATAL_ERROR "check_headers.cmake: the chain ${chain_file} wrote no results")
  endif()
  file(STRINGS "${chain_file}.result" lines)
  foreach(line IN LISTS lines)
    string(REPLACE "|" ";" fields "${line}")
    list(GET fields 0 status)
    list(GET fields 1 i)
    set(status_${i} "${status}")
  endforeach()
endforeach()
set(failed)
foreach(i RANGE 0 ${last})
  list(GET check_names ${i} name)
  if(NOT DEFINED status_${i})
    message(FATAL_ERROR "check_headers.cmake: no result for ${name}")
  endif()
  if(status_${i} STREQUAL "ok")
    message(STATUS "ok    ${name}")
  else()
    message(STATUS "FAIL  ${name}")
    list(GET check_tus ${i} tu)
    list(GET check_separate ${i} separate)
    check_args(args ${separate})
    # Re-run the failure alone so its diagnostics are not interleaved with others'.
    execute_process(
      COMMAND "${CHECK_CXX}" ${args} -x c++ "${tu}"
      RESULT_VARIABLE rerun
      OUTPUT_VARIABLE out
      ERROR_VARIABLE out)
    string(JOIN " " pretty "${CHECK_CXX}" ${args} -x c++ "${tu}")
    message("\n==== ${name} is not self-contained (exit ${rerun}) ====\n"
            "command: ${pretty}\n${out}")
    list(APPEND failed "${name}")
  endif()
endforeach()

list(LENGTH header_only_headers n_header_only)
list(LENGTH separate_headers n_separate)
if(failed)
  list(LENGTH failed n_failed)
  list(JOIN failed ", " failed_list)
  message(FATAL_ERROR
    "${n_failed} header check(s) failed (${n_header_only} headers header-only, "
    "${n_separate} with ASYNCPS_SEPARATE_COMPILATION): ${failed_list}")
endif()

message(STATUS "all ${n_header_only} headers under ${CHECK_HEADER_ROOT}/asyncps are "
               "self-contained, and the ${n_separate} that depend on the mode with "
               "ASYNCPS_SEPARATE_COMPILATION too")
