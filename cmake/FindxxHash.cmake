# FindxxHash.cmake -- locate the xxHash header (used header-only: compile with XXH_INLINE_ALL,
# so no library is needed).
#
# Result variables:
#   xxHash_FOUND, xxHash_VERSION, xxHash_INCLUDE_DIR
# Imported target:
#   xxHash::xxhash  INTERFACE (include directory only)

find_path(xxHash_INCLUDE_DIR
  NAMES xxhash.h
  PATH_SUFFIXES include
  DOC "Directory containing xxhash.h")
mark_as_advanced(xxHash_INCLUDE_DIR)

if(xxHash_INCLUDE_DIR AND EXISTS "${xxHash_INCLUDE_DIR}/xxhash.h")
  foreach(_part MAJOR MINOR RELEASE)
    file(STRINGS "${xxHash_INCLUDE_DIR}/xxhash.h" _xxh_line
         REGEX "^#define[ \t]+XXH_VERSION_${_part}[ \t]+[0-9]+")
    string(REGEX REPLACE "^#define[ \t]+XXH_VERSION_${_part}[ \t]+([0-9]+).*$" "\\1"
           _xxh_${_part} "${_xxh_line}")
  endforeach()
  if(_xxh_MAJOR MATCHES "^[0-9]+$" AND _xxh_MINOR MATCHES "^[0-9]+$"
     AND _xxh_RELEASE MATCHES "^[0-9]+$")
    set(xxHash_VERSION "${_xxh_MAJOR}.${_xxh_MINOR}.${_xxh_RELEASE}")
  endif()
  unset(_xxh_line)
  unset(_xxh_MAJOR)
  unset(_xxh_MINOR)
  unset(_xxh_RELEASE)
endif()

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(xxHash
  REQUIRED_VARS xxHash_INCLUDE_DIR
  VERSION_VAR xxHash_VERSION)

if(xxHash_FOUND AND NOT TARGET xxHash::xxhash)
  add_library(xxHash::xxhash INTERFACE IMPORTED)
  set_target_properties(xxHash::xxhash PROPERTIES
    INTERFACE_INCLUDE_DIRECTORIES "${xxHash_INCLUDE_DIR}")
endif()
