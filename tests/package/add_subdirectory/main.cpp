// Consumer of the asyncps package: it only has to find, compile against and link asyncps.
#include <asyncps/error.hpp>
#include <asyncps/model.hpp>
#include <asyncps/table.hpp>

#include <system_error>

static_assert(asyncps::shard_range(10, 0, 2) == asyncps::key_range{0, 5});
static_assert(asyncps::shard_range(10, 1, 2) == asyncps::key_range{5, 10});

int main() {
  const std::error_code ec = asyncps::errc::timeout;
  return ec == asyncps::condition::transient ? 0 : 1;
}
