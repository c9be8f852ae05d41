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

#include "asyncps/detail/config.hpp"
#include "asyncps/error.hpp"
#include "asyncps/peer_identity.hpp"
#include "asyncps/result.hpp"
#include "asyncps/tls_options.hpp"

namespace asyncps {

namespace detail {
struct ssl_ctx_deleter {
  void operator()(SSL_CTX* c) const noexcept { SSL_CTX_free(c); }
};

// "what 'path': reason" from errno (when the file cannot be opened) or OpenSSL's error queue.
ASYNCPS_DECL std::string tls_file_problem(const char* what, const std::string& path);

// The asyncps identity of the verified peer of `ssl` (after its handshake) into `out`: null
// when its certificate has no URI SAN starting with "asyncps:". Returns nullptr, or why the
// peer is refused (a string with static storage): a malformed asyncps URI, or none while
// `require`. Thread safety: the thread that owns `ssl`.
ASYNCPS_DECL const char* read_peer_identity(SSL* ssl, bool require,
                                            std::shared_ptr<const peer_identity>& out);
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
/// parsed, a key that does not match the certificate, no `ca_file` while `verify_peer`, or
/// `require_identity` without `verify_peer`.
/// `why` is left as it is on success. Blocking file I/O: call it at start-up. Thread safety:
/// any thread (OpenSSL's error queue is per thread).
ASYNCPS_DECL result<ssl_ctx_ptr> make_tls_context(const tls_options& o, std::string& why);

}  // namespace asyncps

#if !defined(ASYNCPS_SEPARATE_COMPILATION)
#include "asyncps/impl/tls.ipp"
#endif
