// Translator: batched greedy decoding, and the model directory (safetensors, vocabularies and
// hyper-parameters in JSON) with every field checked on loading.
#include "attn/seq2seq/translator.hpp"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <string_view>
#include <variant>

#include "attn/core/error.hpp"
#include "attn/io/safetensors.hpp"
#include "attn/seq2seq/corpus.hpp"
#include "core/file_access.hpp"
#include "io/bounded_json.hpp"
#include "io/excerpt.hpp"

namespace attn {

namespace {

constexpr const char* kFormatName = "attn-seq2seq";
constexpr int kFormatVersion = 1;
// Far above any model this CPU code trains, low enough that a corrupt file cannot make the
// constructor allocate without bound before the tensors are checked.
constexpr int64_t kMaximumSize = 1 << 16;
constexpr int64_t kMaximumLayers = 64;
constexpr int64_t kMaximumParameters = int64_t{1} << 28;
// config.json holds a dozen fields; vocab.json two token lists of at most kMaximumSize tokens each.
// Sizes and value counts far above those bound the memory a hostile file can make parsing take.
constexpr uint64_t kMaximumConfigBytes = 1 << 20;
constexpr uint64_t kMaximumVocabularyBytes = uint64_t{64} << 20;
constexpr io_detail::JsonLimits kConfigLimits{16, 10'000};
constexpr io_detail::JsonLimits kVocabularyLimits{16, 2 * kMaximumSize + 100};

void write_text(const std::filesystem::path& path, const std::string& text) {
  file_access::write_bytes_atomically(path, std::as_bytes(std::span(text.data(), text.size())));
}

// A file's text: a regular file (a FIFO or a device is refused before it can block) of at most
// `max_size` bytes.
std::string read_text(const std::filesystem::path& path, uint64_t max_size) {
  std::vector<std::byte> bytes;
  try {
    bytes = file_access::read_regular_file(path, max_size);
  } catch (const FileError& error) {
    throw FileError(std::string(error.what()) +
                    " (is this a model directory written by 'attn train seq2seq'?)");
  }
  return std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}

// The value under `key`, or null when `json` is not an object or lacks it (so that a message can
// say "none"); never nlohmann's assertion or exception.
const nlohmann::json* find_field(const nlohmann::json& json, const std::string& key) {
  if (!json.is_object()) return nullptr;
  const auto found = json.find(key);
  return found == json.end() ? nullptr : &*found;
}

std::string field_text(const nlohmann::json* value) {
  return value != nullptr ? io_detail::json_excerpt(*value) : std::string("none");
}

int64_t integer_field(const nlohmann::json& json, const std::string& key, int64_t low, int64_t high,
                      const std::filesystem::path& path) {
  const nlohmann::json* field = find_field(json, key);
  // is_number_integer holds for unsigned values beyond int64 too: compare as unsigned first.
  if (field == nullptr || !field->is_number_integer() ||
      (field->is_number_unsigned() &&
       field->get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))) {
    throw FileError(path.string() + ": expected an integer field \"" + key + "\" in [" +
                    std::to_string(low) + ", " + std::to_string(high) + "], got " +
                    field_text(field));
  }
  const auto value = field->get<int64_t>();
  if (value < low || value > high) {
    throw FileError(path.string() + ": expected \"" + key + "\" in [" + std::to_string(low) + ", " +
                    std::to_string(high) + "], got " + std::to_string(value));
  }
  return value;
}

std::vector<std::string> token_list(const nlohmann::json& json, const std::string& key,
                                    const std::filesystem::path& path) {
  const nlohmann::json* field = find_field(json, key);
  if (field == nullptr || !field->is_array()) {
    throw FileError(path.string() + ": expected a token array \"" + key + "\", got " +
                    (field != nullptr ? io_detail::json_kind(*field) : std::string("none")));
  }
  std::vector<std::string> tokens;
  for (const auto& token : *field) {
    if (!token.is_string()) {
      throw FileError(path.string() + ": expected strings in \"" + key + "\", got " +
                      io_detail::json_excerpt(token));
    }
    tokens.push_back(token.get<std::string>());
  }
  return tokens;
}

// The parameters Seq2Seq(config) allocates, counted from the sizes alone: the encoder's embedding
// and GRU, the decoder's attention (W_q, W_k: h × h; w_v: 1 × h), embedding, GRU (whose first
// layer reads the embedding and the context) and dense layer (with bias).
int64_t parameter_count(const Seq2SeqConfig& config) {
  const int64_t h = config.num_hiddens, e = config.embed_size, gates = 3 * h;
  const auto gru = [&](int64_t input) {
    int64_t count = 0;
    for (int64_t layer = 0; layer < config.num_layers; ++layer) {
      count += gates * (layer == 0 ? input : h) + gates * h + 2 * gates;
    }
    return count;
  };
  return config.source_vocab_size * e + gru(e) + 2 * h * h + h + config.target_vocab_size * e +
         gru(e + h) + config.target_vocab_size * (h + 1);
}

}  // namespace

Translator::Translator(Seq2Seq model, Vocabulary source_vocabulary, Vocabulary target_vocabulary,
                       TokenizerKind tokenizer, int64_t num_steps)
    : model_(std::move(model)),
      source_vocabulary_(std::move(source_vocabulary)),
      target_vocabulary_(std::move(target_vocabulary)),
      tokenizer_(tokenizer),
      num_steps_(num_steps) {
  if (source_vocabulary_.size() != model_.config().source_vocab_size ||
      target_vocabulary_.size() != model_.config().target_vocab_size) {
    throw ValueError("Translator: expected vocabularies of the model's sizes (" +
                     std::to_string(model_.config().source_vocab_size) + ", " +
                     std::to_string(model_.config().target_vocab_size) + "), got " +
                     std::to_string(source_vocabulary_.size()) + " and " +
                     std::to_string(target_vocabulary_.size()));
  }
  if (num_steps < 1)
    throw ValueError("num_steps: expected at least 1, got " + std::to_string(num_steps));
}

namespace {

// Finite parameters can still overflow float inside the GRUs or the dense layer (weights near
// 1e38 from a hand-made file): that is an error, never NaN logits or weights in a translation.
void require_finite_result(const Tensor& values, std::string_view what, int64_t step) {
  const std::span<const float> data = values.span();
  if (std::all_of(data.begin(), data.end(), [](float v) { return std::isfinite(v); })) return;
  throw ValueError("model: its parameters overflow float while translating (non-finite " +
                   std::string(what) +
                   (step >= 0 ? " at step " + std::to_string(step) : std::string()) +
                   "); a model's parameters must keep every activation below float's maximum");
}

}  // namespace

std::vector<Translation> Translator::translate(const std::vector<std::vector<std::string>>& sources,
                                               int64_t batch_size) {
  if (batch_size < 1)
    throw ValueError("batch_size: expected at least 1, got " + std::to_string(batch_size));
  model_.eval();
  const EncodedSequences encoded = encode_sequences(sources, source_vocabulary_, num_steps_);
  std::vector<Translation> translations(sources.size());
  for (size_t index = 0; index < sources.size(); ++index) {
    translations[index].source_length = static_cast<int64_t>(sources[index].size());
  }
  const int64_t count = encoded.count, steps = num_steps_;
  for (int64_t first = 0; first < count; first += batch_size) {
    const int64_t batch = std::min(batch_size, count - first);
    const std::span<const int64_t> source(encoded.ids.data() + first * steps,
                                          static_cast<size_t>(batch * steps));
    const std::span<const int64_t> valid_lens(encoded.valid_lens.data() + first,
                                              static_cast<size_t>(batch));
    GruOutput encoder_output = model_.encoder().forward(source, batch, steps);
    BahdanauDecoder& decoder = model_.decoder();
    decoder.begin(encoder_output.outputs, encoder_output.state,
                  attention_valid_lens(source, valid_lens, steps, model_.config().attend_to_eos));
    std::vector<int64_t> tokens(static_cast<size_t>(batch), Vocabulary::kBos);
    std::vector<int64_t> rows(static_cast<size_t>(batch), 0);
    std::vector<bool> done(static_cast<size_t>(batch), false);
    int64_t finished = 0;
    for (int64_t t = 0; t < steps && finished < batch; ++t) {
      const Tensor logits = decoder.step(tokens);
      require_finite_result(logits, "logits", t);
      const int64_t vocab = logits.dim(1);
      for (int64_t b = 0; b < batch; ++b) {
        const auto index = static_cast<size_t>(b);
        if (done[index]) continue;
        const float* row = logits.data() + b * vocab;
        const int64_t predicted = std::max_element(row, row + vocab) - row;
        ++rows[index];
        tokens[index] = predicted;
        if (predicted == Vocabulary::kEos) {
          done[index] = true;
          ++finished;
        } else {
          translations[static_cast<size_t>(first + b)].tokens.push_back(
              target_vocabulary_.token(predicted));
        }
      }
    }
    const Tensor weights = decoder.attention_weights();  // (steps taken, batch, num_steps)
    require_finite_result(weights, "attention weights", -1);
    for (int64_t b = 0; b < batch; ++b) {
      Translation& translation = translations[static_cast<size_t>(first + b)];
      const int64_t length = valid_lens[static_cast<size_t>(b)];
      for (int64_t j = 0; j < length; ++j)
        translation.source_tokens.push_back(
            source_vocabulary_.token(source[static_cast<size_t>(b * steps + j)]));
      const int64_t decoded_rows = rows[static_cast<size_t>(b)];
      translation.attention = Tensor(Shape{decoded_rows, length});
      for (int64_t t = 0; t < decoded_rows; ++t)
        for (int64_t j = 0; j < length; ++j) translation.attention(t, j) = weights(t, b, j);
      translation.text = detokenize(translation.tokens, tokenizer_);
    }
  }
  return translations;
}

Translation Translator::translate(std::string_view text) {
  std::vector<std::string> tokens = tokenize(text, tokenizer_);
  if (tokens.empty())
    throw ValueError("text: expected at least one token to translate, got an empty input");
  return std::move(translate(std::vector<std::vector<std::string>>{std::move(tokens)}).front());
}

void Translator::save(const std::filesystem::path& directory,
                      const std::map<std::string, RecordValue>& training_record) const {
  std::error_code error;
  std::filesystem::create_directories(directory, error);
  if (error || !std::filesystem::is_directory(directory)) {
    throw FileError(directory.string() + ": cannot create the model directory" +
                    (error ? " (" + error.message() + ")" : std::string()));
  }
  // Every file's bytes first: a token that is not UTF-8 (a Latin-1 corpus) failed vocab.json's
  // JSON after model.safetensors was replaced, leaving new weights beside the old vocabulary.
  const std::vector<std::byte> weights =
      serialize_safetensors(model_.state_dict(), {{"format", kFormatName}});
  const nlohmann::json vocab = {{"source", source_vocabulary_.tokens()},
                                {"target", target_vocabulary_.tokens()}};
  std::string vocab_text;
  try {
    vocab_text = vocab.dump() + "\n";
  } catch (const nlohmann::json::type_error& not_utf8) {
    throw ValueError((directory / "vocab.json").string() +
                     ": expected tokens of UTF-8 text, got one that is not (" + not_utf8.what() +
                     ")");
  }
  const Seq2SeqConfig& config = model_.config();
  nlohmann::json training = nlohmann::json::object();
  for (const auto& [key, value] : training_record)
    training[key] = std::visit([](auto number) { return nlohmann::json(number); }, value);
  const nlohmann::json hyper = {{"format", kFormatName},
                                {"version", kFormatVersion},
                                {"tokenizer", tokenizer_name(tokenizer_)},
                                {"num_steps", num_steps_},
                                {"source_vocab_size", config.source_vocab_size},
                                {"target_vocab_size", config.target_vocab_size},
                                {"embed_size", config.embed_size},
                                {"num_hiddens", config.num_hiddens},
                                {"num_layers", config.num_layers},
                                {"dropout", config.dropout},
                                {"attend_to_eos", config.attend_to_eos},
                                {"training", training}};
  const std::string config_text = hyper.dump(2) + "\n";
  file_access::write_bytes_atomically(directory / "model.safetensors", weights);
  write_text(directory / "vocab.json", vocab_text);
  write_text(directory / "config.json", config_text);
}

Translator Translator::load(const std::filesystem::path& directory) {
  if (!std::filesystem::is_directory(directory)) {
    throw FileError(directory.string() +
                    ": no such model directory (expected one written by 'attn train seq2seq', "
                    "holding model.safetensors, vocab.json and config.json)");
  }
  // Each file is read only once the ones before it passed, so that a message is about the first
  // problem.
  const std::string config = read_text(directory / "config.json", kMaximumConfigBytes);
  return build(
      config, [&] { return read_text(directory / "vocab.json", kMaximumVocabularyBytes); },
      [&] {
        try {
          return file_access::read_regular_file(directory / "model.safetensors");
        } catch (const FileError& error) {
          throw FileError(std::string(error.what()) + " (the model's weights)");
        }
      },
      directory);
}

Translator Translator::parse(std::string_view config_json, std::string_view vocab_json,
                             std::span<const std::byte> model_safetensors,
                             const std::filesystem::path& directory) {
  return build(
      config_json, [&] { return std::string(vocab_json); },
      [&] { return std::vector<std::byte>(model_safetensors.begin(), model_safetensors.end()); },
      directory);
}

Translator Translator::build(std::string_view config_json,
                             const std::function<std::string()>& read_vocab,
                             const std::function<std::vector<std::byte>()>& read_weights,
                             const std::filesystem::path& directory) {
  const std::filesystem::path config_path = directory / "config.json";
  const std::string config_name = config_path.string();
  if (config_json.size() > kMaximumConfigBytes) {
    throw FileError(config_name + ": expected at most " + std::to_string(kMaximumConfigBytes) +
                    " bytes, got " + std::to_string(config_json.size()));
  }
  const nlohmann::json hyper =
      io_detail::parse_bounded_json(config_json, config_name, "the file", kConfigLimits);
  const nlohmann::json* format = find_field(hyper, "format");
  if (format == nullptr || !format->is_string() || format->get<std::string>() != kFormatName) {
    throw FileError(config_name + ": expected \"format\": \"" + kFormatName + "\", got " +
                    field_text(format));
  }
  integer_field(hyper, "version", kFormatVersion, kFormatVersion, config_path);
  Seq2SeqConfig config;
  config.source_vocab_size =
      integer_field(hyper, "source_vocab_size", 4, kMaximumSize, config_path);
  config.target_vocab_size =
      integer_field(hyper, "target_vocab_size", 4, kMaximumSize, config_path);
  config.embed_size = integer_field(hyper, "embed_size", 1, kMaximumSize, config_path);
  config.num_hiddens = integer_field(hyper, "num_hiddens", 1, kMaximumSize, config_path);
  config.num_layers = integer_field(hyper, "num_layers", 1, kMaximumLayers, config_path);
  const int64_t num_steps = integer_field(hyper, "num_steps", 1, kMaximumSize, config_path);
  const nlohmann::json* dropout = find_field(hyper, "dropout");
  if (dropout == nullptr || !dropout->is_number() ||
      !(dropout->get<double>() >= 0.0 && dropout->get<double>() <= 1.0)) {
    throw FileError(config_name + ": expected \"dropout\" in [0, 1], got " + field_text(dropout));
  }
  config.dropout = dropout->get<float>();
  // Optional: directories written before the field existed used the book's model.
  if (const nlohmann::json* attend = find_field(hyper, "attend_to_eos")) {
    if (!attend->is_boolean()) {
      throw FileError(config_name + ": expected \"attend_to_eos\" true or false, got " +
                      field_text(attend));
    }
    config.attend_to_eos = attend->get<bool>();
  }
  const nlohmann::json* tokenizer_field = find_field(hyper, "tokenizer");
  if (tokenizer_field == nullptr || !tokenizer_field->is_string()) {
    throw FileError(config_name + ": expected a string field \"tokenizer\", got " +
                    field_text(tokenizer_field));
  }
  TokenizerKind tokenizer = TokenizerKind::kBook;
  try {
    tokenizer = tokenizer_from_name(tokenizer_field->get<std::string>());
  } catch (const ValueError& error) {
    throw FileError(config_name + ": " + io_detail::escaped(error.what(), 200));
  }

  const std::filesystem::path vocab_path = directory / "vocab.json";
  const std::string vocab_json = read_vocab();
  if (vocab_json.size() > kMaximumVocabularyBytes) {
    throw FileError(vocab_path.string() + ": expected at most " +
                    std::to_string(kMaximumVocabularyBytes) + " bytes, got " +
                    std::to_string(vocab_json.size()));
  }
  const nlohmann::json vocab =
      io_detail::parse_bounded_json(vocab_json, vocab_path.string(), "the file", kVocabularyLimits);
  if (!vocab.is_object()) {
    throw FileError(vocab_path.string() + ": expected a JSON object, got " +
                    io_detail::json_kind(vocab));
  }
  auto make_vocabulary = [&](const std::string& key, int64_t expected_size) {
    std::vector<std::string> tokens = token_list(vocab, key, vocab_path);
    if (static_cast<int64_t>(tokens.size()) != expected_size) {
      throw FileError(vocab_path.string() + ": expected " + std::to_string(expected_size) + " \"" +
                      key + "\" tokens (config.json's " + key + "_vocab_size), got " +
                      std::to_string(tokens.size()));
    }
    try {
      return Vocabulary::from_tokens(std::move(tokens));
    } catch (const ValueError& error) {
      // The message quotes a token from the file: escaped.
      throw FileError(vocab_path.string() + ": \"" + key +
                      "\": " + io_detail::escaped(error.what(), 200));
    }
  };
  Vocabulary source = make_vocabulary("source", config.source_vocab_size);
  Vocabulary target = make_vocabulary("target", config.target_vocab_size);

  // The sizes are each bounded; the parameters they make must be too, and must be in the weights
  // file before anything is allocated for them: a 200-byte config.json cannot make attn allocate
  // and initialise a gigabyte of parameters that model.safetensors does not hold.
  const int64_t expected_parameters = parameter_count(config);
  if (expected_parameters > kMaximumParameters) {
    throw FileError(config_name + ": expected a model of at most " +
                    std::to_string(kMaximumParameters) + " parameters, got sizes that make " +
                    std::to_string(expected_parameters));
  }
  const std::filesystem::path weights_path = directory / "model.safetensors";
  const StateDict state = parse_safetensors(read_weights(), weights_path.string());
  int64_t stored = 0;
  for (const auto& [name, tensor] : state) {
    stored += tensor.numel();
    // A NaN or an infinity would reach every translation; a finite model cannot hold one.
    for (const float value : tensor.span()) {
      if (!std::isfinite(value)) {
        throw FileError(weights_path.string() + ": tensor '" + io_detail::escaped(name) +
                        "': expected finite values, got " + std::to_string(value));
      }
    }
  }
  if (stored != expected_parameters) {
    throw ShapeError(
        weights_path.string() + ": expected the " + std::to_string(expected_parameters) +
        " parameters that config.json's sizes make, got tensors holding " + std::to_string(stored));
  }
  Seq2Seq model(config, 0);
  try {
    model.load_state_dict(state);
  } catch (const ShapeError& error) {
    throw ShapeError(weights_path.string() + ": " + io_detail::escaped(error.what(), 300));
  }
  return Translator(std::move(model), std::move(source), std::move(target), tokenizer, num_steps);
}

}  // namespace attn
