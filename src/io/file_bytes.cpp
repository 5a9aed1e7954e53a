// Whole-file reads and writes shared by the .npy and safetensors code.
#include "io/file_bytes.hpp"

#include <fstream>
#include <string>
#include <system_error>

#include "attn/core/error.hpp"

namespace attn::io_detail {

std::vector<std::byte> read_file_bytes(const std::filesystem::path& path) {
  std::error_code error;
  const uintmax_t size = std::filesystem::file_size(path, error);  // fails for directories too
  if (error) throw FileError(path.string() + ": cannot read the file (" + error.message() + ")");
  std::ifstream file(path, std::ios::binary);
  std::vector<std::byte> bytes(static_cast<size_t>(size));
  file.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  if (!file || file.gcount() != static_cast<std::streamsize>(bytes.size())) {
    throw FileError(path.string() + ": cannot read the file (expected " + std::to_string(size) +
                    " bytes, read " + std::to_string(file.gcount()) + ")");
  }
  return bytes;
}

void write_file_bytes(const std::filesystem::path& path, std::span<const std::byte> bytes) {
  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  file.write(reinterpret_cast<const char*>(bytes.data()),
             static_cast<std::streamsize>(bytes.size()));
  file.close();
  if (!file) throw FileError(path.string() + ": cannot write the file");
}

}  // namespace attn::io_detail
