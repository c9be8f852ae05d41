# run_package_test.cmake -- build and run a tiny consumer of asyncps.
#
#   cmake -DMODE=find_package|add_subdirectory
#         -DCONSUMER_DIR=<tests/package/MODE> -DWORK_DIR=<scratch dir>
#         -DASYNCPS_SOURCE_DIR=<repo root> -DASYNCPS_BINARY_DIR=<parent build dir>
#         -DGENERATOR=<generator> [-DMAKE_PROGRAM=<ninja>] -DCXX=<compiler> [-DCONFIG=<cfg>]
#         -P cmake/run_package_test.cmake
#
# find_package:     installs the parent build (component "asyncps") into WORK_DIR/prefix, then
#                   configures the consumer with CMAKE_PREFIX_PATH=WORK_DIR/prefix.
# add_subdirectory: configures the consumer with ASYNCPS_SOURCE_DIR=<repo root>.
# Both then build the consumer (one TU) and run it.

cmake_minimum_required(VERSION 3.25)

foreach(var IN ITEMS MODE CONSUMER_DIR WORK_DIR ASYNCPS_SOURCE_DIR GENERATOR CXX)
  if(NOT DEFINED ${var} OR "${${var}}" STREQUAL "")
    message(FATAL_ERROR "run_package_test.cmake: -D${var}=... is required")
  endif()
endforeach()

function(run step)
  string(JOIN " " pretty ${ARGN})
  message(STATUS "[${MODE}] ${step}: ${pretty}")
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE result)
  if(NOT result STREQUAL "0")
    message(FATAL_ERROR "[${MODE}] ${step} failed (${result})")
  endif()
endfunction()

file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")

# CONFIG selects the configuration to install and build with multi-config generators; the
# consumer itself is built without a build type (one tiny TU: fastest unoptimised).
set(build_config_args)
if(DEFINED CONFIG AND NOT CONFIG STREQUAL "")
  set(build_config_args --config "${CONFIG}")
endif()

set(configure_args
  -S "${CONSUMER_DIR}" -B "${WORK_DIR}/build"
  -G "${GENERATOR}"
  "-DCMAKE_CXX_COMPILER=${CXX}"
  -DCMAKE_FIND_PACKAGE_NO_PACKAGE_REGISTRY=ON)
if(DEFINED MAKE_PROGRAM AND NOT MAKE_PROGRAM STREQUAL "")
  list(APPEND configure_args "-DCMAKE_MAKE_PROGRAM=${MAKE_PROGRAM}")
endif()

if(MODE STREQUAL "find_package")
  if(NOT DEFINED ASYNCPS_BINARY_DIR)
    message(FATAL_ERROR "run_package_test.cmake: -DASYNCPS_BINARY_DIR=... is required")
  endif()
  set(prefix "${WORK_DIR}/prefix")
  run(install "${CMAKE_COMMAND}" --install "${ASYNCPS_BINARY_DIR}" --prefix "${prefix}"
      --component asyncps ${build_config_args})
  list(APPEND configure_args "-DCMAKE_PREFIX_PATH=${prefix}" "-DASYNCPS_EXPECTED_PREFIX=${prefix}")
elseif(MODE STREQUAL "add_subdirectory")
  list(APPEND configure_args "-DASYNCPS_SOURCE_DIR=${ASYNCPS_SOURCE_DIR}")
else()
  message(FATAL_ERROR "run_package_test.cmake: unknown MODE '${MODE}'")
endif()

run(configure "${CMAKE_COMMAND}" ${configure_args})
run(build "${CMAKE_COMMAND}" --build "${WORK_DIR}/build" ${build_config_args})

set(exe "${WORK_DIR}/build/asyncps_consumer")
if(DEFINED CONFIG AND NOT CONFIG STREQUAL "" AND EXISTS "${WORK_DIR}/build/${CONFIG}/asyncps_consumer")
  set(exe "${WORK_DIR}/build/${CONFIG}/asyncps_consumer")
endif()
run(run "${exe}")
message(STATUS "[${MODE}] passed")
