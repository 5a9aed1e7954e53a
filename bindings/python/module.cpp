// The extension module attn._attn: attn's exceptions as Python ones, the thread-count and
// strict-input settings, and the registration of the functions, layers and file readers.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>
#include <omp.h>
#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <new>
#include <string>

#include "arrays.hpp"
#include "attn/core/error.hpp"
#include "attn/core/tensor_allocator.hpp"
#include "attn/core/threads.hpp"
#include "attn/kernels/amx.hpp"
#include "attn/kernels/bfloat16_dot.hpp"
#include "attn/kernels/bfloat16_probabilities.hpp"
#include "attn/kernels/simd_target.hpp"
#include "bindings.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace {

// The thread count for attn's OpenMP kernels; OpenMP's own default (OMP_NUM_THREADS, else the
// number of hardware threads), at most attn::kMaxThreads, until set_num_threads() changes it.
std::atomic<int> num_threads_setting{std::min(omp_get_max_threads(), attn::kMaxThreads)};
// Whether set_num_threads() chose that count: attn.torch's calls then keep it instead of following
// torch.get_num_threads() (_follow_num_threads).
std::atomic<bool> num_threads_chosen{false};

// Whether this process was forked from a thread whose OpenMP pool could not be released before
// the fork (attn::forked_after_threads: its pool's threads were not copied, and GNU OpenMP would
// wait for them forever at the next parallel region of more than one thread). attn runs on one
// thread in such a process. attn's core releases the forking thread's pool before every fork
// otherwise (src/core/fork_safety.cpp), PyTorch's parallel work's included, and a child keeps
// its count.
std::atomic<bool> forked_after_threads{false};

// pthread_atfork's child handler: runs in the child, on the thread that forked, after attn's
// core's (registered first, when its library loaded).
void after_fork_in_child() {
  if (!attn::forked_after_threads()) return;
  forked_after_threads.store(true);
  num_threads_setting.store(1);
}

// ValueError for a count above 1 in a process forked after threads (forked_after_threads).
void check_threads_after_fork(int64_t threads) {
  if (threads > 1 && forked_after_threads.load()) {
    throw attn::ValueError(
        "n: expected 1 in a process forked after attn ran on several threads (GNU OpenMP cannot "
        "start threads again after os.fork; start workers with multiprocessing's 'spawn' or "
        "'forkserver' method), got " +
        std::to_string(threads));
  }
}

// Python types of attn's exceptions; created once with the module and never freed, as CPython's
// own exception types.
PyObject* shape_error_type = nullptr;
PyObject* file_error_type = nullptr;

// One translator for all attn errors, most derived first: ShapeError and FileError get their own
// Python classes (subclasses of ValueError and OSError), attn::ValueError is Python's ValueError.
void translate_attn_errors(const std::exception_ptr& error, void* /*payload*/) {
  try {
    std::rethrow_exception(error);
  } catch (const attn::ShapeError& shape_error) {
    PyErr_SetString(shape_error_type, shape_error.what());
  } catch (const attn::FileError& file_error) {
    PyErr_SetString(file_error_type, file_error.what());
  } catch (const attn::ValueError& value_error) {
    PyErr_SetString(PyExc_ValueError, value_error.what());
  } catch (const attn::Error& other_error) {
    PyErr_SetString(PyExc_RuntimeError, other_error.what());
  }
}

}  // namespace

attn::python::ThreadSettingScope::ThreadSettingScope() : previous_(omp_get_max_threads()) {
  const int threads = num_threads_setting.load();
  // Cheap, but skipped when unchanged: OpenMP keeps the value per calling thread.
  changed_ = previous_ != threads;
  if (changed_) omp_set_num_threads(threads);
}

attn::python::ThreadSettingScope::~ThreadSettingScope() {
  if (changed_) omp_set_num_threads(previous_);
}

NB_MODULE(_attn, module) {
  module.doc() =
      "attn's C++ core: attention layers and kernels of Dive into Deep Learning over NumPy arrays "
      "and PyTorch tensors. Import the package attn rather than this module.";

  // nanobind reports every object of this module still alive when the interpreter exits as a
  // leak, which Python never promises to free: an attn.torch module's output kept to the end of
  // a script without a backward pass holds its autograd graph, and the graph its attn layer, so
  // the plainest PyTorch script ended with "nanobind: leaked 1 instances!". Off unless
  // ATTN_LEAK_WARNINGS is set, as tests/python/test_hostile.py sets it to keep catching real
  // reference leaks of the bindings.
  nb::set_leak_warnings(std::getenv("ATTN_LEAK_WARNINGS") != nullptr);

  shape_error_type = PyErr_NewExceptionWithDoc(
      "attn.ShapeError",
      "An array of the wrong rank or shape, or shapes that do not agree with each other.",
      PyExc_ValueError, nullptr);
  file_error_type = PyErr_NewExceptionWithDoc(
      "attn.FileError",
      "A file that cannot be opened, is truncated, corrupt, or holds something other than "
      "expected.",
      PyExc_OSError, nullptr);
  if (shape_error_type == nullptr || file_error_type == nullptr) throw nb::python_error();
  module.attr("ShapeError") = nb::borrow(shape_error_type);
  module.attr("FileError") = nb::borrow(file_error_type);
  nb::register_exception_translator(translate_attn_errors);
  if (pthread_atfork(nullptr, nullptr, after_fork_in_child) != 0) throw std::bad_alloc();

  module.def(
      "set_num_threads",
      [](int64_t threads) {
        // Checked here, not at the next call: OpenMP crashes on a million threads and exits the
        // interpreter when it cannot create a few thousand.
        attn::check_thread_count(threads, "n");
        check_threads_after_fork(threads);
        num_threads_setting.store(static_cast<int>(threads));
        num_threads_chosen.store(true);
      },
      "n"_a,
      "Sets how many threads attn's OpenMP kernels may use (1 to 1024), like\n"
      "torch.set_num_threads. It applies to every later call, from any Python thread; kernels\n"
      "that are not parallel yet run on the calling thread (with the GIL released). Until it is\n"
      "called, attn.torch's calls use torch.get_num_threads() threads, as PyTorch's operators do.\n"
      "A process forked (os.fork, multiprocessing's 'fork') from a thread whose attn calls ran on\n"
      "several threads runs attn on one: GNU OpenMP cannot start threads there again; n > 1 is a\n"
      "ValueError in it.");
  module.def(
      "_follow_num_threads",
      [](int64_t threads) {
        if (num_threads_chosen.load() || forked_after_threads.load()) return;
        attn::check_thread_count(threads, "n");
        num_threads_setting.store(static_cast<int>(threads));
      },
      "n"_a,
      "attn.torch's: the thread count PyTorch's operators use, taken unless set_num_threads()\n"
      "chose one.");
  module.def(
      "get_num_threads", [] { return num_threads_setting.load(); },
      "The thread count set by set_num_threads() (by default OMP_NUM_THREADS, else the number\n"
      "of hardware threads; once attn.torch has run a call without set_num_threads(),\n"
      "torch.get_num_threads()).");

  module.def(
      "simd_target", [] { return attn::simd_target(); },
      "The SIMD instruction set attn's kernels run on now, by Highway's name (AVX3 = AVX-512,\n"
      "AVX2, SSE4, ...).");
  module.def(
      "available_simd_targets", [] { return attn::available_simd_targets(); },
      "The instruction sets attn has kernels for and this CPU runs, best first.");
  module.def(
      "limit_simd_target", [](const std::string& name) { attn::limit_simd_target(name); }, "name"_a,
      "Runs attn's kernels, and its GEMM library where it has not run yet, no better than `name`\n"
      "(one of available_simd_targets(), any case; 'best' lifts the cap): to measure or test on\n"
      "this machine the kernels an older CPU runs. Process-wide; not while kernels run on other\n"
      "threads. ValueError for any other name.");

  module.def(
      "amx_status", [] { return attn::amx_status(); },
      "Whether bf16 attention runs on the CPU's AMX tiles: 'no AMX', 'AMX-BF16 in use ...' (the\n"
      "default where the CPU and Linux offer them) or 'AMX-BF16 available, turned off ...'. Set\n"
      "ATTN_AMX=0 in the environment before importing attn to keep bf16 off the tiles.");

  module.def(
      "bf16_dot_status", [] { return attn::bf16_dot_status(); },
      "Whether bf16 attention off the AMX tiles multiplies on the CPU's bf16 dot products\n"
      "(vdpbf16ps) or widens bf16 to fp32: 'bf16 products on vdpbf16ps' (the default where they\n"
      "outpace fp32 FMAs: AMD's Zen 4 and 5), 'bf16 widened to fp32 (...)' (Intel's cores, whose\n"
      "vdpbf16ps makes half the FMAs' products per cycle; CPUs without AVX512-BF16). Set\n"
      "ATTN_BF16_DOT=1 (always vdpbf16ps) or 0 (never) in the environment before importing attn.");

  module.def(
      "bf16_probabilities_status", [] { return attn::bf16_probabilities_status(); },
      "How bf16 attention on bf16 products gives the softmax's probabilities P to P·V: in\n"
      "two bf16 parts (within 2^-16 of P) on AMX tiles and rounded to bf16 (2^-8, as PyTorch's\n"
      "bf16 kernels) on vdpbf16ps by default. Set ATTN_BF16_P=split or rounded in the\n"
      "environment before importing attn to choose one everywhere.");

  module.def(
      "empty_cache", [] { attn::release_cached_tensor_storage(); },
      "Frees the blocks of 64 KiB or more that attn keeps from freed outputs, gradients and its\n"
      "kernels' scratch for the next of the same size (at most 256 + 16 MiB: reused, their pages\n"
      "fault no more), as torch.cuda.empty_cache frees PyTorch's cached GPU memory.");
  module.def(
      "cached_bytes", [] { return attn::cached_tensor_storage_bytes(); },
      "Bytes attn keeps now for reuse (see empty_cache).");

  module.def("set_strict_inputs", &attn::python::set_strict_inputs, "strict"_a,
             "When strict, arrays that would need a copy (not float32, or not C-contiguous) are\n"
             "refused with TypeError / ValueError instead of being copied. Off by default.");
  module.def("get_strict_inputs", &attn::python::strict_inputs,
             "Whether set_strict_inputs(True) is in force.");

  attn::python::bind_functions(module);
  attn::python::bind_functional(module);
  attn::python::bind_kv_cache(module);
  attn::python::bind_layers(module);
  attn::python::bind_files(module);
}
