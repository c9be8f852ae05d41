// asyncps — TLS for the TCP transport: the options (certificate files) and the OpenSSL context
// they make (docs/security.md, "TLS"). This header needs OpenSSL only, not Asio, so a program's
// start-up code can check the files before it builds any transport:
//
//   asyncps::tls_options tls{.certificate_file = "node.pem", .private_key_file = "node.key",
//                            .ca_file = "ca.pem"};
//   std::string why;
//   if (auto ctx = asyncps::make_tls_context(tls, why); !ctx) { /* print why */ }
//   asyncps::tcp_transport t(ex, {.tls = tls});  // every connection of this node uses TLS
#pragma once

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <system_error>
#include <utility>

#include <openssl/err.h>
#include <openssl/ssl.h>

#include "asyncps/error.hpp"
#include "asyncps/result.hpp"

namespace asyncps {

/// Mutual TLS for `tcp_transport` (`tcp_options::tls`). Every node presents its certificate and
/// checks the peer's against `ca_file`, in both directions: a listener refuses a peer without
/// a certificate. Any certificate the CA signs is a member of the run (names and addresses are
/// not checked), so use a CA of its own for the cluster. TLS 1.3 only; no session resumption.
/// All three files empty: no TLS. Thread safety: a plain aggregate.
struct tls_options {
  /// PEM file: this node's certificate, optionally followed by intermediate CA certificates.
  std::string certificate_file;
  /// PEM file: the private key of `certificate_file` (unencrypted; keep it mode 0600).
  std::string private_key_file;
  /// PEM file: the CA certificate(s) that sign the peers' certificates.
  std::string ca_file;
  /// Check the peer's certificate (both directions). Off: the traffic is encrypted, but an
  /// on-path attacker can pose as either end (tests only); `ca_file` may then be empty.
  bool verify_peer = true;

  /// Whether TLS is asked for (any file set).
  bool enabled() const noexcept {
    return !certificate_file.empty() || !private_key_file.empty() || !ca_file.empty();
  }
};

namespace detail {
struct ssl_ctx_deleter {
  void operator()(SSL_CTX* c) const noexcept { SSL_CTX_free(c); }
};

// "what 'path': reason" from errno (when the file cannot be opened) or OpenSSL's error queue.
inline std::string tls_file_problem(const char* what, const std::string& path) {
  std::string out = std::string(what) + " '" + path + "': ";
  if (std::FILE* f = std::fopen(path.c_str(), "rb")) {
    std::fclose(f);
  } else {
    ERR_clear_error();
    return out + std::strerror(errno);
  }
  const unsigned long e = ERR_peek_last_error();
  const char* reason = e != 0 ? ERR_reason_error_string(e) : nullptr;
  ERR_clear_error();
  return out + (reason != nullptr ? reason : "not valid") + " (OpenSSL)";
}
}  // namespace detail

/// An owned OpenSSL context (`SSL_CTX_free` on destruction).
using ssl_ctx_ptr = std::unique_ptr<SSL_CTX, detail::ssl_ctx_deleter>;

/// Builds the OpenSSL context of `o`: TLS 1.3, `o.certificate_file` and `o.private_key_file` as
/// this node's identity, `o.ca_file` as the only trust anchor, peer verification per
/// `o.verify_peer` (a listener also requires a certificate), no session tickets. The same
/// context serves accepted and made connections.
///
/// Errors: `errc::tls_setup_failed`, with `why` set to one line naming the file and the reason
/// (e.g. `certificate file 'node.pem': No such file or directory`, `... 'node.pem': no start
/// line (OpenSSL)` for a file that is not PEM, `private key file 'node.key': key values
/// mismatch (OpenSSL)`): a missing certificate or key file name, a file that cannot be read or
/// parsed, a key that does not match the certificate, or no `ca_file` while `verify_peer`.
/// `why` is left as it is on success. Blocking file I/O: call it at start-up. Thread safety:
/// any thread (OpenSSL's error queue is per thread).
inline result<ssl_ctx_ptr> make_tls_context(const tls_options& o, std::string& why) {
  const auto fail = [&](std::string text) -> result<ssl_ctx_ptr> {
    why = std::move(text);
    return make_error_code(errc::tls_setup_failed);
  };
  if (o.certificate_file.empty()) return fail("TLS needs a certificate file (none given)");
  if (o.private_key_file.empty()) return fail("TLS needs a private key file (none given)");
  if (o.verify_peer && o.ca_file.empty())
    return fail("TLS with peer verification needs a CA file (none given)");
  ERR_clear_error();
  ssl_ctx_ptr ctx(SSL_CTX_new(TLS_method()));
  if (!ctx || SSL_CTX_set_min_proto_version(ctx.get(), TLS1_3_VERSION) != 1) {
    ERR_clear_error();
    return fail("TLS: OpenSSL cannot make a TLS 1.3 context");
  }
  SSL_CTX_set_options(ctx.get(), SSL_OP_NO_TICKET);
  SSL_CTX_set_num_tickets(ctx.get(), 0);
  SSL_CTX_set_session_cache_mode(ctx.get(), SSL_SESS_CACHE_OFF);
  if (SSL_CTX_use_certificate_chain_file(ctx.get(), o.certificate_file.c_str()) != 1)
    return fail(detail::tls_file_problem("certificate file", o.certificate_file));
  if (SSL_CTX_use_PrivateKey_file(ctx.get(), o.private_key_file.c_str(), SSL_FILETYPE_PEM) != 1 ||
      SSL_CTX_check_private_key(ctx.get()) != 1)
    return fail(detail::tls_file_problem("private key file", o.private_key_file));
  if (!o.ca_file.empty() &&
      SSL_CTX_load_verify_locations(ctx.get(), o.ca_file.c_str(), nullptr) != 1)
    return fail(detail::tls_file_problem("CA file", o.ca_file));
  SSL_CTX_set_verify(
      ctx.get(),
      o.verify_peer ? SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT : SSL_VERIFY_NONE, nullptr);
  return result<ssl_ctx_ptr>(std::move(ctx));
}

}  // namespace asyncps
