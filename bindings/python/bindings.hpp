// The parts of the extension module attn._attn, each defined in its own file and called from
// module.cpp.
#pragma once

#include <nanobind/nanobind.h>

namespace attn::python {

namespace nb = nanobind;

// functions.cpp: masked_softmax, additive_attention, gaussian_kernel_pooling, _data_pointer.
void bind_functions(nb::module_& module);
// functional.cpp: scaled_dot_product_attention (PyTorch's signature), _sdpa_forward,
// _sdpa_backward.
void bind_functional(nb::module_& module);
// layers.cpp: AdditiveAttention, DotProductAttention, MultiHeadAttention, GaussianKernelPooling.
void bind_layers(nb::module_& module);
// kv_cache.cpp: KVCache (scaled_dot_product_attention takes one as key).
void bind_kv_cache(nb::module_& module);
// files.cpp: load_safetensors, save_safetensors.
void bind_files(nb::module_& module);

// module.cpp: set_num_threads()'s count applied to the calling thread's OpenMP runtime (which
// keeps the count per thread) for the scope of one computation, on the thread that runs it, GIL
// released; the thread's previous count restored after it. PyTorch shares that runtime (one
// libgomp, whichever loaded first) and reads its own count from it (at::get_num_threads() is
// omp_get_max_threads()), so a count left behind would become torch's.
class ThreadSettingScope {
 public:
  ThreadSettingScope();
  ~ThreadSettingScope();
  ThreadSettingScope(const ThreadSettingScope&) = delete;
  ThreadSettingScope& operator=(const ThreadSettingScope&) = delete;

 private:
  int previous_;
  bool changed_;
};

}  // namespace attn::python
