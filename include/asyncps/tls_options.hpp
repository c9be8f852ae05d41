// asyncps — the TLS options of the TCP transport (`tcp_options::tls`): which certificate and
// key files a node uses (docs/security.md, "TLS"). No OpenSSL here: asyncps/tls.hpp turns these
// options into an OpenSSL context, and the transport's definitions (transport/impl/tcp.ipp) use
// it, so a translation unit that only declares the transport parses no TLS.
#pragma once

#include <string>

namespace asyncps {

/// Mutual TLS for `tcp_transport` (`tcp_options::tls`). Every node presents its certificate and
/// checks the peer's against `ca_file`, in both directions: a listener refuses a peer without
/// a certificate. Use a CA of its own for the cluster. Host names and addresses are not
/// checked; what a certificate may do is what its identities say (`peer_identity`: URI subject
/// alternative names `asyncps://<role>/<id>`, docs/security.md "Identities"): a shard server
/// takes a worker hello only for a worker id the certificate names, the chain master and chain
/// members a chain_hello only for a member it names, the rendezvous an announce or a worker id
/// only as named. A certificate naming no asyncps identity may act as any member (as a shared
/// secret does) unless `require_identity`. TLS 1.3 only; no session resumption. All three
/// files empty: no TLS. Thread safety: a plain aggregate.
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
  /// Refuse a peer whose certificate names no asyncps identity (both directions: the TLS
  /// handshake fails with `errc::tls_handshake_failed`). Off: such a peer may claim any id.
  /// A certificate naming a malformed asyncps URI (e.g. `asyncps://wroker/1`) is refused
  /// either way. Needs `verify_peer` (identities of unverified certificates mean nothing).
  bool require_identity = false;

  /// Whether TLS is asked for (any file set).
  bool enabled() const noexcept {
    return !certificate_file.empty() || !private_key_file.empty() || !ca_file.empty();
  }
};

}  // namespace asyncps
