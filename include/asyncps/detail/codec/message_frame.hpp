// asyncps — what every control message codec of the protocol shares: building a frame around
// a payload, and naming what is wrong with a malformed one.
//
// Used by the codecs of asyncps/protocol.hpp and detail/codec/*_messages.hpp.
#pragma once

#include <cstdint>
#include <string>
#include <system_error>
#include <utility>

#include "asyncps/buffer.hpp"
#include "asyncps/detail/endian.hpp"
#include "asyncps/error.hpp"
#include "asyncps/layout.hpp"
#include "asyncps/wire.hpp"

namespace asyncps::protocol {

namespace detail_ {
inline message frame(message_type t, std::uint32_t sender, clock_value clock, buffer payload) {
  message m;
  m.header.type = t;
  m.header.sender = sender;
  m.header.clock = clock;
  m.payload = std::move(payload);
  return m;
}
inline std::error_code bad(std::string& detail, std::string what) {
  detail = " (" + std::move(what) + ")";
  return errc::unexpected_message;
}
}  // namespace detail_

}  // namespace asyncps::protocol
