// Whole-file reads and writes for the file formats, with errors that name the path.
#pragma once

#include <cstddef>
#include <filesystem>
#include <span>
#include <vector>

namespace attn::io_detail {

// FileError naming the path when it is missing, a directory, unreadable or shorter than stat says.
std::vector<std::byte> read_file_bytes(const std::filesystem::path& path);
// FileError naming the path when it cannot be written completely.
void write_file_bytes(const std::filesystem::path& path, std::span<const std::byte> bytes);

}  // namespace attn::io_detail
