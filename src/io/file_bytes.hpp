// Whole-file reads and writes for the file formats, with errors that name the path and the
// system's reason.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <span>
#include <vector>

namespace attn::io_detail {

// FileError naming the path when it is missing, unreadable, not a regular file (a FIFO, a device or
// a directory is refused before anything waits on it) or larger than `max_size` bytes.
std::vector<std::byte> read_file_bytes(const std::filesystem::path& path,
                                       uint64_t max_size = std::numeric_limits<uint64_t>::max());
// Writes through a temporary file in the same folder, flushed and renamed over `path`, so that a
// failed write leaves any previous file intact; FileError naming the path and the reason.
void write_file_bytes(const std::filesystem::path& path, std::span<const std::byte> bytes);
// The same for a file made of `pieces` one after another (a header, then data where it lies).
void write_file_pieces(const std::filesystem::path& path,
                       std::span<const std::span<const std::byte>> pieces);

}  // namespace attn::io_detail
