// asyncps — header-only (the default) or separate compilation (Asio's pattern).
//
// Header-only: every function is defined in the headers; the non-template ones are `inline`.
// Separate compilation: define ASYNCPS_SEPARATE_COMPILATION in every translation unit of the
// program (the CMake target asyncps::asyncps_compiled does) and compile <asyncps/src.hpp> in
// exactly one of them; the headers then declare those functions only, and their definitions
// (the `impl/*.ipp` files) are compiled once, in that translation unit.
#pragma once

#if defined(ASYNCPS_SEPARATE_COMPILATION)
#define ASYNCPS_DECL
#else
#define ASYNCPS_HEADER_ONLY 1
#define ASYNCPS_DECL inline
#endif
