// asyncps — recovery::chain_replication's own error codes (category "asyncps.chain"). They
// travel in error frames as `policy_error_base` + code (error.hpp; docs/wire-format.md,
// "error"); both ends of a connection run one policy, so a worker of this policy reads them
// back as these codes (`chain_replication::error_enum`).
#pragma once

#include <string>
#include <string_view>
#include <system_error>

#include "asyncps/error.hpp"

namespace asyncps::recovery {

/// Chain replication's error codes. Values are stable (they travel on the wire and may appear
/// in logs) and never reused.
enum class chain_errc {
  /// (transient) this server is not the head of its shard's chain: a worker tries the shard's
  /// next server (`worker_options::replicas`); routine during a failover
  not_head = 1,
  /// (fatal) every server that held the shard's state failed (the whole chain died): the
  /// shard's parameters and the pushes applied to them are gone, and the server that answers
  /// refuses to serve its initial state in their place
  shard_lost = 2,
  /// (transient) a `chain_hello` named the member id of a chain link that is live: its
  /// predecessor sent something (an entry, a state, a heartbeat) within
  /// `chain_options::link_silence`. The newcomer is refused and the live link stays; a real
  /// predecessor retries (it gets in once the old link is closed or silent past that bound)
  member_id_in_use = 3,
};

}  // namespace asyncps::recovery

namespace asyncps::detail {

class chain_category_impl final : public std::error_category {
 public:
  const char* name() const noexcept override { return "asyncps.chain"; }
  std::string message(int ev) const override {
    using recovery::chain_errc;
    switch (static_cast<chain_errc>(ev)) {
      case chain_errc::not_head:
        return "this server is not the head of its shard's chain (chain replication)";
      case chain_errc::shard_lost:
        return "every server that held this shard's state failed: the shard's state is lost "
               "(chain replication)";
      case chain_errc::member_id_in_use:
        return "a live chain link holds this member id: retry later (chain replication)";
    }
    return "unknown chain replication error";
  }
  // `not_head` and `member_id_in_use` are `condition::transient`, `shard_lost` is `fatal`.
  bool equivalent(int ev, const std::error_condition& cond) const noexcept override {
    if (cond.category() != condition_category()) return false;
    const auto e = static_cast<recovery::chain_errc>(ev);
    switch (static_cast<condition>(cond.value())) {
      case condition::transient:
        return e == recovery::chain_errc::not_head || e == recovery::chain_errc::member_id_in_use;
      case condition::fatal: return e == recovery::chain_errc::shard_lost;
      case condition::protocol_violation: return false;
    }
    return false;
  }
};

}  // namespace asyncps::detail

namespace asyncps::recovery {

/// The category of `chain_errc` ("asyncps.chain"). Thread safety: safe from any thread.
inline const std::error_category& chain_category() noexcept {
  static const detail::chain_category_impl instance;
  return instance;
}

/// Makes a `std::error_code` from a `chain_errc` (found by ADL).
inline std::error_code make_error_code(chain_errc e) noexcept {
  return {static_cast<int>(e), chain_category()};
}

}  // namespace asyncps::recovery

template <>
struct std::is_error_code_enum<asyncps::recovery::chain_errc> : std::true_type {};
