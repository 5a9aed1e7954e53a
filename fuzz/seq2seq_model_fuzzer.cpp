// Fuzz target: the seq2seq model loader (Translator::parse, what Translator::load and
// `attn translate` run on a model directory). The input is the three files joined by a separator
// line: config.json, vocab.json, then model.safetensors. A model that loads translates a sentence.
#include <string_view>

#include "attn/seq2seq/translator.hpp"
#include "fuzz_support.hpp"

namespace {

constexpr std::string_view kSeparator = "\n#attn-fuzz#\n";

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const size_t first = text.find(kSeparator);
  if (first == std::string_view::npos) return 0;
  const size_t second = text.find(kSeparator, first + kSeparator.size());
  if (second == std::string_view::npos) return 0;
  const std::string_view config = text.substr(0, first);
  const std::string_view vocab =
      text.substr(first + kSeparator.size(), second - first - kSeparator.size());
  const std::string_view weights = text.substr(second + kSeparator.size());
  attn::fuzz::refuse_only_with_attn_errors([&] {
    attn::Translator translator = attn::Translator::parse(
        config, vocab, std::as_bytes(std::span(weights.data(), weights.size())), "fuzz-model");
    // Decoding costs num_steps steps of the (file-sized) model: keep an execution short.
    if (translator.num_steps() <= 64) {
      const attn::Translation translation = translator.translate("3 march 1987");
      attn::fuzz::require_finite_output(translation.attention, "non-finite attention weights");
    }
  });
  return 0;
}
