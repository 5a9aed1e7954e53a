// An open .npy file read piece by piece: its preamble, header and size checked as read_npy checks
// them, then any bytes of it by offset (read_npy_rows' shards, load_npy_tensor's data).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "attn/core/error.hpp"
#include "io/npy_layout.hpp"
#include "io/regular_file.hpp"

namespace attn::io_detail {

// An open .npy file whose preamble, header and size have been checked as read_npy checks them.
class NpyFile {
 public:
  explicit NpyFile(const std::filesystem::path& path) : file_(path) {
    const uint64_t size = file_.size();
    // 12 bytes hold any version's preamble; then exactly the header it announces (or what the
    // file has of it, for the header parser's own message about a short file).
    std::vector<std::byte> head = read_at(0, std::min<uint64_t>(size, 12));
    const NpyPreamble preamble = parse_npy_preamble(head, source());
    head = read_at(0, std::min<uint64_t>(size, preamble.header_start + preamble.header_length));
    layout_ = parse_npy_header(head, source());
    check_npy_data_size(layout_, size - layout_.data_offset, source());
  }

  const NpyLayout& layout() const { return layout_; }
  const std::string& source() const { return file_.source(); }

  // `count` bytes from `offset`, or FileError naming the path.
  std::vector<std::byte> read_at(uint64_t offset, uint64_t count) const {
    return file_.read_at(offset, count);
  }
  void read_into(uint64_t offset, std::span<std::byte> bytes) const {
    file_.read_into(offset, bytes);
  }
  // All of the data, as stored.
  std::vector<std::byte> read_data() const {
    return read_at(layout_.data_offset, layout_.data_size);
  }

 private:
  RegularFile file_;
  NpyLayout layout_;
};

}  // namespace attn::io_detail
