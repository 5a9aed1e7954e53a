// `attn generate`: an end-to-end decoding demo. A toy decoder — random weights from a seed, a few
// pre-norm layers of grouped-query attention with rotary positions and a SiLU MLP, projections
// through oneDNN (attn::Linear) — prefills a random prompt through a KVCache per layer (n = P new
// queries), then generates tokens greedily one at a time against the same caches, for each cache
// dtype; it prints prefill and decoding tokens/s and the tokens themselves.
#include "generate_command.hpp"

#include <omp.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "attn/core/error.hpp"
#include "attn/core/random.hpp"
#include "attn/core/strided_view.hpp"
#include "attn/core/tensor.hpp"
#include "attn/functional/kv_cache.hpp"
#include "attn/nn/linear.hpp"
#include "number_options.hpp"

namespace attn::cli {

namespace {

// The model's fixed sizes: small enough to run anywhere, shaped like a grouped-query decoder.
constexpr int64_t kHidden = 512;
constexpr int64_t kHeads = 8;
constexpr int64_t kKvHeads = 2;
constexpr int64_t kHeadDim = kHidden / kHeads;  // 64
constexpr int64_t kMlp = 2 * kHidden;
constexpr int64_t kVocabulary = 256;
constexpr double kRopeBase = 10000.0;

struct GenerateOptions {
  std::string dtype = "all";
  int64_t layers = 4;
  int64_t prompt = 32;
  int64_t tokens = 64;
  uint64_t seed = 1;
  int threads = 0;  // 0: OpenMP's default
};

struct DTypeChoice {
  const char* name;
  CacheDType dtype;
};
constexpr std::array<DTypeChoice, 4> kDTypes{{{"float32", CacheDType::kFloat32},
                                              {"float16", CacheDType::kFloat16},
                                              {"bfloat16", CacheDType::kBFloat16},
                                              {"int8", CacheDType::kInt8}}};

struct Layer {
  Linear w_q, w_k, w_v, w_o, w_up, w_down;
  explicit Layer(Rng& rng)
      : w_q(kHidden, kHeads * kHeadDim, false, rng),
        w_k(kHidden, kKvHeads * kHeadDim, false, rng),
        w_v(kHidden, kKvHeads * kHeadDim, false, rng),
        w_o(kHeads * kHeadDim, kHidden, false, rng),
        w_up(kHidden, kMlp, false, rng),
        w_down(kMlp, kHidden, false, rng) {}
};

struct Model {
  Tensor embedding;  // (vocabulary, hidden)
  std::vector<Layer> layers;
  std::unique_ptr<Linear> output;  // hidden → vocabulary logits

  Model(int64_t count, uint64_t seed) : embedding(Shape{kVocabulary, kHidden}) {
    Rng rng(seed);
    for (float& x : embedding.span()) x = rng.normal();
    layers.reserve(static_cast<size_t>(count));
    for (int64_t l = 0; l < count; ++l) layers.emplace_back(rng);
    output = std::make_unique<Linear>(kHidden, kVocabulary, false, rng);
  }
};

// Each row of x (rows × hidden) divided by its root mean square (no learned gain: all ones).
Tensor rms_norm(const Tensor& x) {
  Tensor y(x.shape());
  const int64_t rows = x.dim(0), cols = x.dim(1);
  for (int64_t r = 0; r < rows; ++r) {
    const float* in = x.data() + r * cols;
    double squares = 0.0;
    for (int64_t c = 0; c < cols; ++c) squares += static_cast<double>(in[c]) * in[c];
    const auto inverse =
        static_cast<float>(1.0 / std::sqrt(squares / static_cast<double>(cols) + 1e-6));
    for (int64_t c = 0; c < cols; ++c) y.data()[r * cols + c] = in[c] * inverse;
  }
  return y;
}

// Rotary positions on x (rows × heads·d), row r at position first + r: each head's pairs
// (i, i + d/2) turned by position · base^(−2i/d) ("rotate half", as Llama).
void apply_rope(Tensor& x, int64_t heads, int64_t first) {
  const int64_t rows = x.dim(0), half = kHeadDim / 2;
  for (int64_t r = 0; r < rows; ++r) {
    const auto position = static_cast<double>(first + r);
    for (int64_t i = 0; i < half; ++i) {
      const double angle = position * std::pow(kRopeBase, -2.0 * static_cast<double>(i) / kHeadDim);
      const auto cosine = static_cast<float>(std::cos(angle)),
                 sine = static_cast<float>(std::sin(angle));
      for (int64_t h = 0; h < heads; ++h) {
        float* head = x.data() + r * heads * kHeadDim + h * kHeadDim;
        const float a = head[i], b = head[i + half];
        head[i] = a * cosine - b * sine;
        head[i + half] = a * sine + b * cosine;
      }
    }
  }
}

// (1, heads, rows, d) over storage laid out (rows, heads·d), as the projections write it.
ConstStridedView heads_view(const Tensor& x, int64_t heads) {
  const int64_t rows = x.dim(0);
  const std::array<int64_t, 4> strides{rows * heads * kHeadDim, kHeadDim, heads * kHeadDim, 1};
  return ConstStridedView(x.data(), Shape{1, heads, rows, kHeadDim}, strides);
}

// The n tokens' hidden states through every layer, appending their keys and values to the caches
// (whose lengths give their positions); returns the last token's logits.
std::vector<float> forward(const Model& model, const std::vector<int64_t>& tokens,
                           std::vector<KVCache>& caches) {
  const auto n = static_cast<int64_t>(tokens.size());
  Tensor x(Shape{n, kHidden});
  for (int64_t t = 0; t < n; ++t) {
    std::copy_n(model.embedding.data() + tokens[static_cast<size_t>(t)] * kHidden, kHidden,
                x.data() + t * kHidden);
  }
  AttentionOptions options;
  options.causal = true;  // query i of the n new tokens sees the cache up to its own position
  options.enable_gqa = true;
  for (size_t l = 0; l < model.layers.size(); ++l) {
    const Layer& layer = model.layers[l];
    KVCache& cache = caches[l];
    const int64_t first = cache.lengths()[0];
    const Tensor h = rms_norm(x);
    Tensor q = layer.w_q.forward(h), k = layer.w_k.forward(h);
    const Tensor v = layer.w_v.forward(h);
    apply_rope(q, kHeads, first);
    apply_rope(k, kKvHeads, first);
    cache.append(heads_view(k, kKvHeads), heads_view(v, kKvHeads));
    const AttentionForward attention =
        scaled_dot_product_attention(heads_view(q, kHeads), cache, options);
    // (1, heads, n, d) back to (n, heads·d) for the output projection.
    Tensor merged(Shape{n, kHeads * kHeadDim});
    for (int64_t hd = 0; hd < kHeads; ++hd) {
      for (int64_t t = 0; t < n; ++t) {
        std::copy_n(attention.output.data() + (hd * n + t) * kHeadDim, kHeadDim,
                    merged.data() + t * kHeads * kHeadDim + hd * kHeadDim);
      }
    }
    const Tensor projected = layer.w_o.forward(merged);
    for (int64_t e = 0; e < x.numel(); ++e) x.data()[e] += projected.data()[e];
    Tensor up = layer.w_up.forward(rms_norm(x));
    for (float& u : up.span()) u = u / (1.0F + std::exp(-u));  // SiLU
    const Tensor down = layer.w_down.forward(up);
    for (int64_t e = 0; e < x.numel(); ++e) x.data()[e] += down.data()[e];
  }
  Tensor last(Shape{1, kHidden});
  std::copy_n(x.data() + (n - 1) * kHidden, kHidden, last.data());
  const Tensor logits = model.output->forward(rms_norm(last));
  return {logits.data(), logits.data() + kVocabulary};
}

struct Greedy {
  int64_t token = 0;
  float margin = 0.0F;  // top-1 logit − top-2 logit: how far this choice is from flipping
};

Greedy greedy(const std::vector<float>& logits) {
  Greedy choice;
  float best = -std::numeric_limits<float>::infinity(), second = best;
  for (size_t i = 0; i < logits.size(); ++i) {
    if (logits[i] > best) {
      second = best;
      best = logits[i];
      choice.token = static_cast<int64_t>(i);
    } else if (logits[i] > second) {
      second = logits[i];
    }
  }
  choice.margin = best - second;
  return choice;
}

struct RunResult {
  std::string dtype;
  double prefill_seconds = 0.0;
  double decode_seconds = 0.0;
  int64_t cache_bytes = 0;
  std::vector<int64_t> tokens;
  float smallest_margin = std::numeric_limits<float>::infinity();
  // The first run's logits at every step, for the runs after it to compare with.
  std::vector<std::vector<float>> logits;
  // The largest |logit − first run's logit| over the steps where both had chosen the same tokens
  // so far (the same inputs); null for the first run.
  std::optional<float> largest_change;
};

// Records `logits` of a step: kept by the first run, compared with the first run's by the others
// while their tokens agree.
void record(RunResult& result, const RunResult* base, const std::vector<float>& logits) {
  const size_t step = result.tokens.size();
  if (base == nullptr) {
    result.logits.push_back(logits);
    return;
  }
  if (!std::equal(result.tokens.begin(), result.tokens.end(), base->tokens.begin())) return;
  float change = result.largest_change.value_or(0.0F);
  for (size_t i = 0; i < logits.size(); ++i)
    change = std::max(change, std::fabs(logits[i] - base->logits[step][i]));
  result.largest_change = change;
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

RunResult generate(const Model& model, const std::vector<int64_t>& prompt,
                   const GenerateOptions& options, const DTypeChoice& dtype,
                   const RunResult* base) {
  RunResult result;
  result.dtype = dtype.name;
  const int64_t capacity = static_cast<int64_t>(prompt.size()) + options.tokens;
  std::vector<KVCache> caches;
  for (int64_t l = 0; l < options.layers; ++l)
    caches.emplace_back(1, kKvHeads, kHeadDim, capacity, dtype.dtype);
  result.cache_bytes = options.layers * capacity * caches[0].bytes_per_token();

  const auto start = std::chrono::steady_clock::now();
  std::vector<float> logits = forward(model, prompt, caches);
  result.prefill_seconds = seconds_since(start);
  Greedy next = greedy(logits);
  record(result, base, logits);
  result.tokens.push_back(next.token);
  result.smallest_margin = next.margin;

  // Each step feeds the last token chosen and chooses the next: tokens − 1 decode passes.
  const auto decode_start = std::chrono::steady_clock::now();
  auto last_progress = decode_start;
  for (int64_t step = 1; step < options.tokens; ++step) {
    logits = forward(model, {next.token}, caches);
    next = greedy(logits);
    record(result, base, logits);
    result.tokens.push_back(next.token);
    result.smallest_margin = std::min(result.smallest_margin, next.margin);
    if (seconds_since(last_progress) > 2.0) {
      last_progress = std::chrono::steady_clock::now();
      const double elapsed = seconds_since(decode_start);
      char line[160];
      std::snprintf(line, sizeof line, "attn generate: %s: %lld/%lld tokens, %.1f tokens/s\n",
                    dtype.name, static_cast<long long>(step + 1),
                    static_cast<long long>(options.tokens), static_cast<double>(step) / elapsed);
      std::cerr << line;
    }
  }
  result.decode_seconds = seconds_since(decode_start);
  return result;
}

void run(const GenerateOptions& options) {
  std::vector<DTypeChoice> chosen;
  for (const DTypeChoice& choice : kDTypes) {
    if (options.dtype == "all" || options.dtype == choice.name) chosen.push_back(choice);
  }
  if (chosen.empty()) {
    throw ValueError("--dtype: expected all, float32, float16, bfloat16 or int8, got '" +
                     options.dtype + "'");
  }
  if (options.threads > 0) {
    omp_set_num_threads(options.threads);  // attention and the projections (oneDNN on OpenMP)
  }
  const int threads = omp_get_max_threads();
  const Model model(options.layers, options.seed);
  Rng prompt_rng(options.seed + 1);
  std::vector<int64_t> prompt(static_cast<size_t>(options.prompt));
  for (int64_t& token : prompt)
    token = static_cast<int64_t>(prompt_rng.next_u64() % static_cast<uint64_t>(kVocabulary));

  std::cout << "attn generate: " << options.layers << " layers, hidden " << kHidden << ", "
            << kHeads << " query heads over " << kKvHeads << " key/value heads of " << kHeadDim
            << " (rotary positions, RMS norm, SiLU MLP of " << kMlp << "), vocabulary "
            << kVocabulary << ", random weights from seed " << options.seed << ", " << threads
            << " thread(s)\n"
            << "prompt: " << options.prompt << " random tokens, prefilled through each layer's "
            << "KV cache at once; then " << options.tokens
            << " tokens generated greedily, one decode pass each after the first\n\n";
  char line[200];
  std::snprintf(line, sizeof line, "%-9s %10s %14s %14s %11s %11s\n", "dtype", "cache MiB",
                "prefill tok/s", "decode tok/s", "min margin", "max change");
  std::cout << line;
  {
    // Warm-up, untimed: OpenMP's threads started, oneDNN's kernels generated, the weights' pages
    // touched.
    std::vector<KVCache> caches;
    for (int64_t l = 0; l < options.layers; ++l)
      caches.emplace_back(1, kKvHeads, kHeadDim, options.prompt, CacheDType::kFloat32);
    forward(model, prompt, caches);
  }
  std::vector<RunResult> results;
  results.reserve(chosen.size());
  for (const DTypeChoice& choice : chosen) {
    results.push_back(
        generate(model, prompt, options, choice, results.empty() ? nullptr : &results.front()));
    const RunResult& r = results.back();
    char decode[32] = "-";
    if (options.tokens > 1) {
      std::snprintf(decode, sizeof decode, "%.1f",
                    static_cast<double>(options.tokens - 1) / r.decode_seconds);
    }
    char change[32] = "-";
    if (r.largest_change) {
      std::snprintf(change, sizeof change, "%.4f", static_cast<double>(*r.largest_change));
    }
    std::snprintf(line, sizeof line, "%-9s %10.2f %14.1f %14s %11.4f %11s\n", r.dtype.c_str(),
                  static_cast<double>(r.cache_bytes) / (1 << 20),
                  static_cast<double>(options.prompt) / r.prefill_seconds, decode,
                  static_cast<double>(r.smallest_margin), change);
    std::cout << line << std::flush;
  }
  std::cout << "\nmin margin: the smallest gap between the two largest logits over the generated "
               "tokens; max change: the largest change of a logit from the first dtype's at the "
               "same step, while the tokens so far agree. A dtype's rounding can change a greedy "
               "choice only where the margin is below about twice the change\n";
  for (const RunResult& r : results) {
    std::cout << "tokens " << r.dtype << ":";
    for (const int64_t token : r.tokens) std::cout << ' ' << token;
    std::cout << "\n";
  }
  const RunResult& base = results.front();
  for (const RunResult& r : results) {
    if (&r == &base) continue;
    const auto differ = std::mismatch(r.tokens.begin(), r.tokens.end(), base.tokens.begin());
    if (differ.first == r.tokens.end()) {
      std::cout << r.dtype << ": the same tokens as " << base.dtype << "\n";
    } else {
      std::cout << r.dtype << ": differs from " << base.dtype << " from token "
                << (differ.first - r.tokens.begin()) << " on\n";
    }
  }
}

}  // namespace

void add_generate_command(CLI::App& app) {
  auto options = std::make_shared<GenerateOptions>();
  CLI::App* command = app.add_subcommand(
      "generate", "Decode token by token with a toy model over a KV cache per layer");
  command->footer(
      "A toy decoder (random weights from --seed; hidden 512, 8 query heads over 2 key/value "
      "heads of 64, rotary positions, RMS norm, a SiLU MLP of 1024, vocabulary 256) prefills a "
      "random prompt of --prompt tokens through one attn::KVCache per layer "
      "(attn::scaled_dot_product_attention with n = P new queries), then generates --tokens "
      "tokens greedily, one decode pass per token. Prints tokens/s of prefill and decoding for "
      "each cache dtype, and the tokens.");
  command->add_option("--dtype", options->dtype,
                      "Cache dtype: all, float32, float16, bfloat16 or int8");
  command->add_option("--layers", options->layers, "Decoder layers")
      ->transform(number_check(options->layers, from_to(1, 256)));
  command->add_option("--prompt", options->prompt, "Prompt tokens P (prefilled at once)")
      ->transform(number_check(options->prompt, from_to(1, 1 << 20)));
  command->add_option("--tokens", options->tokens, "Tokens to generate")
      ->transform(number_check(options->tokens, from_to(1, 1 << 20)));
  command->add_option("--seed", options->seed, "Seed of the weights and the prompt")
      ->transform(number_check(options->seed));
  command
      ->add_option("--threads", options->threads,
                   "Threads for attention and the projections (default: OpenMP's)")
      ->transform(number_check(options->threads, from_to(1, 1024)))
      // Absent means OpenMP's count, which the 0 it is held as is not a value to type.
      ->default_str("");
  command->callback([options] { run(*options); });
}

}  // namespace attn::cli
