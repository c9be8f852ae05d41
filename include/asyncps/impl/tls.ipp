// asyncps — the definitions of tls.hpp's functions (make_tls_context, reading a peer's identity).
//
// Not a header to include on its own: tls.hpp includes it (header-only, the default), or
// asyncps/src.hpp compiles it once (ASYNCPS_SEPARATE_COMPILATION defined; docs/build_time.md,
// "Separate compilation"). It does not include that header back (no include cycle): whoever
// includes this file has included the header first.
#pragma once

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>

#include <memory>
#include <string_view>

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include "asyncps/detail/config.hpp"
#include "asyncps/peer_identity.hpp"

namespace asyncps {

namespace detail {
ASYNCPS_DECL std::string tls_file_problem(const char* what, const std::string& path) {
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

ASYNCPS_DECL const char* read_peer_identity(SSL* ssl, bool require,
                                            std::shared_ptr<const peer_identity>& out) {
  out.reset();
  X509* cert = SSL_get0_peer_certificate(ssl);
  GENERAL_NAMES* sans = cert != nullptr ? static_cast<GENERAL_NAMES*>(X509_get_ext_d2i(
                                              cert, NID_subject_alt_name, nullptr, nullptr))
                                        : nullptr;
  peer_identity id;
  const char* refusal = nullptr;
  const int count = sans != nullptr ? sk_GENERAL_NAME_num(sans) : 0;
  for (int i = 0; i < count && refusal == nullptr; ++i) {
    const GENERAL_NAME* g = sk_GENERAL_NAME_value(sans, i);
    if (g->type != GEN_URI) continue;
    const ASN1_IA5STRING* u = g->d.uniformResourceIdentifier;
    const std::string_view uri(reinterpret_cast<const char*>(ASN1_STRING_get0_data(u)),
                               static_cast<std::size_t>(ASN1_STRING_length(u)));
    if (!is_identity_uri(uri)) continue;
    if (auto n = parse_peer_name(uri)) {
      id.names.push_back(*n);
    } else {
      refusal = "the peer's certificate names a malformed asyncps identity (a URI SAN "
                "\"asyncps://<role>/<id>\" is expected)";
    }
  }
  GENERAL_NAMES_free(sans);
  ERR_clear_error();
  if (refusal != nullptr) return refusal;
  if (id.names.empty())
    return require ? "the peer's certificate names no asyncps identity "
                     "(tls_options::require_identity)"
                   : nullptr;
  out = std::make_shared<const peer_identity>(std::move(id));
  return nullptr;
}
}  // namespace detail

ASYNCPS_DECL result<ssl_ctx_ptr> make_tls_context(const tls_options& o, std::string& why) {
  const auto fail = [&](std::string text) -> result<ssl_ctx_ptr> {
    why = std::move(text);
    return make_error_code(errc::tls_setup_failed);
  };
  if (o.certificate_file.empty()) return fail("TLS needs a certificate file (none given)");
  if (o.private_key_file.empty()) return fail("TLS needs a private key file (none given)");
  if (o.verify_peer && o.ca_file.empty())
    return fail("TLS with peer verification needs a CA file (none given)");
  if (o.require_identity && !o.verify_peer)
    return fail("TLS: require_identity needs verify_peer (an unverified certificate names no one)");
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
