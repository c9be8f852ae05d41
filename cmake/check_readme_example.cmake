# Checks that README.md shows examples/tutorial/1_quick_start.cpp verbatim: the first ```cpp
# block after the heading "## Using the library" must equal the file, line for line.
#
#   cmake -DREADME=<README.md> -DEXAMPLE=<1_quick_start.cpp> -P check_readme_example.cmake
#
# Fails (FATAL_ERROR) naming the first line that differs, with both versions of it.
cmake_minimum_required(VERSION 3.25)
foreach(var README EXAMPLE)
  if(NOT DEFINED ${var} OR NOT EXISTS "${${var}}")
    message(FATAL_ERROR "check_readme_example: -D${var}=<file> is required and must exist")
  endif()
endforeach()

# Reads a file into a list of lines. Semicolons and brackets are escaped so that the list
# keeps them (C++ is full of them).
function(read_lines file out)
  file(READ "${file}" text)
  string(REPLACE ";" "\\;" text "${text}")
  string(REPLACE "[" "\\[" text "${text}")
  string(REPLACE "]" "\\]" text "${text}")
  string(REGEX REPLACE "\n$" "" text "${text}")
  string(REPLACE "\n" ";" text "${text}")
  set(${out} "${text}" PARENT_SCOPE)
endfunction()

read_lines("${README}" readme)
read_lines("${EXAMPLE}" example)

# The block: after "## Using the library", from the first "```cpp" to the next "```".
set(state heading)
set(block "")
set(block_start 0)
set(n 0)
foreach(line IN LISTS readme)
  math(EXPR n "${n} + 1")
  if(state STREQUAL "heading")
    if(line STREQUAL "## Using the library")
      set(state fence)
    endif()
  elseif(state STREQUAL "fence")
    if(line MATCHES "^## ")
      break()
    elseif(line STREQUAL "```cpp")
      set(state block)
      math(EXPR block_start "${n} + 1")
    endif()
  elseif(state STREQUAL "block")
    if(line STREQUAL "```")
      set(state done)
      break()
    endif()
    string(REPLACE ";" "\\;" line "${line}")
    list(APPEND block "${line}")
  endif()
endforeach()
if(NOT state STREQUAL "done")
  message(FATAL_ERROR "${README}: no complete ```cpp block under '## Using the library'")
endif()

list(LENGTH block block_lines)
list(LENGTH example example_lines)
set(i 0)
while(i LESS block_lines AND i LESS example_lines)
  list(GET block ${i} a)
  list(GET example ${i} b)
  if(NOT a STREQUAL b)
    math(EXPR file_line "${i} + 1")
    math(EXPR readme_line "${block_start} + ${i}")
    message(FATAL_ERROR "README.md's example differs from ${EXAMPLE} at line ${file_line} "
                        "(README.md line ${readme_line}):\n  README: ${a}\n  file:   ${b}\n"
                        "Copy the file into the README's ```cpp block.")
  endif()
  math(EXPR i "${i} + 1")
endwhile()
if(NOT block_lines EQUAL example_lines)
  message(FATAL_ERROR "README.md's example has ${block_lines} lines, ${EXAMPLE} has "
                      "${example_lines}: they differ from line ${i} + 1 on. Copy the file "
                      "into the README's ```cpp block.")
endif()
message(STATUS "README.md shows ${EXAMPLE} verbatim (${example_lines} lines)")
