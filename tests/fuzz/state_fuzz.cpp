// libFuzzer target `state`: a chain state transfer's payload (detail/codec/shard_state.hpp)
// decoded as a successor decodes it, then installed into a shard as the chain's server part
// does (shard_core::restore_state). Input: the payload bytes.
//
// Invariants (abort on violation): a refusal names the field; an accepted payload re-encodes
// to the same bytes (has_last_seq aside when there are no workers: 0 and 1 then mean the same); a
// state that restores leaves the shard holding exactly it (save_state gives it back, the server
// clock being the minimum of its worker clocks), and one that is refused leaves the shard
// unchanged. A refusal is `layout_mismatch` or `bad_state` and names the field; what restores
// is a state a run can reach (`shard_core::check_state`: values and optimizer state finite,
// worker clocks in [0, protocol::max_clock], steps, applied counts and last_seq at most
// protocol::max_seq).
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "asyncps/detail/codec/shard_state.hpp"
#include "asyncps/detail/server/shard_core.hpp"
#include "asyncps/optimizer/optimizers.hpp"
#include "asyncps/protocol.hpp"
#include "asyncps/shard_state.hpp"
#include "fuzz_support.hpp"

namespace {

using namespace asyncps;
using fuzz::require;
// The shard a state arrives at: momentum keeps one optimizer plane, so its state is checked.
using core_t = detail::shard_core<optimizer::momentum, int, int>;

std::vector<std::byte> encode(const shard_state& st) {
  std::vector<std::byte> out(detail::encoded_state_size(st));
  detail::encode_state(st, std::span<std::byte>(out));
  return out;
}

bool same_tables(const shard_state& a, const shard_state& b) {
  if (a.tables.size() != b.tables.size()) return false;
  for (std::size_t i = 0; i < a.tables.size(); ++i) {
    const auto &x = a.tables[i], &y = b.tables[i];
    if (!(x.spec == y.spec) || !(x.range == y.range) || x.step != y.step ||
        x.values.size() != y.values.size() ||
        x.optimizer_state.size() != y.optimizer_state.size() ||
        (!x.values.empty() &&
         std::memcmp(x.values.data(), y.values.data(), x.values.size() * 4) != 0) ||
        (!x.optimizer_state.empty() &&
         std::memcmp(x.optimizer_state.data(), y.optimizer_state.data(),
                     x.optimizer_state.size() * 4) != 0))
      return false;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto in = std::as_bytes(std::span(data, size));
  shard_state st;
  std::string why;
  if (detail::decode_state(in, st, why)) {
    require(why.find("state transfer: ") != std::string::npos, "a refusal names the field");
    return 0;
  }
  require(detail::encoded_state_size(st) == size, "the encoded size is the payload's");
  // The format's one ambiguity: without workers, has_last_seq 0 and 1 both say "no last_seq".
  std::vector<std::byte> want(in.begin(), in.end());
  if (st.num_workers == 0) detail::store_le(want.data() + 20, std::uint32_t{0});
  const auto again = encode(st);
  require(again == want, "an accepted state re-encodes exactly");

  // Shard 0 of 2, 2 workers: table 0 rows [0, 3) x 2, table 1 rows [0, 4) x 1.
  const std::vector<table_spec> layout{table_spec{0, 6, 2, 0.5f}, table_spec{1, 8, 1, 0.0f}};
  core_t core(0, 2, 2, layout, 3, optimizer::momentum{});
  shard_state before;
  core.save_state(before);
  std::string detail;
  if (const auto ec = core.restore_state(st, detail)) {
    require(ec == errc::layout_mismatch || ec == errc::bad_state, "restore refuses a bad state");
    require(!detail.empty() &&
                (ec != errc::bad_state || detail.find("field '") != std::string::npos),
            "a restore refusal names what is wrong");
    shard_state unchanged;
    core.save_state(unchanged);
    require(same_tables(unchanged, before) && unchanged.worker_clocks == before.worker_clocks &&
                unchanged.applied == before.applied && unchanged.last_seq == before.last_seq,
            "a refused state changes nothing");
    return 0;
  }
  const auto finite = [](const std::vector<float>& v) {
    return std::all_of(v.begin(), v.end(), [](float x) { return std::isfinite(x); });
  };
  for (const auto& t : st.tables)
    require(finite(t.values) && finite(t.optimizer_state) && t.step <= protocol::max_seq,
            "a restored table is finite, its step at most max_seq");
  for (const auto c : st.worker_clocks)
    require(c >= 0 && c <= protocol::max_clock, "restored clocks lie in [0, max_clock]");
  for (const auto a : st.applied) require(a <= protocol::max_seq, "restored counts <= max_seq");
  for (const auto q : st.last_seq) require(q <= protocol::max_seq, "restored last_seq <= max_seq");
  shard_state now;
  core.save_state(now);
  require(same_tables(now, st), "a restored shard holds the state's tables");
  require(now.worker_clocks == st.worker_clocks && now.applied == st.applied,
          "a restored shard holds the state's clocks and counts");
  require(st.last_seq.empty() || now.last_seq == st.last_seq, "last_seq restored when sent");
  require(now.server_clock == *std::min_element(st.worker_clocks.begin(), st.worker_clocks.end()),
          "the server clock is the minimum of the restored worker clocks");
  return 0;
}
