# Runs one libFuzzer target for SECONDS on a working copy of its seed corpus (ctest fuzz_*).
#   cmake -DFUZZER=<exe> -DSEEDS=<dir> -DWORK_DIR=<dir> -DSECONDS=<n> -P run_fuzzer.cmake
# The working corpus (WORK_DIR/corpus) keeps what earlier runs found; crashes are written to
# WORK_DIR/artifacts/. The source tree is never written.
foreach(var FUZZER SEEDS WORK_DIR SECONDS)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "run_fuzzer.cmake: ${var} is not set")
  endif()
endforeach()
file(MAKE_DIRECTORY "${WORK_DIR}/corpus" "${WORK_DIR}/artifacts")
file(GLOB _seeds "${SEEDS}/*")
file(COPY ${_seeds} DESTINATION "${WORK_DIR}/corpus")
execute_process(
  COMMAND "${FUZZER}" -max_total_time=${SECONDS} -rss_limit_mb=2048 -timeout=30
          -print_final_stats=1 "-artifact_prefix=${WORK_DIR}/artifacts/" "${WORK_DIR}/corpus"
  RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${FUZZER} failed (${rc}); the input is in ${WORK_DIR}/artifacts/")
endif()
