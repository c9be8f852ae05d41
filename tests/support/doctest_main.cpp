// The doctest runner, compiled once into `asyncps_doctest_main` and linked into every test
// executable. Test files include <doctest/doctest.h> and define no main.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>
