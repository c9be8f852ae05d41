// The one translation unit that compiles asyncps' non-template functions (separate
// compilation; CMakeLists.txt defines ASYNCPS_SEPARATE_COMPILATION for the whole program).
#include <asyncps/src.hpp>
