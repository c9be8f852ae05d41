// fashion — loading Fashion-MNIST (or any MNIST-shaped IDX data set) for the asyncps examples.
//
// The files are the gzip-compressed IDX files of the original distribution (installed on
// Debian by the package `dataset-fashion-mnist` under /usr/share/datasets/fashion-mnist/):
//
//   images: u32be magic 2051, u32be count, u32be rows (28), u32be cols (28), count*784 u8 pixels
//   labels: u32be magic 2049, u32be count, count u8 labels (each < 10)
//
// Errors are reported as `load_result<T>`: a Boost.Outcome `std_result` whose error is a
// `load_error` (an `asyncps::errc::bad_file` code plus a message naming the file and what is
// wrong), so callers can both test the code and show the message:
//
//   auto r = fashion::load_fashion_mnist(dir);
//   if (!r) { std::cerr << r.error().message << '\n'; return 1; }
//   auto& [train, test] = r.value();
#pragma once

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include <boost/outcome/std_result.hpp>
#include <zlib.h>

#include "asyncps/error.hpp"
#include "asyncps/table.hpp"

#include "../common/load_result.hpp"

namespace fashion {

/// Number of pixels in one image (28 x 28).
inline constexpr std::size_t image_pixels = 28 * 28;
/// Number of classes; every label is in [0, num_classes).
inline constexpr std::size_t num_classes = 10;
/// The largest image count a header may announce (guards against allocating for a corrupt
/// header; Fashion-MNIST has 60,000).
inline constexpr std::uint32_t max_images = 1u << 24;

/// An in-memory labelled image set.
/// Invariant (as produced by the loaders): `images.rows() == labels.size()`,
/// `images.cols() == image_pixels`, every pixel in [0, 1], every label < `num_classes`.
struct dataset {
  asyncps::row_matrix images;        ///< `size() x 784` floats, pixel / 255, row-major
  std::vector<std::uint8_t> labels;  ///< `size()` class indices in [0, 10)
  /// A part of a file (`load_idx` with a `partition`): the index in the file of example 0.
  std::size_t first = 0;
  /// A part of a file: the number of examples in the whole file; 0: this is the whole file.
  std::size_t file_examples = 0;

  /// Number of examples held. Complexity: O(1).
  std::size_t size() const noexcept { return labels.size(); }
  /// Number of examples in the whole file these came from (`size()` for a whole file).
  std::size_t file_size() const noexcept { return file_examples != 0 ? file_examples : size(); }
};

/// Part `index` of `count` of a file's examples: the contiguous, balanced split
/// `asyncps::shard_range(n, index, count)` (the same split the models draw a worker's
/// minibatches from). Precondition: `index < count`.
struct partition {
  std::uint32_t index = 0;
  std::uint32_t count = 1;
};

// `load_error`, `load_result` and their ADL hooks live in examples/common/load_result.hpp.
using asyncps::examples::load_error;
using asyncps::examples::load_result;
using asyncps::examples::make_error_code;
using asyncps::examples::outcome_throw_as_system_error_with_payload;

namespace detail {

inline load_error file_error(const std::filesystem::path& file, const std::string& what) {
  return {make_error_code(asyncps::errc::bad_file), file.string() + ": " + what};
}

/// Owns a gzFile; closes it on destruction.
class gz_reader {
 public:
  explicit gz_reader(const std::filesystem::path& file) noexcept
      : file_(gzopen(file.c_str(), "rb")) {
    if (file_ != nullptr) gzbuffer(file_, 1u << 17);
  }
  gz_reader(const gz_reader&) = delete;
  gz_reader& operator=(const gz_reader&) = delete;
  ~gz_reader() {
    if (file_ != nullptr) gzclose(file_);
  }

  bool is_open() const noexcept { return file_ != nullptr; }

  /// Reads up to `n` bytes (n <= INT_MAX); returns the number read, or -1 on a gzip error.
  long read(void* out, std::size_t n) noexcept {
    std::size_t done = 0;
    while (done < n) {
      const int got =
          gzread(file_, static_cast<unsigned char*>(out) + done, static_cast<unsigned>(n - done));
      if (got < 0) return -1;
      if (got == 0) break;
      done += static_cast<std::size_t>(got);
    }
    return static_cast<long>(done);
  }

  /// zlib's description of the last error (without the "<path>: " zlib puts before it).
  std::string error_text(const std::filesystem::path& file) const {
    int errnum = 0;
    const char* text = gzerror(file_, &errnum);
    std::string out = text != nullptr ? std::string(text) : std::string("unknown gzip error");
    const std::string prefix = file.string() + ": ";
    if (out.compare(0, prefix.size(), prefix) == 0) out.erase(0, prefix.size());
    return out;
  }

 private:
  gzFile file_;
};

/// Opens `file` and reads its `words` big-endian u32 header words, checking the magic.
inline load_result<std::array<std::uint32_t, 4>> read_header(gz_reader& in,
                                                             const std::filesystem::path& file,
                                                             std::size_t words,
                                                             std::uint32_t magic) {
  std::error_code ec;
  if (!std::filesystem::exists(file, ec)) {
    return file_error(file, "missing (install the Debian package dataset-fashion-mnist or pass "
                            "--data DIR)");
  }
  if (!in.is_open()) {
    return file_error(file, "cannot be opened (" + std::generic_category().message(errno) + ")");
  }
  std::array<unsigned char, 16> bytes{};
  const long got = in.read(bytes.data(), words * 4);
  if (got < 0) return file_error(file, "gzip error: " + in.error_text(file));
  if (static_cast<std::size_t>(got) < words * 4) {
    return file_error(file, "truncated header (" + std::to_string(got) + " of " +
                                std::to_string(words * 4) + " bytes)");
  }
  std::array<std::uint32_t, 4> header{};
  for (std::size_t w = 0; w < words; ++w) {
    header[w] = (std::uint32_t{bytes[4 * w]} << 24) | (std::uint32_t{bytes[4 * w + 1]} << 16) |
                (std::uint32_t{bytes[4 * w + 2]} << 8) | std::uint32_t{bytes[4 * w + 3]};
  }
  if (header[0] != magic) {
    return file_error(file, "bad magic " + std::to_string(header[0]) + " (expected " +
                                std::to_string(magic) + ")");
  }
  if (header[1] == 0) return file_error(file, "holds no items");
  if (header[1] > max_images) {
    return file_error(file, "implausible item count " + std::to_string(header[1]) + " (limit " +
                                std::to_string(max_images) + ")");
  }
  return header;
}

/// Fails unless `in` is at its end.
inline load_result<void> expect_end(gz_reader& in, const std::filesystem::path& file,
                                    std::uint32_t count, const char* what) {
  unsigned char extra = 0;
  const long got = in.read(&extra, 1);
  if (got < 0) return file_error(file, "gzip error: " + in.error_text(file));
  if (got > 0) {
    return file_error(file,
                      std::string("trailing bytes after ") + std::to_string(count) + " " + what);
  }
  return BOOST_OUTCOME_V2_NAMESPACE::success();
}

}  // namespace detail

/// Loads one image file and its label file (gzip-compressed IDX, see the top of this header),
/// or only the examples of `part` of them (gzip has no random access: the files are still
/// decompressed whole, but only the part is kept, so memory grows with the part).
///
/// Returns a `dataset` of `n` examples (or the part's: `first` and `file_examples` then say
/// where it lies in the file): `images` is `n x 784` with pixels scaled to [0, 1].
/// Errors: a `load_error` with code `asyncps::errc::bad_file` (condition `fatal`) and a message
/// "<file>: ..." when a file is missing or unreadable, is not valid gzip, has a bad magic
/// (2051 images / 2049 labels), an image size other than 28 x 28, a zero or implausible count,
/// fewer bytes than announced ("truncated after k of n images") or trailing bytes, a label
/// >= 10, or when the two files' counts differ. Memory grows with the bytes actually read, so a
/// corrupt count fails as truncation rather than as a huge allocation.
/// Exceptions: `std::bad_alloc` only. Thread safety: reentrant.
/// Complexity: O(n * 784) time; about 5 * n * 784 bytes at the peak.
inline load_result<dataset> load_idx(const std::filesystem::path& images_gz,
                                     const std::filesystem::path& labels_gz, partition part = {}) {
  detail::gz_reader images_in(images_gz);
  auto image_header = detail::read_header(images_in, images_gz, 4, 2051);
  if (!image_header) return image_header.error();
  const std::uint32_t n = image_header.value()[1];
  const std::uint32_t rows = image_header.value()[2];
  const std::uint32_t cols = image_header.value()[3];
  if (rows != 28 || cols != 28) {
    return detail::file_error(images_gz, "images are " + std::to_string(rows) + " x " +
                                             std::to_string(cols) + " (expected 28 x 28)");
  }
  detail::gz_reader labels_in(labels_gz);
  auto label_header = detail::read_header(labels_in, labels_gz, 2, 2049);
  if (!label_header) return label_header.error();
  const std::uint32_t num_labels = label_header.value()[1];
  if (num_labels != n) {
    return detail::file_error(labels_gz, "holds " + std::to_string(num_labels) + " labels but " +
                                             images_gz.string() + " holds " + std::to_string(n) +
                                             " images");
  }

  if (part.count == 0 || part.index >= part.count) {
    return detail::file_error(images_gz, "partition " + std::to_string(part.index) + " of " +
                                             std::to_string(part.count) + " does not exist");
  }
  const auto keep = asyncps::shard_range(n, part.index, part.count);

  // Pixels: read in chunks of whole images; only the images of `keep` stay, in a byte buffer
  // that grows as data arrives.
  constexpr std::uint32_t chunk_images = 1024;
  std::vector<unsigned char> pixels, scratch;
  for (std::uint32_t done = 0; done < n;) {
    const std::uint32_t want = std::min(chunk_images, n - done);
    const std::size_t bytes = std::size_t{want} * image_pixels;
    scratch.resize(bytes);
    const long got = images_in.read(scratch.data(), bytes);
    if (got < 0) {
      return detail::file_error(images_gz, "gzip error: " + images_in.error_text(images_gz));
    }
    const auto whole = static_cast<std::uint32_t>(static_cast<std::size_t>(got) / image_pixels);
    // The kept images of this chunk: [max(done, keep.begin), min(done + whole, keep.end)).
    const std::uint32_t lo = std::max<std::uint32_t>(done, keep.begin);
    const std::uint32_t hi = std::min<std::uint32_t>(done + whole, keep.end);
    if (lo < hi) {
      pixels.insert(pixels.end(), scratch.begin() + std::ptrdiff_t{lo - done} * image_pixels,
                    scratch.begin() + std::ptrdiff_t{hi - done} * image_pixels);
    }
    done += whole;
    if (static_cast<std::size_t>(got) < bytes) {
      return detail::file_error(images_gz, "truncated after " + std::to_string(done) + " of " +
                                               std::to_string(n) + " images");
    }
  }
  if (auto end = detail::expect_end(images_in, images_gz, n, "images"); !end) return end.error();

  // Labels: all of them are read and checked (a byte each), the part's are kept.
  std::vector<std::uint8_t> labels(n);
  const long got = labels_in.read(labels.data(), n);
  if (got < 0) {
    return detail::file_error(labels_gz, "gzip error: " + labels_in.error_text(labels_gz));
  }
  if (static_cast<std::uint32_t>(got) < n) {
    return detail::file_error(labels_gz, "truncated after " + std::to_string(got) + " of " +
                                             std::to_string(n) + " labels");
  }
  for (std::uint32_t i = 0; i < n; ++i) {
    if (labels[i] >= num_classes) {
      return detail::file_error(labels_gz, "label " + std::to_string(labels[i]) + " at index " +
                                               std::to_string(i) + " (expected < 10)");
    }
  }
  if (auto end = detail::expect_end(labels_in, labels_gz, n, "labels"); !end) return end.error();

  dataset out;
  const std::uint32_t kept = keep.end - keep.begin;
  out.labels.assign(labels.begin() + keep.begin, labels.begin() + keep.end);
  if (part.count > 1) {
    out.first = keep.begin;
    out.file_examples = n;
  }
  out.images =
      Eigen::Map<
          const Eigen::Matrix<unsigned char, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>>(
          pixels.data(), kept, static_cast<Eigen::Index>(image_pixels))
          .cast<float>() *
      (1.0f / 255.0f);
  return out;
}

/// Loads the training and test sets from `dir`, which holds the four files
/// `train-images-idx3-ubyte.gz`, `train-labels-idx1-ubyte.gz`, `t10k-images-idx3-ubyte.gz`,
/// `t10k-labels-idx1-ubyte.gz` (the default directory is `default_data_dir()`).
/// Returns {train (60,000 for Fashion-MNIST, or the examples of `train_part` of them), test
/// (10,000)}.
/// Errors: the first `load_idx` failure, unchanged. Thread safety: reentrant.
inline load_result<std::pair<dataset, dataset>> load_fashion_mnist(const std::filesystem::path& dir,
                                                                   partition train_part = {}) {
  auto train =
      load_idx(dir / "train-images-idx3-ubyte.gz", dir / "train-labels-idx1-ubyte.gz", train_part);
  if (!train) return train.error();
  auto test = load_idx(dir / "t10k-images-idx3-ubyte.gz", dir / "t10k-labels-idx1-ubyte.gz");
  if (!test) return test.error();
  return std::pair<dataset, dataset>{std::move(train).value(), std::move(test).value()};
}

/// Quality of a parameter snapshot on a labelled set (models.hpp's `evaluate`).
struct evaluation {
  double accuracy = 0.0;  ///< fraction of examples whose arg-max class is the label, in [0, 1]
  double loss = 0.0;      ///< mean cross-entropy in nats (no regularisation term)
};

/// Where the Debian package `dataset-fashion-mnist` installs the files.
inline std::filesystem::path default_data_dir() { return "/usr/share/datasets/fashion-mnist"; }

}  // namespace fashion
