// Error re-wrapping, the output directory and the multi-head heatmap grid shared by the
// subcommands.
#include "command_support.hpp"

#include <system_error>

namespace attn::cli {

void rethrow_with_message(const Error& error, const std::string& message) {
  if (dynamic_cast<const ShapeError*>(&error) != nullptr) throw ShapeError(message);
  if (dynamic_cast<const ValueError*>(&error) != nullptr) throw ValueError(message);
  if (dynamic_cast<const FileError*>(&error) != nullptr) throw FileError(message);
  throw Error(message);
}

void create_output_directory(const std::filesystem::path& directory, const std::string& option) {
  std::error_code error;
  std::filesystem::create_directories(directory, error);
  if (error || !std::filesystem::is_directory(directory)) {
    throw FileError(option + ": cannot create the directory '" + directory.string() + "'" +
                    (error ? " (" + error.message() + ")" : std::string(" (not a directory)")));
  }
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
