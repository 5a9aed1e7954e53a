// Fuzz target: the .npy reader (parse_npy) on arbitrary bytes. An array it accepts must survive a
// round trip through attn's writer unchanged.
#include "attn/io/npy.hpp"
#include "fuzz_support.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  attn::fuzz::refuse_only_with_attn_errors([&] {
    const attn::NpyArray array = attn::parse_npy(attn::fuzz::bytes_of(data, size), "fuzz.npy");
    if (array.shape.numel() < 0) attn::fuzz::finding("negative numel");
    if (array.is_integer()) {
      const attn::NpyArray again =
          attn::parse_npy(attn::serialize_npy(array.integers, array.shape), "round trip");
      if (again.integers != array.integers) attn::fuzz::finding("int64 round trip changed data");
    } else if (array.is_bool()) {
      const attn::NpyArray again =
          attn::parse_npy(attn::serialize_npy_bool(array.bools, array.shape), "round trip");
      if (again.bools != array.bools) attn::fuzz::finding("bool round trip changed data");
    } else {
      const attn::Tensor tensor(array.shape, array.floats);
      const attn::NpyArray again = attn::parse_npy(attn::serialize_npy(tensor), "round trip");
      if (again.shape != array.shape || again.floats.size() != array.floats.size()) {
        attn::fuzz::finding("float round trip changed the shape");
      }
    }
  });
  return 0;
}
