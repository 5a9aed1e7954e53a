// read_npy_header and read_npy_rows: a .npy file's header, then only the chosen rows of one axis,
// each read at its own offset — what lets every rank of a ring read just its shard.
#include "attn/io/npy_rows.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <string>
#include <vector>

#include "attn/core/error.hpp"
#include "core/file_access.hpp"
#include "io/npy_layout.hpp"

namespace attn {
namespace {

// An open .npy file whose preamble, header and size have been checked as read_npy checks them.
// Opened as core's reader opens files: a FIFO or a device is refused before anything waits on it.
class NpyFile {
 public:
  explicit NpyFile(const std::filesystem::path& path)
      : source_(path.string()), file_(::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC)) {
    if (file_.get() < 0) fail(file_access::system_reason(errno));
    struct stat status {};
    if (::fstat(file_.get(), &status) != 0) fail(file_access::system_reason(errno));
    if (!S_ISREG(status.st_mode)) {
      fail("expected a regular file, got " + file_access::file_kind(status.st_mode));
    }
    const auto size = static_cast<uint64_t>(status.st_size);
    // 12 bytes hold any version's preamble; then exactly the header it announces (or what the
    // file has of it, for the header parser's own message about a short file).
    std::vector<std::byte> head = read_at(0, std::min<uint64_t>(size, 12));
    const io_detail::NpyPreamble preamble = io_detail::parse_npy_preamble(head, source_);
    head = read_at(0, std::min<uint64_t>(size, preamble.header_start + preamble.header_length));
    layout_ = io_detail::parse_npy_header(head, source_);
    io_detail::check_npy_data_size(layout_, size - layout_.data_offset, source_);
  }

  const io_detail::NpyLayout& layout() const { return layout_; }
  const std::string& source() const { return source_; }

  // `count` bytes from `offset`, or FileError naming the path.
  std::vector<std::byte> read_at(uint64_t offset, uint64_t count) const {
    std::vector<std::byte> bytes(static_cast<size_t>(count));
    read_into(offset, bytes);
    return bytes;
  }
  void read_into(uint64_t offset, std::span<std::byte> bytes) const {
    size_t done = 0;
    while (done < bytes.size()) {
      const ssize_t got = ::pread(file_.get(), bytes.data() + done, bytes.size() - done,
                                  static_cast<off_t>(offset + done));
      if (got < 0 && errno == EINTR) continue;
      if (got < 0) fail(file_access::system_reason(errno));
      if (got == 0) {
        fail("expected " + std::to_string(bytes.size()) + " bytes at offset " +
             std::to_string(offset) + ", the file ended after " + std::to_string(done) +
             ": it shrank while being read");
      }
      done += static_cast<size_t>(got);
    }
  }

 private:
  [[noreturn]] void fail(const std::string& reason) const {
    throw FileError(source_ + ": cannot read the file (" + reason + ")");
  }

  std::string source_;
  file_access::Descriptor file_;
  io_detail::NpyLayout layout_;
};

}  // namespace

NpyHeader read_npy_header(const std::filesystem::path& path) {
  const NpyFile file(path);
  return {file.layout().shape, file.layout().dtype};
}

NpyArray read_npy_rows(const std::filesystem::path& path, int axis,
                       std::span<const NpyRowRange> ranges) {
  NpyFile file(path);
  const Shape& shape = file.layout().shape;
  const int rank = shape.rank();
  const int a = axis < 0 ? axis + rank : axis;
  if (a < 0 || a >= rank) {
    throw ShapeError(file.source() + ": axis " + std::to_string(axis) +
                     " is outside the array of shape " + shape.str());
  }
  int64_t rows = 0;
  for (const NpyRowRange& range : ranges) {
    if (range.begin < 0 || range.count < 0 || range.begin > shape[a] - range.count) {
      throw ShapeError(file.source() + ": rows [" + std::to_string(range.begin) + ", " +
                       std::to_string(range.begin + range.count) + ") of axis " +
                       std::to_string(axis) + " lie outside the array of shape " + shape.str());
    }
    rows += range.count;
  }
  // The array is (outer, shape[a], inner) in C order: each range of each outer index is one
  // contiguous run of bytes.
  int64_t outer = 1, inner = io_detail::npy_itemsize(file.layout().dtype);
  for (int d = 0; d < a; ++d) outer *= shape[d];
  for (int d = a + 1; d < rank; ++d) inner *= shape[d];
  int64_t dims[Shape::kMaxRank];
  for (int d = 0; d < rank; ++d) dims[d] = d == a ? rows : shape[d];
  const Shape selected = Shape::from_dims(dims, rank);
  std::vector<std::byte> data(static_cast<size_t>(outer * rows * inner));
  size_t at = 0;
  for (int64_t o = 0; o < outer; ++o) {
    for (const NpyRowRange& range : ranges) {
      const auto bytes = static_cast<size_t>(range.count * inner);
      if (bytes == 0) continue;
      file.read_into(
          file.layout().data_offset + static_cast<uint64_t>((o * shape[a] + range.begin) * inner),
          std::span(data).subspan(at, bytes));
      at += bytes;
    }
  }
  return io_detail::decode_npy_data(file.layout().dtype, selected, data, file.source());
}

}  // namespace attn
