# FindAsio.cmake -- locate standalone Asio (header-only; it ships no CMake or pkg-config file).
#
# Result variables:
#   Asio_FOUND, Asio_VERSION, Asio_INCLUDE_DIR
# Imported target:
#   Asio::Asio  INTERFACE; defines ASIO_STANDALONE and ASIO_NO_DEPRECATED, links Threads::Threads.

find_path(Asio_INCLUDE_DIR
  NAMES asio.hpp
  PATH_SUFFIXES include
  DOC "Directory containing the standalone Asio header asio.hpp")
mark_as_advanced(Asio_INCLUDE_DIR)

if(Asio_INCLUDE_DIR AND EXISTS "${Asio_INCLUDE_DIR}/asio/version.hpp")
  file(STRINGS "${Asio_INCLUDE_DIR}/asio/version.hpp" _asio_version_line
       REGEX "^#define[ \t]+ASIO_VERSION[ \t]+[0-9]+")
  string(REGEX REPLACE "^#define[ \t]+ASIO_VERSION[ \t]+([0-9]+).*$" "\\1"
         _asio_version_number "${_asio_version_line}")
  if(_asio_version_number MATCHES "^[0-9]+$")
    # ASIO_VERSION = major * 100000 + minor * 100 + patch (e.g. 102201 = 1.22.1)
    math(EXPR _asio_major "${_asio_version_number} / 100000")
    math(EXPR _asio_minor "${_asio_version_number} / 100 % 1000")
    math(EXPR _asio_patch "${_asio_version_number} % 100")
    set(Asio_VERSION "${_asio_major}.${_asio_minor}.${_asio_patch}")
  endif()
  unset(_asio_version_line)
  unset(_asio_version_number)
  unset(_asio_major)
  unset(_asio_minor)
  unset(_asio_patch)
endif()

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(Asio
  REQUIRED_VARS Asio_INCLUDE_DIR
  VERSION_VAR Asio_VERSION)

if(Asio_FOUND AND NOT TARGET Asio::Asio)
  if(NOT TARGET Threads::Threads)
    set(THREADS_PREFER_PTHREAD_FLAG ON)
    find_package(Threads REQUIRED)
  endif()
  add_library(Asio::Asio INTERFACE IMPORTED)
  set_target_properties(Asio::Asio PROPERTIES
    INTERFACE_INCLUDE_DIRECTORIES "${Asio_INCLUDE_DIR}"
    INTERFACE_COMPILE_DEFINITIONS "ASIO_STANDALONE;ASIO_NO_DEPRECATED"
    INTERFACE_LINK_LIBRARIES "Threads::Threads")
endif()
