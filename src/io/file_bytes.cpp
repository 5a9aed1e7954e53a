// Whole-file reads and writes shared by the .npy and safetensors code and offered to attn's users
// (attn/io/files.hpp): core's regular-file reader and atomic writer (src/core/file_access.hpp).
#include "io/file_bytes.hpp"

#include "attn/io/files.hpp"
#include "core/file_access.hpp"

namespace attn {

namespace io_detail {

std::vector<std::byte> read_file_bytes(const std::filesystem::path& path, uint64_t max_size) {
  return file_access::read_regular_file(path, max_size);
}

void write_file_bytes(const std::filesystem::path& path, std::span<const std::byte> bytes) {
  file_access::write_bytes_atomically(path, bytes);
}

void write_file_pieces(const std::filesystem::path& path,
                       std::span<const std::span<const std::byte>> pieces) {
  file_access::write_pieces_atomically(path, pieces);
}

}  // namespace io_detail

std::vector<std::byte> read_file(const std::filesystem::path& path, uint64_t max_size) {
  return file_access::read_regular_file(path, max_size);
}

void write_file(const std::filesystem::path& path, std::span<const std::byte> bytes) {
  file_access::write_bytes_atomically(path, bytes);
}

void write_file(const std::filesystem::path& path, std::string_view text) {
  file_access::write_bytes_atomically(path, std::as_bytes(std::span(text.data(), text.size())));
}

}  // namespace attn
