// safetensors files from Python: load_safetensors → {name: NumPy array}, save_safetensors from any
// mapping of arrays, through attn's own reader and writer (so no safetensors package is needed).
#include <nanobind/stl/filesystem.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/string.h>

#include <filesystem>
#include <map>
#include <string>

#include "arrays.hpp"
#include "attn/io/safetensors.hpp"
#include "bindings.hpp"

namespace attn::python {

using namespace nb::literals;

void bind_files(nb::module_& module) {
  module.def(
      "load_safetensors",
      [](const std::filesystem::path& path) {
        StateDict tensors;
        {
          nb::gil_scoped_release release;
          tensors = load_safetensors(path);
        }
        return to_python(tensors, Framework::kNumpy);
      },
      "path"_a,
      "Reads a safetensors file of F32 (or F64, rounded) tensors as {name: float32 NumPy array}.\n"
      "A missing, truncated or malformed file raises attn.FileError (an OSError) naming it.");
  module.def(
      "_load_safetensors_metadata",
      [](const std::filesystem::path& path) {
        nb::gil_scoped_release release;
        return load_safetensors_metadata(path);
      },
      "path"_a,
      "The string metadata of a safetensors file (checked whole, as load_safetensors does), {}\n"
      "when it has none; for attn.load. A bad file raises attn.FileError naming it.");
  module.def(
      "save_safetensors",
      [](const std::filesystem::path& path, nb::handle tensors,
         const std::map<std::string, std::string>& metadata) {
        const StateDict state = to_state_dict(tensors, "tensors");
        nb::gil_scoped_release release;
        save_safetensors(path, state, metadata);
      },
      "path"_a, "tensors"_a, "metadata"_a = std::map<std::string, std::string>{},
      "Writes {name: array} as F32 tensors to a safetensors file, with optional string metadata,\n"
      "through a temporary file renamed over `path` (a failed write keeps the old file).\n"
      "PyTorch reads it with safetensors.torch.load_file(path).");
}

}  // namespace attn::python
