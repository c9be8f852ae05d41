// libFuzzer target `checkpoint`: a checkpoint file image read by detail::read_checkpoint
// through a real file descriptor (a memfd, opened again through /proc/self/fd, so the
// library's own file reader runs, buffering included). Input: one byte of mode, then the file
// image. With mode bit 0 set the target first writes the image's `file_bytes` field and its
// trailing checksum right (so mutations get past them into the record); otherwise the image
// is read as it is.
//
// Invariants (abort on violation): a refusal is `errc::bad_file` with a reason naming the
// file; a file is accepted exactly when its header and checksum are right, its record decodes
// from memory (span decoder) ending at the checksum, and its counts agree
// (`state_inconsistency`); an accepted state equals the in-memory decoding and re-encodes to
// the file's record bytes.
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include <sys/mman.h>
#include <unistd.h>

#include "asyncps/detail/codec/shard_state.hpp"
#include "asyncps/recovery/checkpoint/file.hpp"
#include "asyncps/shard_state.hpp"
#include "fuzz_support.hpp"

namespace {

using namespace asyncps;
using fuzz::require;

// The memfd every input is written to (one per process), and the path that opens it.
struct image_file {
  image_file() : fd(::memfd_create("asyncps-fuzz-checkpoint", MFD_CLOEXEC)) {
    require(fd >= 0, "memfd_create");
    path = "/proc/self/fd/" + std::to_string(fd);
  }
  void write(std::span<const std::byte> bytes) const {
    require(::ftruncate(fd, 0) == 0, "ftruncate");
    std::size_t done = 0;
    while (done < bytes.size()) {
      const auto n =
          ::pwrite(fd, bytes.data() + done, bytes.size() - done, static_cast<off_t>(done));
      require(n > 0, "pwrite");
      done += static_cast<std::size_t>(n);
    }
  }
  int fd;
  std::string path;
};

bool header_valid(std::span<const std::byte> f) {
  if (f.size() < detail::checkpoint_header_bytes + detail::checkpoint_checksum_bytes) return false;
  if (std::memcmp(f.data(), detail::checkpoint_magic.data(), 8) != 0) return false;
  if (detail::load_le<std::uint32_t>(f.data() + 8) != detail::checkpoint_format_version)
    return false;
  if (detail::load_le<std::uint32_t>(f.data() + 12) != detail::checkpoint_header_bytes)
    return false;
  if (detail::load_le<std::uint64_t>(f.data() + 16) != f.size()) return false;
  const std::size_t end = f.size() - detail::checkpoint_checksum_bytes;
  return XXH3_64bits(f.data(), end) == detail::load_le<std::uint64_t>(f.data() + end);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const image_file file;
  if (size == 0) return 0;
  std::vector<std::byte> image(reinterpret_cast<const std::byte*>(data) + 1,
                               reinterpret_cast<const std::byte*>(data) + size);
  if ((data[0] & 1) != 0 && image.size() >= detail::checkpoint_header_bytes + 8) {
    detail::store_le(image.data() + 16, static_cast<std::uint64_t>(image.size()));
    const std::size_t end = image.size() - 8;
    detail::store_le(image.data() + end,
                     static_cast<std::uint64_t>(XXH3_64bits(image.data(), end)));
  }
  file.write(image);

  shard_state st;
  std::string why;
  const auto r = detail::read_checkpoint(file.path, st, &why);

  // What the file should give: the header and checksum checked here, the record decoded from
  // memory.
  bool expect_ok = header_valid(image);
  shard_state mem;
  std::span<const std::byte> record;
  if (expect_ok) {
    record = std::span<const std::byte>(image).subspan(
        detail::checkpoint_header_bytes,
        image.size() - detail::checkpoint_header_bytes - detail::checkpoint_checksum_bytes);
    std::string ignored;
    expect_ok =
        !detail::decode_state(record, mem, ignored) && detail::state_inconsistency(mem).empty();
  }
  if (!r) {
    require(r.error() == errc::bad_file, "a bad image is errc::bad_file");
    require(why.rfind("checkpoint " + file.path + ": ", 0) == 0, "the reason names the file");
    require(!expect_ok, "a valid image is accepted");
    return 0;
  }
  require(expect_ok, "only a valid image is accepted");
  require(detail::state_inconsistency(st).empty(), "an accepted state is consistent");
  std::vector<std::byte> again(detail::encoded_state_size(st));
  detail::encode_state(st, std::span<std::byte>(again));
  // The format's one ambiguity: without workers, has_last_seq 0 and 1 both say "no last_seq".
  std::vector<std::byte> want(record.begin(), record.end());
  if (st.num_workers == 0) detail::store_le(want.data() + 20, std::uint32_t{0});
  require(again == want,
          "an accepted state re-encodes to the file's record (file and memory decoders agree)");
  return 0;
}
