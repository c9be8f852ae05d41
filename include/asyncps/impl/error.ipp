// asyncps — the definitions of the error categories' member functions (error.hpp).
//
// Not a header to include on its own: error.hpp includes it (header-only, the default), or
// asyncps/src.hpp compiles it once (ASYNCPS_SEPARATE_COMPILATION defined; docs/build_time.md,
// "Separate compilation"). It does not include that header back (no include cycle): whoever
// includes this file has included the header first.
#pragma once

#include <string>
#include <string_view>
#include <system_error>

#include "asyncps/detail/config.hpp"

namespace asyncps::detail {

ASYNCPS_DECL std::string error_category_impl::message(int ev) const {
  switch (static_cast<errc>(ev)) {
    case errc::bad_magic: return "bad frame header field 'magic'";
    case errc::unsupported_version: return "bad frame header field 'version' (unsupported)";
    case errc::bad_message_type: return "bad frame header field 'type'";
    case errc::bad_flags: return "bad frame header field 'flags'";
    case errc::frame_too_large: return "frame header field 'payload_bytes' exceeds the limit";
    case errc::too_many_rows: return "frame header field 'row_count' exceeds the limit";
    case errc::bad_checksum: return "bad frame header field 'checksum' (corrupt frame)";
    case errc::truncated_frame: return "truncated frame";
    case errc::payload_size_mismatch:
      return "frame header field 'payload_bytes' does not match 'row_count' x 'width'";
    case errc::bad_table: return "frame header field 'table' names no table of this shard";
    case errc::bad_row_range: return "frame rows lie outside this shard's key range";
    case errc::bad_width: return "frame header field 'width' differs from the table width";
    case errc::bad_sender: return "frame header field 'sender' is not a valid worker id";
    case errc::unexpected_message: return "message type not valid in this protocol state";
    case errc::duplicate_worker:
      return "worker id taken over by a newer connection (this one was silent, or the same "
             "worker process reconnected)";
    case errc::layout_mismatch: return "worker and server table layouts differ";
    case errc::non_finite_value: return "pushed gradient holds NaN or infinity";
    case errc::too_many_requests: return "too many outstanding requests";
    case errc::connection_closed: return "connection closed by peer";
    case errc::server_lost: return "parameter server lost";
    case errc::timeout: return "operation timed out";
    case errc::stopped: return "stopped";
    case errc::invalid_argument: return "invalid argument";
    case errc::bad_file: return "bad file";
    case errc::policy_mismatch:
      return "frame header field 'table' of hello: the worker's consistency/recovery policy "
             "differs from the server's";
    case errc::bad_gradient:
      return "compute_gradient left a gradient value unwritten or computed NaN or infinity";
    case errc::non_finite_update:
      return "push refused: applying it would make a parameter or optimizer state NaN or "
             "infinity";
    case errc::bad_key_order:
      return "frame keys are not strictly increasing (a repeated or out-of-order row)";
    case errc::resource_exhausted: return "out of memory while handling the peer's message";
    case errc::authentication_failed:
      return "authentication failed: the peer did not prove it holds the shared secret";
    case errc::authentication_required:
      return "authentication required: set the same shared secret (tcp_options::secret) or "
             "TLS (tcp_options::tls) on both ends, or tcp_options::allow_unauthenticated for a "
             "trusted network";
    case errc::weak_secret: return "shared secret is empty or shorter than 16 bytes";
    case errc::insecure_secret_file:
      return "secret file is readable by group or others (chmod 600 it)";
    case errc::bad_clock:
      return "frame header field 'clock' out of range: a hello's clock negative, above the "
             "maximum clock or too far ahead of the other workers, or a push or clock message "
             "from a worker already at the maximum clock";
    case errc::tls_setup_failed:
      return "TLS setup failed: a certificate, private key or CA file is missing, unreadable "
             "or invalid (tcp_options::tls)";
    case errc::tls_handshake_failed:
      return "TLS handshake failed: the peer does not speak TLS, or one side's certificate "
             "is missing or not signed by the other's CA";
    case errc::rendezvous_refused:
      return "the rendezvous refused the request: a shard or worker id outside the job's "
             "counts, none left to assign, or no address to publish";
    case errc::recovering:
      return "the shard is rebuilding its state after a restart: read it again later";
    case errc::bad_state:
      return "invalid shard state: a non-finite value, or a clock, step or sequence number out "
             "of range";
    case errc::bad_position:
      return "log position above the highest a server can issue (protocol::max_seq)";
    case errc::worker_id_in_use: return "another live connection holds this worker id: retry later";
    case errc::update_too_large:
      return "push refused: its L2 norm exceeds the server's max_update_norm";
    case errc::policy_refusal:
      return "refused by the server's recovery policy with a code of its own";
  }
  return "unknown asyncps error";
}

ASYNCPS_DECL std::string condition_category_impl::message(int ev) const {
  switch (static_cast<condition>(ev)) {
    case condition::protocol_violation: return "protocol violation";
    case condition::transient: return "transient failure";
    case condition::fatal: return "fatal failure";
  }
  return "unknown asyncps condition";
}

ASYNCPS_DECL bool condition_category_impl::equivalent(const std::error_code& code,
                                                      int cond) const noexcept {
  const auto c = static_cast<condition>(cond);
  if (code.category() == asyncps::error_category()) {
    const auto e = static_cast<errc>(code.value());
    switch (c) {
      case condition::protocol_violation: return is_protocol_violation(e);
      case condition::transient:
        return e == errc::connection_closed || e == errc::timeout || e == errc::recovering ||
               e == errc::worker_id_in_use;
      case condition::fatal:
        return e == errc::server_lost || e == errc::bad_file || e == errc::invalid_argument ||
               e == errc::bad_gradient || e == errc::non_finite_update ||
               e == errc::authentication_required || e == errc::weak_secret ||
               e == errc::insecure_secret_file || e == errc::tls_setup_failed ||
               e == errc::rendezvous_refused || e == errc::update_too_large;
    }
    return false;
  }
  if (c == condition::protocol_violation) {
    // OpenSSL's errors after the TLS handshake (Asio's "asio.ssl" category): a record that
    // fails its integrity check, or bytes that are not TLS.
    return std::string_view(code.category().name()) == "asio.ssl";
  }
  if (c == condition::transient) {
    // Asio's socket errors come in its own "asio.system" category (see posix_errc).
    const auto v = posix_errc(code);
    return v && (*v == std::errc::connection_refused || *v == std::errc::connection_reset ||
                 *v == std::errc::broken_pipe || *v == std::errc::timed_out ||
                 *v == std::errc::network_unreachable || *v == std::errc::connection_aborted);
  }
  return false;
}

}  // namespace asyncps::detail
