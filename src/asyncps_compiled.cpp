// The one translation unit of asyncps::asyncps_compiled (CMake option
// ASYNCPS_SEPARATE_COMPILATION): asyncps' non-template functions, compiled once.
#include <asyncps/src.hpp>
