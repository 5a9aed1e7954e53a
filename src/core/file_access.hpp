// Whole-file reads and writes that a hostile path cannot turn into a hang or a lost file: reads
// refuse anything but a regular file before reading a byte, writes go through a temporary file.
// Header-only and internal (src/core), shared by attn::io, attn::viz and attn::seq2seq.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "attn/core/error.hpp"
#include "attn/core/pending_removal.hpp"

namespace attn::file_access {

// The system's words for an errno value ("No space left on device"), for messages.
inline std::string system_reason(int error_number) {
  char buffer[256] = {};
  // GNU strerror_r returns the message, which may or may not be `buffer`.
  const char* text = strerror_r(error_number, buffer, sizeof buffer);
  return text != nullptr ? std::string(text) : "error " + std::to_string(error_number);
}

// What a non-regular file is, for "expected a regular file, got <kind>".
inline std::string file_kind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

// Closes a descriptor on every path out of a scope.
class Descriptor {
 public:
  explicit Descriptor(int fd) : fd_(fd) {}
  Descriptor(const Descriptor&) = delete;
  Descriptor& operator=(const Descriptor&) = delete;
  ~Descriptor() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const { return fd_; }
  // Closes now and reports close's own failure (NFS and some full disks report it only there).
  int close() {
    const int result = ::close(fd_);
    fd_ = -1;
    return result;
  }

 private:
  int fd_;
};

// The whole of a regular file. FileError "<path>: cannot read the file (<reason>)" when it is
// missing or unreadable, names the kind of anything that is not a regular file (a FIFO, a device,
// a directory) without waiting on it, and refuses a file larger than `max_size` bytes.
inline std::vector<std::byte> read_regular_file(
    const std::filesystem::path& path, uint64_t max_size = std::numeric_limits<uint64_t>::max()) {
  const std::string name = path.string();
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer, forever. It changes
  // nothing for a regular file, the only kind read past the fstat below.
  const Descriptor file(::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC));
  if (file.get() < 0) {
    throw FileError(name + ": cannot read the file (" + system_reason(errno) + ")");
  }
  struct stat status {};
  if (::fstat(file.get(), &status) != 0) {
    throw FileError(name + ": cannot read the file (" + system_reason(errno) + ")");
  }
  if (!S_ISREG(status.st_mode)) {
    throw FileError(name + ": cannot read the file (expected a regular file, got " +
                    file_kind(status.st_mode) + ")");
  }
  const auto size = static_cast<uint64_t>(status.st_size);
  if (size > max_size) {
    throw FileError(name + ": cannot read the file (expected at most " + std::to_string(max_size) +
                    " bytes, got " + std::to_string(size) + ")");
  }
  std::vector<std::byte> bytes(static_cast<size_t>(size));
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t got = ::read(file.get(), bytes.data() + done, bytes.size() - done);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) {
      throw FileError(name + ": cannot read the file (" + system_reason(errno) + ")");
    }
    if (got == 0) {
      throw FileError(name + ": cannot read the file (expected " + std::to_string(size) +
                      " bytes, read " + std::to_string(done) + ": it shrank while being read)");
    }
    done += static_cast<size_t>(got);
  }
  return bytes;
}

// Writes `target` atomically: `write` fills a new temporary file in the target's own folder (so
// that the rename cannot cross file systems), which is flushed to disk and renamed over the
// target. The old target survives any failure (a full disk, a file-size limit, an exception from
// `write`), and the temporary file is removed. An existing target's permission bits are kept.
// FileError "<target>: cannot write the file (<reason>)" names the system's reason.
inline void write_atomically(const std::filesystem::path& target,
                             const std::function<void(const std::filesystem::path&)>& write) {
  const std::string name = target.string();
  const auto fail = [&name](const std::string& reason) -> void {
    throw FileError(name + ": cannot write the file (" + reason + ")");
  };
  if (target.filename().empty()) fail("expected a file name, got a path ending in '/'");
  const std::filesystem::path folder =
      target.has_parent_path() ? target.parent_path() : std::filesystem::path(".");
  struct stat existing {};
  const bool exists = ::stat(target.c_str(), &existing) == 0;
  if (exists && !S_ISREG(existing.st_mode)) {
    fail("expected a regular file or a new name, got " + file_kind(existing.st_mode));
  }
  // A name no other writer picks: this process, a counter, and O_EXCL against anyone else. The
  // target's name is cut to 200 bytes in it, so that the whole stays within the 255 bytes a file
  // name may have (a target of 236 bytes or more could not be written).
  static std::atomic<uint64_t> counter{0};
  std::string stem = target.filename().string();
  if (stem.size() > 200) stem.resize(200);
  std::filesystem::path temporary;
  int fd = -1;
  for (int attempt = 0; fd < 0; ++attempt) {
    temporary = folder / ("." + stem + ".attn-" + std::to_string(::getpid()) + "-" +
                          std::to_string(counter++) + ".tmp");
    // 0666 under the umask, as a plain create would give.
    fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0 && (errno != EEXIST || attempt > 100)) fail(system_reason(errno));
  }
  Descriptor reserved(fd);
  // Removed by the program's signal handler too, should SIGINT end it mid-write.
  const PendingRemoval pending(temporary, PendingRemoval::Kind::kFile);
  const auto remove_temporary = [&temporary] { ::unlink(temporary.c_str()); };
  try {
    if (exists) ::fchmod(reserved.get(), existing.st_mode & 07777);
    if (reserved.close() != 0) fail(system_reason(errno));
    write(temporary);
    // The writer may have used its own descriptor (Cairo does): reopen to flush to disk.
    const Descriptor written(::open(temporary.c_str(), O_RDONLY | O_CLOEXEC));
    if (written.get() < 0 || ::fsync(written.get()) != 0) fail(system_reason(errno));
    if (::rename(temporary.c_str(), target.c_str()) != 0) fail(system_reason(errno));
  } catch (...) {
    remove_temporary();
    throw;
  }
}

// write_atomically for bytes in memory given as pieces written one after another (a file's header,
// then its data where it lies: no copy joins them), with every write checked: the reason of a short
// write (ENOSPC, EFBIG, EIO) is in the message.
inline void write_pieces_atomically(const std::filesystem::path& target,
                                    std::span<const std::span<const std::byte>> pieces) {
  write_atomically(target, [&](const std::filesystem::path& temporary) {
    const auto fail = [&target](int error_number) -> void {
      throw FileError(target.string() + ": cannot write the file (" + system_reason(error_number) +
                      ")");
    };
    Descriptor file(::open(temporary.c_str(), O_WRONLY | O_TRUNC | O_CLOEXEC));
    if (file.get() < 0) fail(errno);
    for (const std::span<const std::byte> bytes : pieces) {
      size_t done = 0;
      while (done < bytes.size()) {
        const ssize_t wrote = ::write(file.get(), bytes.data() + done, bytes.size() - done);
        if (wrote < 0 && errno == EINTR) continue;
        if (wrote <= 0) fail(wrote < 0 ? errno : EIO);
        done += static_cast<size_t>(wrote);
      }
    }
    if (file.close() != 0) fail(errno);
  });
}

// write_pieces_atomically for one piece.
inline void write_bytes_atomically(const std::filesystem::path& target,
                                   std::span<const std::byte> bytes) {
  const std::span<const std::byte> pieces[] = {bytes};
  write_pieces_atomically(target, pieces);
}

}  // namespace attn::file_access
