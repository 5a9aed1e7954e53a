// Times ggml's CPU ggml_flash_attn_ext (llama.cpp's attention) on attn bench's decode shape: one
// query token per sequence, 32 heads over 8 key/value heads of 128, m cached F32 or F16 tokens.
//
// Built by scripts/build-ggml.sh (bench/ggml/CMakeLists.txt), outside attn's build. Each timed pass
// follows a read of twice the L3, as attn bench's decode cases do, so K and V come from memory;
// GB/s counts the K and V bytes of the cache (2·B·Hkv·m·d·sizeof(element)), attn bench's measure.
// Before timing, ggml's output on a short cache is checked against a double-precision reference.
#include <ggml-cpu.h>
#include <ggml.h>

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#ifndef ATTN_GGML_SOURCE
#define ATTN_GGML_SOURCE "unknown"
#endif
#ifndef ATTN_GGML_FLAGS
#define ATTN_GGML_FLAGS "unknown"
#endif

namespace {

constexpr const char* kUsage = R"(usage: ggml_decode_bench [options]

Times ggml_flash_attn_ext (ggml's CPU backend, llama.cpp's attention) for one query token per
sequence against a KV cache: B sequences, --heads query heads over --kv-heads key/value heads of
--head-dim, scale 1/sqrt(head-dim), no mask, F32 query, K and V of the --cache type.

  --cache LIST          K/V types, comma-separated: f32, f16 (default f32,f16)
  --lengths LIST        cached tokens m, comma-separated (default 4096,32768,65536)
  --threads LIST        ggml_graph_compute threads, comma-separated (default 1 and the CPUs)
  --batch N             sequences B (default 1)
  --heads N             query heads (default 32)
  --kv-heads N          key/value heads, a divisor of --heads (default 8)
  --head-dim N          head size d (default 128)
  --repeats N           timed passes per row; the median and the minimum are reported (default 9)
  --warmup N            untimed passes before them (default 1)
  --kv-layout NAME      heads: K and V contiguous [d, m, Hkv, B] (default); tokens: llama.cpp's
                        KV cache, every head of a token side by side ([d, Hkv, m, B] viewed
                        through ggml_permute as [d, m, Hkv, B])
  --warm                no eviction read between passes (a cache that fits the L3 is read from it)
  --check-length N      cached tokens of the correctness check against the double reference
                        (default 1024: at least 512 takes the decode path that is timed)
  --json-out FILE       also write the rows, the CPU and ggml's version as JSON
  -h, --help            this text
)";

struct Options {
  std::vector<ggml_type> caches{GGML_TYPE_F32, GGML_TYPE_F16};
  std::vector<int64_t> lengths{4096, 32768, 65536};
  std::vector<int64_t> threads;
  int64_t batch = 1;
  int64_t heads = 32;
  int64_t kv_heads = 8;
  int64_t head_dim = 128;
  int64_t repeats = 9;
  int64_t warmup = 1;
  bool token_major = false;
  bool warm = false;
  int64_t check_length = 1024;
  std::string json_out;
};

[[noreturn]] void usage_error(const std::string& what) {
  std::fprintf(stderr, "ggml_decode_bench: %s\n(see --help)\n", what.c_str());
  std::exit(2);
}

int64_t parse_integer(const std::string& option, const std::string& text, int64_t low,
                      int64_t high) {
  char* end = nullptr;
  errno = 0;
  const long long value = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || errno == ERANGE || value < low || value > high) {
    usage_error(option + ": expected an integer in [" + std::to_string(low) + ", " +
                std::to_string(high) + "], got '" + text + "'");
  }
  return value;
}

std::vector<std::string> split(const std::string& text) {
  std::vector<std::string> parts;
  std::stringstream stream(text);
  std::string part;
  while (std::getline(stream, part, ',')) parts.push_back(part);
  return parts;
}

std::vector<int64_t> parse_list(const std::string& option, const std::string& text, int64_t low,
                                int64_t high) {
  std::vector<int64_t> values;
  for (const std::string& part : split(text))
    values.push_back(parse_integer(option, part, low, high));
  if (values.empty()) {
    usage_error(option + ": expected integers in [" + std::to_string(low) + ", " +
                std::to_string(high) + "] separated by commas, got '" + text + "'");
  }
  return values;
}

Options parse(int argc, char** argv) {
  Options options;
  const int64_t cpus = std::max<long>(1, sysconf(_SC_NPROCESSORS_ONLN));
  options.threads = cpus > 1 ? std::vector<int64_t>{1, cpus} : std::vector<int64_t>{1};
  for (int i = 1; i < argc; ++i) {
    const std::string option = argv[i];
    if (option == "-h" || option == "--help") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    }
    if (option == "--warm") {
      options.warm = true;
      continue;
    }
    static const std::vector<std::string> kValued = {
        "--cache",    "--lengths", "--threads", "--batch",     "--heads",        "--kv-heads",
        "--head-dim", "--repeats", "--warmup",  "--kv-layout", "--check-length", "--json-out"};
    if (std::find(kValued.begin(), kValued.end(), option) == kValued.end()) {
      usage_error("unknown option '" + option + "'");
    }
    if (i + 1 >= argc) usage_error(option + ": expected a value after it");
    const std::string value = argv[++i];
    if (option == "--cache") {
      options.caches.clear();
      for (const std::string& name : split(value)) {
        if (name == "f32") {
          options.caches.push_back(GGML_TYPE_F32);
        } else if (name == "f16") {
          options.caches.push_back(GGML_TYPE_F16);
        } else {
          usage_error("--cache: expected f32 or f16 (comma-separated), got '" + name + "'");
        }
      }
      if (options.caches.empty()) usage_error("--cache: expected f32 or f16, got '" + value + "'");
    } else if (option == "--lengths") {
      options.lengths = parse_list(option, value, 1, int64_t{1} << 24);
    } else if (option == "--threads") {
      options.threads = parse_list(option, value, 1, GGML_MAX_N_THREADS);
    } else if (option == "--batch") {
      options.batch = parse_integer(option, value, 1, 4096);
    } else if (option == "--heads") {
      options.heads = parse_integer(option, value, 1, 4096);
    } else if (option == "--kv-heads") {
      options.kv_heads = parse_integer(option, value, 1, 4096);
    } else if (option == "--head-dim") {
      options.head_dim = parse_integer(option, value, 1, 4096);
    } else if (option == "--repeats") {
      options.repeats = parse_integer(option, value, 1, 10000);
    } else if (option == "--warmup") {
      options.warmup = parse_integer(option, value, 0, 10000);
    } else if (option == "--kv-layout") {
      if (value != "heads" && value != "tokens") {
        usage_error("--kv-layout: expected heads or tokens, got '" + value + "'");
      }
      options.token_major = value == "tokens";
    } else if (option == "--check-length") {
      options.check_length = parse_integer(option, value, 1, int64_t{1} << 24);
    } else {  // --json-out: its folder must exist now, not after minutes of timing
      const std::filesystem::path parent = std::filesystem::path(value).parent_path();
      if (value.empty() || (!parent.empty() && !std::filesystem::is_directory(parent))) {
        usage_error("--json-out: expected a file in an existing folder, got '" + value + "'");
      }
      options.json_out = value;
    }
  }
  if (options.heads % options.kv_heads != 0) {
    usage_error("--kv-heads: expected a divisor of --heads (" + std::to_string(options.heads) +
                "), got " + std::to_string(options.kv_heads));
  }
  return options;
}

// ---- the machine ----

std::string read_first_line(const char* path) {
  std::ifstream file(path);
  std::string line;
  std::getline(file, line);
  return line;
}

int64_t l3_bytes() {
  // "32768K" in sysfs; 32 MiB where there is none, as attn bench assumes.
  const std::string text = read_first_line("/sys/devices/system/cpu/cpu0/cache/index3/size");
  char* end = nullptr;
  const long long value = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || value <= 0) return int64_t{32} << 20;
  const int64_t scale = *end == 'K' ? 1 << 10 : *end == 'M' ? 1 << 20 : *end == 'G' ? 1 << 30 : 1;
  return value * scale;
}

std::string cpu_name() {
  std::ifstream info("/proc/cpuinfo");
  std::string line, model = "?", family = "?", number = "?";
  while (std::getline(info, line)) {
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string key = line.substr(0, colon);
    key.erase(key.find_last_not_of(" \t") + 1);
    const std::string value = colon + 2 <= line.size() ? line.substr(colon + 2) : "";
    if (key == "model name" && model == "?") model = value;
    if (key == "cpu family" && family == "?") family = value;
    if (key == "model" && number == "?") number = value;
  }
  return model + " (family " + family + ", model " + number + ")";
}

int64_t available_memory() {
  std::ifstream meminfo("/proc/meminfo");
  std::string field;
  int64_t kib = 0;
  while (meminfo >> field) {
    if (field == "MemAvailable:") {
      meminfo >> kib;
      return kib * 1024;
    }
    meminfo.ignore(256, '\n');
  }
  return 0;
}

// The eviction read of attn bench's decode cases (bench/decode_cases.cpp's CacheEvictor): one
// thread sums a buffer of twice the L3, so the cache's lines are gone before the timed pass.
class Evictor {
 public:
  Evictor() : buffer_(static_cast<size_t>(2 * l3_bytes()) / sizeof(uint64_t), 1) {}
  void evict() const {
    uint64_t sum = 0;
    for (const uint64_t word : buffer_) sum += word;
    volatile uint64_t sink = sum;  // keeps the loop
    (void)sink;
  }
  int64_t bytes() const { return static_cast<int64_t>(buffer_.size() * sizeof(uint64_t)); }

 private:
  std::vector<uint64_t> buffer_;
};

// ---- the problem ----

// Seeded uniform(-1, 1), the distribution of attn bench's caches and queries (splitmix64).
class Random {
 public:
  explicit Random(uint64_t seed) : state_(seed) {}
  float uniform() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    z ^= z >> 31;
    return static_cast<float>(static_cast<double>(z >> 40) / double(1 << 23) - 1.0);
  }

 private:
  uint64_t state_;
};

const char* cache_name(ggml_type type) {
  return type == GGML_TYPE_F16 ? "f16" : "f32";
}
const char* dtype_name(ggml_type type) {
  return type == GGML_TYPE_F16 ? "float16" : "float32";
}

// One decode step as a ggml graph: q [d, 1, Hq, B] F32, k and v [d, m, Hkv, B] of the cache type
// (ne0 innermost), ggml_flash_attn_ext's result [d, Hq, 1, B]. The context owns the tensors' memory
// (ggml_aligned_malloc, as the CPU backend's buffers of llama.cpp's KV cache).
class DecodeGraph {
 public:
  DecodeGraph(const Options& options, ggml_type type, int64_t length, uint64_t seed)
      : d_(options.head_dim),
        heads_(options.heads),
        kv_heads_(options.kv_heads),
        batch_(options.batch),
        length_(length),
        type_(type) {
    const size_t element = ggml_type_size(type);
    const size_t kv_bytes = static_cast<size_t>(batch_ * kv_heads_ * length_ * d_) * element;
    const size_t q_bytes = static_cast<size_t>(batch_ * heads_ * d_) * sizeof(float);
    ggml_init_params params{};
    params.mem_size = 2 * kv_bytes + 2 * q_bytes + 16 * ggml_tensor_overhead() +
                      ggml_graph_overhead() + (size_t{1} << 20);
    params.mem_buffer = nullptr;
    params.no_alloc = false;
    context_ = ggml_init(params);
    if (context_ == nullptr) throw std::runtime_error("ggml_init failed (out of memory?)");

    q_ = ggml_new_tensor_4d(context_, GGML_TYPE_F32, d_, 1, heads_, batch_);
    if (options.token_major) {
      // llama.cpp's cache (llama_kv_cache::get_k/get_v, then the permute in build_attn_mha):
      // rows of d per (token, head), the heads of a token adjacent.
      ggml_tensor* k_store = ggml_new_tensor_4d(context_, type, d_, kv_heads_, length_, batch_);
      ggml_tensor* v_store = ggml_new_tensor_4d(context_, type, d_, kv_heads_, length_, batch_);
      k_ = ggml_permute(context_, k_store, 0, 2, 1, 3);
      v_ = ggml_permute(context_, v_store, 0, 2, 1, 3);
      fill(k_store, seed + 1);
      fill(v_store, seed + 2);
    } else {
      k_ = ggml_new_tensor_4d(context_, type, d_, length_, kv_heads_, batch_);
      v_ = ggml_new_tensor_4d(context_, type, d_, length_, kv_heads_, batch_);
      fill(k_, seed + 1);
      fill(v_, seed + 2);
    }
    fill(q_, seed);
    const float scale = 1.0F / std::sqrt(static_cast<float>(d_));
    out_ = ggml_flash_attn_ext(context_, q_, k_, v_, /*mask=*/nullptr, scale, /*max_bias=*/0.0F,
                               /*logit_softcap=*/0.0F);
    graph_ = ggml_new_graph(context_);
    ggml_build_forward_expand(graph_, out_);
  }
  DecodeGraph(const DecodeGraph&) = delete;
  DecodeGraph& operator=(const DecodeGraph&) = delete;
  ~DecodeGraph() { ggml_free(context_); }

  ggml_cgraph* graph() const { return graph_; }
  double bytes_read() const {
    return 2.0 * static_cast<double>(batch_ * kv_heads_ * length_ * d_) *
           static_cast<double>(ggml_type_size(type_));
  }

  // Largest over (sequence, head) of max_i |out_i − ref_i| / max_i |ref_i|, the reference in
  // double on the stored (for F16: rounded) K and V and the F32 query.
  double max_relative_error() const {
    const int64_t group = heads_ / kv_heads_;
    const double scale = 1.0 / std::sqrt(static_cast<double>(d_));
    std::vector<double> scores(static_cast<size_t>(length_)), reference(static_cast<size_t>(d_));
    double worst = 0.0;
    for (int64_t b = 0; b < batch_; ++b) {
      for (int64_t h = 0; h < heads_; ++h) {
        const int64_t g = h / group;  // ggml broadcasts K/V head h / (Hq / Hkv), as enable_gqa
        double top = -INFINITY;
        for (int64_t t = 0; t < length_; ++t) {
          double dot = 0.0;
          for (int64_t i = 0; i < d_; ++i) dot += value(q_, i, 0, h, b) * value(k_, i, t, g, b);
          scores[t] = dot * scale;
          top = std::max(top, scores[t]);
        }
        double sum = 0.0;
        for (double& s : scores) sum += (s = std::exp(s - top));
        std::fill(reference.begin(), reference.end(), 0.0);
        for (int64_t t = 0; t < length_; ++t) {
          for (int64_t i = 0; i < d_; ++i) reference[i] += scores[t] / sum * value(v_, i, t, g, b);
        }
        double largest = 0.0, error = 0.0;
        for (int64_t i = 0; i < d_; ++i) {
          largest = std::max(largest, std::abs(reference[i]));
          // result [d, Hq, n = 1, B]
          error = std::max(error, std::abs(value(out_, i, h, 0, b) - reference[i]));
        }
        worst = std::max(worst, largest > 0 ? error / largest : error);
      }
    }
    return worst;
  }

 private:
  static void fill(ggml_tensor* tensor, uint64_t seed) {
    Random random(seed * 0x2545f4914f6cdd1dULL + 1);
    const int64_t count = ggml_nelements(tensor);
    std::vector<float> values(static_cast<size_t>(count));
    for (float& x : values) x = random.uniform();
    if (tensor->type == GGML_TYPE_F16) {
      ggml_fp32_to_fp16_row(values.data(), static_cast<ggml_fp16_t*>(tensor->data), count);
    } else {
      std::memcpy(tensor->data, values.data(), values.size() * sizeof(float));
    }
  }

  // Element (i0, i1, i2, i3) through the tensor's byte strides nb[], so permuted views read right.
  static double value(const ggml_tensor* tensor, int64_t i0, int64_t i1, int64_t i2, int64_t i3) {
    const char* at = static_cast<const char*>(tensor->data) + i0 * tensor->nb[0] +
                     i1 * tensor->nb[1] + i2 * tensor->nb[2] + i3 * tensor->nb[3];
    if (tensor->type == GGML_TYPE_F16) {
      ggml_fp16_t bits;
      std::memcpy(&bits, at, sizeof bits);
      return ggml_fp16_to_fp32(bits);
    }
    float x;
    std::memcpy(&x, at, sizeof x);
    return x;
  }

  int64_t d_, heads_, kv_heads_, batch_, length_;
  ggml_type type_;
  ggml_context* context_ = nullptr;
  ggml_tensor *q_ = nullptr, *k_ = nullptr, *v_ = nullptr, *out_ = nullptr;
  ggml_cgraph* graph_ = nullptr;
};

// A plan per thread count with its own threadpool and work buffer, as llama.cpp's CPU backend
// keeps them across steps.
class Runner {
 public:
  Runner(ggml_cgraph* graph, int threads) : graph_(graph) {
    ggml_threadpool_params params = ggml_threadpool_params_default(threads);
    pool_ = ggml_threadpool_new(&params);
    if (pool_ == nullptr) throw std::runtime_error("ggml_threadpool_new failed");
    plan_ = ggml_graph_plan(graph, threads, pool_);
    work_.resize(plan_.work_size);
    plan_.work_data = work_.data();
  }
  Runner(const Runner&) = delete;
  Runner& operator=(const Runner&) = delete;
  ~Runner() { ggml_threadpool_free(pool_); }

  void run() {
    if (ggml_graph_compute(graph_, &plan_) != GGML_STATUS_SUCCESS) {
      throw std::runtime_error("ggml_graph_compute failed");
    }
  }

 private:
  ggml_cgraph* graph_;
  ggml_threadpool* pool_ = nullptr;
  ggml_cplan plan_{};
  std::vector<uint8_t> work_;
};

// The check's tolerance on max|out − ref| / max|ref| per head.
//  F32 K/V: 1e-3. ggml scores in F32 (vec_dot_f32) and accumulates V·p in F32, so its error is
//    float round-off, ~1e-6 here; 1e-3 catches a wrong layout, head mapping or scale.
//  F16 K/V: ggml rounds the query to F16 for the F16 dot products (the K type's vec_dot_type), a
//    relative 2^-11 per element, and — larger — keeps the V accumulator in F16
//    (ggml_vec_mad_f16 rounds the running sum to 11 bits at each of the m tokens), so its error
//    grows like sqrt(m): measured 0.6-0.75 x 2^-11 x sqrt(m) from m = 64 to 65536 (1.1e-2 at
//    m = 1024, 9.1e-2 at 65536, uniform random K/V). 2 x 2^-11 x sqrt(m) with a 1e-3 floor (3.1e-2
//    at m = 1024) leaves a margin of about 3, and a wrong layout or head mapping still gives O(1).
double tolerance(ggml_type type, int64_t length) {
  if (type == GGML_TYPE_F32) return 1e-3;
  return std::max(1e-3, 2.0 * std::ldexp(1.0, -11) * std::sqrt(static_cast<double>(length)));
}

struct Row {
  ggml_type type;
  int64_t length;
  int threads;
  double ms_median, ms_min, bytes_read, gbytes_per_second, check_error;
};

std::string json_string(const std::string& text) {
  std::string out = "\"";
  for (const char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char escaped[8];
      std::snprintf(escaped, sizeof escaped, "\\u%04x", c);
      out += escaped;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

void write_json(const std::string& path, const Options& options, const std::vector<Row>& rows,
                int64_t evicted, const std::string& load_before) {
  const std::string temporary = path + ".tmp";
  FILE* file = std::fopen(temporary.c_str(), "w");
  if (file == nullptr) {
    std::fprintf(stderr, "ggml_decode_bench: --json-out: cannot write '%s': %s\n", path.c_str(),
                 std::strerror(errno));
    std::exit(1);
  }
  std::fprintf(file, "{\n \"machine\": {\"cpu\": %s, \"logical_cpus\": %ld},\n",
               json_string(cpu_name()).c_str(), sysconf(_SC_NPROCESSORS_ONLN));
  std::fprintf(file,
               " \"ggml\": {\"version\": %s, \"commit\": %s, \"source\": %s, \"build\": %s, "
               "\"avx512\": %d, \"avx2\": %d, \"f16c\": %d, \"fma\": %d},\n",
               json_string(ggml_version()).c_str(), json_string(ggml_commit()).c_str(),
               json_string(ATTN_GGML_SOURCE).c_str(), json_string(ATTN_GGML_FLAGS).c_str(),
               ggml_cpu_has_avx512(), ggml_cpu_has_avx2(), ggml_cpu_has_f16c(), ggml_cpu_has_fma());
  std::fprintf(file,
               " \"shape\": {\"batch\": %lld, \"queries\": 1, \"heads\": %lld, \"kv_heads\": %lld, "
               "\"head_dim\": %lld, \"kv_layout\": \"%s\", \"mask\": null},\n",
               static_cast<long long>(options.batch), static_cast<long long>(options.heads),
               static_cast<long long>(options.kv_heads), static_cast<long long>(options.head_dim),
               options.token_major ? "tokens" : "heads");
  std::fprintf(file,
               " \"repeats\": %lld, \"warmup\": %lld, \"evicted_bytes\": %lld, "
               "\"check_length\": %lld, \"load_average_before\": %s,\n \"rows\": [",
               static_cast<long long>(options.repeats), static_cast<long long>(options.warmup),
               static_cast<long long>(evicted), static_cast<long long>(options.check_length),
               json_string(load_before).c_str());
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& row = rows[i];
    std::fprintf(
        file,
        "%s\n  {\"cache\": \"%s\", \"dtype\": \"%s\", \"batch\": %lld, \"n\": 1, "
        "\"m\": %lld, \"threads\": %d, \"ms\": %.6f, \"ms_min\": %.6f, "
        "\"bytes_read\": %.0f, \"gbytes_per_second\": %.4f, \"check_max_rel_error\": %.3e}",
        i ? "," : "", cache_name(row.type), dtype_name(row.type),
        static_cast<long long>(options.batch), static_cast<long long>(row.length), row.threads,
        row.ms_median, row.ms_min, row.bytes_read, row.gbytes_per_second, row.check_error);
  }
  std::fprintf(file, "\n ]\n}\n");
  if (std::fclose(file) != 0 || std::rename(temporary.c_str(), path.c_str()) != 0) {
    std::fprintf(stderr, "ggml_decode_bench: --json-out: cannot write '%s': %s\n", path.c_str(),
                 std::strerror(errno));
    std::exit(1);
  }
}

int run(const Options& options) {
  // "1 5 15"-minute load averages, as attn bench records them: a busy machine shows here.
  std::istringstream loadavg(read_first_line("/proc/loadavg"));
  std::string one = "?", five = "?", fifteen = "?";
  loadavg >> one >> five >> fifteen;
  const std::string load_before = one + " " + five + " " + fifteen;
  std::printf("ggml_decode_bench: %s, %ld logical CPUs\n", cpu_name().c_str(),
              sysconf(_SC_NPROCESSORS_ONLN));
  std::printf("ggml %s (commit %s; %s), built with %s\n", ggml_version(), ggml_commit(),
              ATTN_GGML_SOURCE, ATTN_GGML_FLAGS);
  std::printf("load average (1, 5, 15 min) before: %s\n", load_before.c_str());
  std::optional<Evictor> evictor;
  if (!options.warm) evictor.emplace();
  std::printf(
      "ggml_flash_attn_ext, B=%lld, n=1, %lld query heads over %lld key/value heads of %lld "
      "(%s-major K/V), no mask; median of %lld passes after %lld warm-up, each after %s\n",
      static_cast<long long>(options.batch), static_cast<long long>(options.heads),
      static_cast<long long>(options.kv_heads), static_cast<long long>(options.head_dim),
      options.token_major ? "token" : "head", static_cast<long long>(options.repeats),
      static_cast<long long>(options.warmup),
      evictor ? ("an eviction read of " + std::to_string(evictor->bytes() >> 20) + " MiB").c_str()
              : "no eviction read (--warm)");

  // Correctness once per cache type at --check-length, with every thread count (the decode path
  // splits the keys between the threads and merges their partial softmaxes).
  std::vector<double> check_errors;
  for (const ggml_type type : options.caches) {
    DecodeGraph check(options, type, options.check_length, 7);
    double worst = 0.0;
    for (const int64_t threads : options.threads) {
      Runner runner(check.graph(), static_cast<int>(threads));
      runner.run();
      const double error = check.max_relative_error();
      worst = std::max(worst, error);
      if (!(error <= tolerance(type, options.check_length))) {
        std::fprintf(stderr,
                     "ggml_decode_bench: CHECK FAILED: %s cache, m=%lld, %lld thread(s): max "
                     "relative error %.3e against the double reference exceeds %.3e\n",
                     cache_name(type), static_cast<long long>(options.check_length),
                     static_cast<long long>(threads), error, tolerance(type, options.check_length));
        return 1;
      }
    }
    std::printf(
        "check: %s cache, m=%lld: max relative error %.2e against the double reference "
        "(tolerance %.1e)\n",
        cache_name(type), static_cast<long long>(options.check_length), worst,
        tolerance(type, options.check_length));
    check_errors.push_back(worst);
  }

  std::printf("GB/s: bytes of K and V (2 x B x Hkv x m x d x element) / median time\n\n");
  std::printf("%-5s %5s %8s %7s %10s %10s %8s\n", "cache", "B", "m", "threads", "ms", "min ms",
              "GB/s");
  std::fflush(stdout);
  std::vector<Row> rows;
  const int64_t available = available_memory();
  for (size_t c = 0; c < options.caches.size(); ++c) {
    const ggml_type type = options.caches[c];
    for (const int64_t length : options.lengths) {
      const double cache_bytes =
          2.0 * static_cast<double>(options.batch * options.kv_heads * length * options.head_dim) *
          static_cast<double>(ggml_type_size(type));
      if (available > 0 && cache_bytes > 0.5 * static_cast<double>(available)) {
        std::printf("skipping %s m=%lld: its cache (%.0f MiB) exceeds half the available memory\n",
                    cache_name(type), static_cast<long long>(length), cache_bytes / (1 << 20));
        continue;
      }
      DecodeGraph decode(options, type, length, 1);
      for (const int64_t threads : options.threads) {
        Runner runner(decode.graph(), static_cast<int>(threads));
        std::vector<double> seconds;
        for (int64_t pass = -options.warmup; pass < options.repeats; ++pass) {
          if (evictor) evictor->evict();
          const auto start = std::chrono::steady_clock::now();
          runner.run();
          const double elapsed =
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
          if (pass >= 0) seconds.push_back(elapsed);
        }
        std::sort(seconds.begin(), seconds.end());
        const double median = seconds[seconds.size() / 2];  // attn bench's median
        Row row{type,
                length,
                static_cast<int>(threads),
                median * 1e3,
                seconds[0] * 1e3,
                decode.bytes_read(),
                decode.bytes_read() / median * 1e-9,
                check_errors[c]};
        std::printf("%-5s %5lld %8lld %7d %10.3f %10.3f %8.1f\n", cache_name(type),
                    static_cast<long long>(options.batch), static_cast<long long>(length),
                    row.threads, row.ms_median, row.ms_min, row.gbytes_per_second);
        std::fflush(stdout);
        rows.push_back(row);
      }
    }
  }
  if (!options.json_out.empty()) {
    write_json(options.json_out, options, rows, evictor ? evictor->bytes() : 0, load_before);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const Options options = parse(argc, argv);
  try {
    return run(options);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "ggml_decode_bench: %s\n", error.what());
    return 1;
  }
}
