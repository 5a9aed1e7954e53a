// Whole files read and written as attn's own readers and writers do: reads refuse anything but a
// regular file before reading a byte, writes replace the file only once the new one is complete.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <span>
#include <string_view>
#include <vector>

namespace attn {

// The bytes of a regular file. FileError "<path>: cannot read the file (<reason>)" when it is
// missing or unreadable, when it is a FIFO, a device or a directory (refused without waiting on
// it), or when it holds more than `max_size` bytes.
std::vector<std::byte> read_file(const std::filesystem::path& path,
                                 uint64_t max_size = std::numeric_limits<uint64_t>::max());

// Writes `bytes` to a temporary file in the folder of `path`, flushes it to disk and renames it
// over `path`: the previous file survives any failure (a full disk, a file-size limit), and no
// temporary file is left behind. An existing file's permissions are kept. FileError
// "<path>: cannot write the file (<the system's reason>)".
void write_file(const std::filesystem::path& path, std::span<const std::byte> bytes);
void write_file(const std::filesystem::path& path, std::string_view text);

}  // namespace attn
