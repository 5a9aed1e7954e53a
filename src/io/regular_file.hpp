// An open regular file read piece by piece by offset, with errors that name the path: the .npy
// reader's shards and the safetensors reader's one tensor read only what they need.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "attn/core/error.hpp"
#include "core/file_access.hpp"

namespace attn::io_detail {

// Opened as core's reader opens files: a FIFO or a device is refused before anything waits on it.
class RegularFile {
 public:
  explicit RegularFile(const std::filesystem::path& path)
      : source_(path.string()), file_(::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC)) {
    if (file_.get() < 0) fail(file_access::system_reason(errno));
    struct stat status {};
    if (::fstat(file_.get(), &status) != 0) fail(file_access::system_reason(errno));
    if (!S_ISREG(status.st_mode)) {
      fail("expected a regular file, got " + file_access::file_kind(status.st_mode));
    }
    size_ = static_cast<uint64_t>(status.st_size);
  }

  const std::string& source() const { return source_; }
  uint64_t size() const { return size_; }

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
  uint64_t size_ = 0;
};

}  // namespace attn::io_detail
