// Translator: batched greedy decoding, and the model directory (safetensors, vocabularies and
// hyper-parameters in JSON) with every field checked on loading.
#include "attn/seq2seq/translator.hpp"

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "attn/core/error.hpp"
#include "attn/io/safetensors.hpp"
#include "attn/seq2seq/corpus.hpp"

namespace attn {

namespace {

constexpr const char* kFormatName = "attn-seq2seq";
constexpr int kFormatVersion = 1;
// Far above any model this CPU code trains, low enough that a corrupt file cannot make the
// constructor allocate without bound before the tensors are checked.
constexpr int64_t kMaximumSize = 1 << 16;
constexpr int64_t kMaximumLayers = 64;
constexpr int64_t kMaximumParameters = int64_t{1} << 28;

void write_text(const std::filesystem::path& path, const std::string& text) {
  std::ofstream file(path, std::ios::binary);
  file << text;
  file.close();
  if (!file) throw FileError(path.string() + ": cannot write the file");
}

nlohmann::json read_json(const std::filesystem::path& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file)
    throw FileError(path.string() +
                    ": cannot open the file (is this a model directory "
                    "written by 'attn train seq2seq'?)");
  std::ostringstream contents;
  contents << file.rdbuf();
  try {
    return nlohmann::json::parse(contents.str());
  } catch (const nlohmann::json::exception& error) {
    throw FileError(path.string() + ": expected JSON, got a parse error: " + error.what());
  }
}

int64_t integer_field(const nlohmann::json& json, const std::string& key, int64_t low, int64_t high,
                      const std::filesystem::path& path) {
  if (!json.contains(key) || !json[key].is_number_integer()) {
    throw FileError(path.string() + ": expected an integer field \"" + key + "\", got " +
                    (json.contains(key) ? json[key].dump() : std::string("none")));
  }
  const auto value = json[key].get<int64_t>();
  if (value < low || value > high) {
    throw FileError(path.string() + ": expected \"" + key + "\" in [" + std::to_string(low) + ", " +
                    std::to_string(high) + "], got " + std::to_string(value));
  }
  return value;
}

std::vector<std::string> token_list(const nlohmann::json& json, const std::string& key,
                                    const std::filesystem::path& path) {
  if (!json.contains(key) || !json[key].is_array()) {
    throw FileError(path.string() + ": expected a token array \"" + key + "\", got " +
                    (json.contains(key) ? json[key].type_name() : std::string("none")));
  }
  std::vector<std::string> tokens;
  for (const auto& token : json[key]) {
    if (!token.is_string())
      throw FileError(path.string() + ": expected strings in \"" + key + "\", got " + token.dump());
    tokens.push_back(token.get<std::string>());
  }
  return tokens;
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

std::vector<Translation> Translator::translate(const std::vector<std::vector<std::string>>& sources,
                                               int64_t batch_size) {
  if (batch_size < 1)
    throw ValueError("batch_size: expected at least 1, got " + std::to_string(batch_size));
  model_.eval();
  const EncodedSequences encoded = encode_sequences(sources, source_vocabulary_, num_steps_);
  std::vector<Translation> translations(sources.size());
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
                      const std::map<std::string, double>& training_record) const {
  std::error_code error;
  std::filesystem::create_directories(directory, error);
  if (error || !std::filesystem::is_directory(directory)) {
    throw FileError(directory.string() + ": cannot create the model directory" +
                    (error ? " (" + error.message() + ")" : std::string()));
  }
  save_safetensors(directory / "model.safetensors", model_.state_dict(), {{"format", kFormatName}});
  const nlohmann::json vocab = {{"source", source_vocabulary_.tokens()},
                                {"target", target_vocabulary_.tokens()}};
  write_text(directory / "vocab.json", vocab.dump() + "\n");
  const Seq2SeqConfig& config = model_.config();
  nlohmann::json training = nlohmann::json::object();
  for (const auto& [key, value] : training_record) training[key] = value;
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
  write_text(directory / "config.json", hyper.dump(2) + "\n");
}

Translator Translator::load(const std::filesystem::path& directory) {
  if (!std::filesystem::is_directory(directory)) {
    throw FileError(directory.string() +
                    ": no such model directory (expected one written by 'attn train seq2seq', "
                    "holding model.safetensors, vocab.json and config.json)");
  }
  const std::filesystem::path config_path = directory / "config.json";
  const nlohmann::json hyper = read_json(config_path);
  if (!hyper.is_object() || hyper.value("format", std::string()) != kFormatName) {
    throw FileError(config_path.string() + ": expected \"format\": \"" + kFormatName + "\", got " +
                    (hyper.is_object() && hyper.contains("format") ? hyper["format"].dump()
                                                                   : std::string("none")));
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
  if (!hyper.contains("dropout") || !hyper["dropout"].is_number() ||
      !(hyper["dropout"].get<double>() >= 0.0 && hyper["dropout"].get<double>() <= 1.0)) {
    throw FileError(config_path.string() + ": expected \"dropout\" in [0, 1], got " +
                    (hyper.contains("dropout") ? hyper["dropout"].dump() : std::string("none")));
  }
  config.dropout = hyper["dropout"].get<float>();
  // Optional: directories written before the field existed used the book's model.
  if (hyper.contains("attend_to_eos")) {
    if (!hyper["attend_to_eos"].is_boolean()) {
      throw FileError(config_path.string() + ": expected \"attend_to_eos\" true or false, got " +
                      hyper["attend_to_eos"].dump());
    }
    config.attend_to_eos = hyper["attend_to_eos"].get<bool>();
  }
  if (!hyper.contains("tokenizer") || !hyper["tokenizer"].is_string()) {
    throw FileError(
        config_path.string() + ": expected a string field \"tokenizer\", got " +
        (hyper.contains("tokenizer") ? hyper["tokenizer"].dump() : std::string("none")));
  }
  TokenizerKind tokenizer = TokenizerKind::kBook;
  try {
    tokenizer = tokenizer_from_name(hyper["tokenizer"].get<std::string>());
  } catch (const ValueError& error) {
    throw FileError(config_path.string() + ": " + error.what());
  }

  const std::filesystem::path vocab_path = directory / "vocab.json";
  const nlohmann::json vocab = read_json(vocab_path);
  if (!vocab.is_object()) throw FileError(vocab_path.string() + ": expected a JSON object");
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
      throw FileError(vocab_path.string() + ": \"" + key + "\": " + error.what());
    }
  };
  Vocabulary source = make_vocabulary("source", config.source_vocab_size);
  Vocabulary target = make_vocabulary("target", config.target_vocab_size);

  // The sizes are each bounded; their products must be too, before anything is allocated.
  const int64_t hidden = config.num_hiddens, embed = config.embed_size;
  const int64_t parameter_count =
      (config.source_vocab_size + config.target_vocab_size) * (embed + hidden + 1) +
      config.num_layers * 2 * 3 * hidden * (embed + 3 * hidden + 2) + 3 * hidden * hidden;
  if (parameter_count > kMaximumParameters) {
    throw FileError(config_path.string() + ": expected a model of at most " +
                    std::to_string(kMaximumParameters) + " parameters, got sizes that make about " +
                    std::to_string(parameter_count));
  }
  Seq2Seq model(config, 0);
  const std::filesystem::path weights_path = directory / "model.safetensors";
  if (!std::filesystem::is_regular_file(weights_path))
    throw FileError(weights_path.string() + ": no such file (the model's weights)");
  const StateDict state = load_safetensors(weights_path);
  try {
    model.load_state_dict(state);
  } catch (const ShapeError& error) {
    throw ShapeError(weights_path.string() + ": " + error.what());
  }
  return Translator(std::move(model), std::move(source), std::move(target), tokenizer, num_steps);
}

}  // namespace attn
