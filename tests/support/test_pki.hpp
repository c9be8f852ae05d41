// Test helper: a throwaway certificate authority and node certificates (optionally naming
// asyncps identities as URI SANs) for TLS tests and the bench, made with OpenSSL's C API (no
// `openssl` command needed) as PEM files in a fresh temporary directory that is removed with
// the object. Nothing here is a secret worth keeping: the keys live only as long as the test.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include "asyncps/tls.hpp"

namespace asyncps::test {

/// A CA (EC P-256, self-signed) that issues node certificates (EC P-256, SHA-256, valid from an
/// hour ago for a day; usable for TLS servers and clients). Throws `std::runtime_error` when
/// OpenSSL or the file system fails. Thread safety: one thread at a time.
class test_pki {
 public:
  /// Makes the CA as `<dir>/<name>-ca.pem` in a new directory under the system's temp dir.
  explicit test_pki(const std::string& name = "asyncps-test") {
    std::string tmpl =
        (std::filesystem::temp_directory_path() / ("asyncps-pki-" + name + "-XXXXXX")).string();
    if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("test_pki: mkdtemp failed");
    dir_ = tmpl;
    ca_key_.reset(EVP_EC_gen("P-256"));
    if (!ca_key_) throw std::runtime_error("test_pki: EC key generation failed");
    ca_cert_ = make_cert(name + " CA", ca_key_.get(), nullptr, ca_key_.get(), true);
    ca_file_ = dir_ / (name + "-ca.pem");
    write_cert(ca_file_, ca_cert_.get());
  }
  ~test_pki() {
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }
  test_pki(const test_pki&) = delete;
  test_pki& operator=(const test_pki&) = delete;

  /// Issues a certificate for `common_name` signed by this CA and writes it and its key (mode
  /// 0600) next to the CA file. `uris`: URI subject alternative names, e.g. an asyncps identity
  /// "asyncps://worker/1" (docs/security.md, "Identities"); none: no SAN extension. Returns the
  /// `tls_options` of a node holding it and trusting this CA.
  tls_options issue(const std::string& common_name, const std::vector<std::string>& uris = {}) {
    key_ptr key(EVP_EC_gen("P-256"));
    if (!key) throw std::runtime_error("test_pki: EC key generation failed");
    const auto cert = make_cert(common_name, key.get(), ca_cert_.get(), ca_key_.get(), false, uris);
    tls_options o;
    o.certificate_file = (dir_ / (common_name + ".pem")).string();
    o.private_key_file = (dir_ / (common_name + ".key")).string();
    o.ca_file = ca_file_.string();
    write_cert(o.certificate_file, cert.get());
    write_key(o.private_key_file, key.get());
    return o;
  }

  /// The CA's certificate file (PEM).
  const std::filesystem::path& ca_file() const noexcept { return ca_file_; }
  /// The directory holding every file (removed by the destructor).
  const std::filesystem::path& dir() const noexcept { return dir_; }

 private:
  struct key_deleter {
    void operator()(EVP_PKEY* k) const noexcept { EVP_PKEY_free(k); }
  };
  struct cert_deleter {
    void operator()(X509* c) const noexcept { X509_free(c); }
  };
  using key_ptr = std::unique_ptr<EVP_PKEY, key_deleter>;
  using cert_ptr = std::unique_ptr<X509, cert_deleter>;

  static void add_ext(X509* cert, X509* issuer, int nid, const char* value) {
    X509V3_CTX ctx;
    X509V3_set_ctx_nodb(&ctx);
    X509V3_set_ctx(&ctx, issuer != nullptr ? issuer : cert, cert, nullptr, nullptr, 0);
    X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value);
    if (ext == nullptr || X509_add_ext(cert, ext, -1) != 1) {
      X509_EXTENSION_free(ext);
      throw std::runtime_error("test_pki: cannot add a certificate extension");
    }
    X509_EXTENSION_free(ext);
  }

  // A certificate for `cn` holding `key`'s public key, signed by `signer_key` as `issuer`
  // (nullptr: self-signed).
  // `uris`: its URI subject alternative names (none: no SAN extension).
  cert_ptr make_cert(const std::string& cn, EVP_PKEY* key, X509* issuer, EVP_PKEY* signer_key,
                     bool ca, const std::vector<std::string>& uris = {}) {
    cert_ptr cert(X509_new());
    if (!cert) throw std::runtime_error("test_pki: X509_new failed");
    X509* c = cert.get();
    bool ok = X509_set_version(c, 2) == 1 &&
              ASN1_INTEGER_set(X509_get_serialNumber(c), static_cast<long>(++serial_)) == 1 &&
              X509_gmtime_adj(X509_getm_notBefore(c), -3600) != nullptr &&
              X509_gmtime_adj(X509_getm_notAfter(c), 86400) != nullptr &&
              X509_set_pubkey(c, key) == 1;
    X509_NAME* subject = X509_get_subject_name(c);
    ok = ok && X509_NAME_add_entry_by_txt(subject, "CN", MBSTRING_ASC,
                                          reinterpret_cast<const unsigned char*>(cn.c_str()), -1,
                                          -1, 0) == 1;
    ok = ok &&
         X509_set_issuer_name(c, issuer != nullptr ? X509_get_subject_name(issuer) : subject) == 1;
    if (!ok) throw std::runtime_error("test_pki: cannot fill in a certificate");
    if (ca) {
      add_ext(c, issuer, NID_basic_constraints, "critical,CA:TRUE");
      add_ext(c, issuer, NID_key_usage, "critical,keyCertSign,cRLSign");
    } else {
      add_ext(c, issuer, NID_basic_constraints, "critical,CA:FALSE");
      add_ext(c, issuer, NID_key_usage, "critical,digitalSignature");
      add_ext(c, issuer, NID_ext_key_usage, "serverAuth,clientAuth");
      std::string san;
      for (const auto& u : uris) san += (san.empty() ? "URI:" : ",URI:") + u;
      if (!san.empty()) add_ext(c, issuer, NID_subject_alt_name, san.c_str());
    }
    if (X509_sign(c, signer_key, EVP_sha256()) == 0)
      throw std::runtime_error("test_pki: X509_sign failed");
    return cert;
  }

  static std::FILE* open_for_writing(const std::filesystem::path& path) {
    std::FILE* f = std::fopen(path.c_str(), "wb");
    if (f == nullptr) throw std::runtime_error("test_pki: cannot write " + path.string());
    return f;
  }
  static void write_cert(const std::filesystem::path& path, X509* cert) {
    std::FILE* f = open_for_writing(path);
    const bool ok = PEM_write_X509(f, cert) == 1;
    std::fclose(f);
    if (!ok) throw std::runtime_error("test_pki: cannot write " + path.string());
  }
  static void write_key(const std::filesystem::path& path, EVP_PKEY* key) {
    std::FILE* f = open_for_writing(path);
    std::filesystem::permissions(path, std::filesystem::perms::owner_read |
                                           std::filesystem::perms::owner_write);
    const bool ok = PEM_write_PrivateKey(f, key, nullptr, nullptr, 0, nullptr, nullptr) == 1;
    std::fclose(f);
    if (!ok) throw std::runtime_error("test_pki: cannot write " + path.string());
  }

  std::filesystem::path dir_;
  std::filesystem::path ca_file_;
  key_ptr ca_key_;
  cert_ptr ca_cert_;
  long serial_ = 0;
};

}  // namespace asyncps::test
