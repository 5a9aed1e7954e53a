// Error re-wrapping, the output directory and the multi-head heatmap grid shared by the
// subcommands.
#include "command_support.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <system_error>

namespace attn::cli {

void rethrow_with_message(const Error& error, const std::string& message) {
  // The argument is a literal (Error's contract), so its view is null-terminated.
  const char* argument = error.argument().data();
  if (dynamic_cast<const ShapeError*>(&error) != nullptr) throw ShapeError(message, argument);
  if (dynamic_cast<const ValueError*>(&error) != nullptr) throw ValueError(message, argument);
  if (dynamic_cast<const FileError*>(&error) != nullptr) throw FileError(message, argument);
  throw Error(message, argument);
}

void create_output_directory(const std::filesystem::path& directory, const std::string& option) {
  std::error_code error;
  std::filesystem::create_directories(directory, error);
  if (error || !std::filesystem::is_directory(directory)) {
    throw FileError(option + ": cannot create the directory '" + directory.string() + "'" +
                    (error ? " (" + error.message() + ")" : std::string(" (not a directory)")));
  }
}

std::string float_text(float value) {
  std::ostringstream text;
  text << value;
  return text.str();
}

double shortest_double(float value) {
  char digits[32];
  const auto end = std::to_chars(digits, digits + sizeof digits, value).ptr;
  return std::strtod(std::string(digits, end).c_str(), nullptr);
}

void check_gradients_directory(const std::string& directory) {
  std::error_code error;
  if (std::filesystem::exists(directory, error) &&
      !std::filesystem::is_directory(directory, error)) {
    throw FileError("--grads-out: cannot create the directory '" + directory +
                    "' (a file is in the way)");
  }
}

void write_with_gradients_directory(const std::string& gradients_directory,
                                    const std::function<void()>& write) {
  const bool gradients = !gradients_directory.empty();
  std::error_code error;
  const bool existed = gradients && std::filesystem::exists(gradients_directory, error);
  if (gradients) create_output_directory(gradients_directory, "--grads-out");
  // A folder this run made goes with its files if a signal ends the run before they are written.
  PendingRemoval pending;
  if (gradients && !existed) {
    pending = PendingRemoval(gradients_directory, PendingRemoval::Kind::kFolder);
  }
  try {
    write();
  } catch (...) {
    if (gradients && !existed) std::filesystem::remove(gradients_directory, error);
    throw;
  }
}

namespace {

namespace fs = std::filesystem;

std::string lower_extension(const fs::path& path) {
  std::string extension = path.extension().string();
  for (char& c : extension) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return extension;
}

// Whether two paths name one file: the same inode when both exist (hard links, symbolic links,
// "./a" and "a"), else the same absolute path with the existing part's links resolved.
bool same_file(const fs::path& a, const fs::path& b) {
  std::error_code error;
  const bool a_exists = fs::exists(a, error);
  const bool b_exists = fs::exists(b, error);
  if (a_exists && b_exists) {
    const bool same = fs::equivalent(a, b, error);
    return !error && same;
  }
  if (a_exists != b_exists) return false;
  const fs::path a_full = fs::weakly_canonical(fs::absolute(a, error), error);
  const fs::path b_full = fs::weakly_canonical(fs::absolute(b, error), error);
  return a_full.lexically_normal() == b_full.lexically_normal();
}

std::string described(const std::string& option, const fs::path& path) {
  return option + " " + path.string();
}

void check_output(const OutputFile& output) {
  const std::string name = described(output.option, output.path);
  if (output.path.empty() || !output.path.has_filename()) {
    throw FileError(output.option + ": expected a file name, got '" + output.path.string() + "'");
  }
  const std::string extension = lower_extension(output.path);
  if (output.kind == OutputKind::kNpy && extension != ".npy") {
    const std::string reason = output.kind_reason.empty() ? "" : " (" + output.kind_reason + ")";
    throw ValueError(output.option + ": expected a file name ending in .npy" + reason + ", got '" +
                     output.path.string() + "'");
  }
  if (output.kind == OutputKind::kArray && extension != ".npy" && extension != ".safetensors") {
    throw ValueError(output.option +
                     ": expected a file name ending in .npy or .safetensors, got '" +
                     output.path.string() + "'");
  }
  if (output.kind == OutputKind::kPicture && extension != ".png" && extension != ".svg" &&
      extension != ".pdf") {
    throw ValueError(output.option + ": expected a picture ending in .png, .svg or .pdf, got '" +
                     output.path.string() + "'");
  }
  const fs::path folder = output.path.has_parent_path() ? output.path.parent_path() : ".";
  std::error_code error;
  if (!fs::is_directory(folder, error)) {
    throw FileError(name + ": the folder '" + folder.string() + "' " +
                    (fs::exists(folder, error) ? "is not a directory" : "does not exist"));
  }
  if (fs::is_directory(output.path, error)) {
    throw FileError(name + ": is a directory, expected a file name");
  }
}

}  // namespace

void check_outputs(const std::vector<OutputFile>& outputs, const std::vector<CommandFile>& inputs) {
  for (const OutputFile& output : outputs) check_output(output);
  for (size_t i = 0; i < outputs.size(); ++i) {
    for (size_t j = 0; j < i; ++j) {
      if (same_file(outputs[i].path, outputs[j].path)) {
        throw ValueError(described(outputs[i].option, outputs[i].path) + ": the same file as " +
                         described(outputs[j].option, outputs[j].path) +
                         " (each output needs its own file)");
      }
    }
    for (const CommandFile& input : inputs) {
      if (same_file(outputs[i].path, input.path)) {
        throw ValueError(described(outputs[i].option, outputs[i].path) + ": the same file as " +
                         described(input.option, input.path) +
                         " (writing it would overwrite an input)");
      }
    }
  }
}

StagedOutputs::~StagedOutputs() {
  for (const Staged& staged : staged_) ::unlink(staged.temporary.c_str());
}

void StagedOutputs::write(const std::string& option, const fs::path& target,
                          const std::function<void(const fs::path&)>& write) {
  const fs::path folder = target.has_parent_path() ? target.parent_path() : fs::path(".");
  const std::string name = target.filename().string();
  // A name no other process picks (this process's id, a counter, O_EXCL), hidden, ending in the
  // target's extension.
  static uint64_t counter = 0;
  fs::path temporary;
  for (int attempt = 0;; ++attempt) {
    temporary = folder / ("." + name + ".attn-staged-" + std::to_string(::getpid()) + "-" +
                          std::to_string(counter++) + target.extension().string());
    const int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd >= 0) {
      ::close(fd);
      break;
    }
    if (errno != EEXIST || attempt > 100) {
      throw FileError(option + ": " + target.string() + ": cannot write the file (" +
                      std::strerror(errno) + ")");
    }
  }
  staged_.push_back(
      {option, target, temporary, PendingRemoval(temporary, PendingRemoval::Kind::kFile)});
  try {
    write(temporary);
  } catch (const Error& error) {
    std::string message = error.what();
    const std::string temporary_name = temporary.string();
    for (size_t at = message.find(temporary_name); at != std::string::npos;
         at = message.find(temporary_name, at + target.string().size())) {
      message.replace(at, temporary_name.size(), target.string());
    }
    rethrow_with_message(error, option + ": " + message);
  }
}

void StagedOutputs::commit() {
  for (Staged& staged : staged_) {
    std::error_code error;
    const fs::file_status existing = fs::status(staged.target, error);
    if (!error && fs::is_regular_file(existing)) {
      fs::permissions(staged.temporary, existing.permissions(), error);
    }
    if (::rename(staged.temporary.c_str(), staged.target.c_str()) != 0) {
      throw FileError(staged.option + ": " + staged.target.string() + ": cannot write the file (" +
                      std::strerror(errno) + ")");
    }
    staged.pending.release();
    staged.temporary.clear();
  }
  staged_.clear();
}

HeatmapOptions head_grid_options(int64_t batch, int64_t heads) {
  HeatmapOptions options;
  options.rows = batch;
  options.cols = heads;
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t h = 0; h < heads; ++h) {
      options.titles.push_back("batch " + std::to_string(b) + ", head " + std::to_string(h));
    }
  }
  return options;
}

}  // namespace attn::cli
