// Translator: a trained Seq2Seq with its vocabularies, tokenizer and step limit — greedy decoding
// (with the attention weights of every step) and saving to / loading from a model directory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "attn/core/tensor.hpp"
#include "attn/seq2seq/model.hpp"
#include "attn/seq2seq/vocabulary.hpp"

namespace attn {

struct Translation {
  std::vector<std::string> source_tokens;  // what the encoder read: tokens (<unk> for unknown
                                           // ones), then <eos>, cut at num_steps
  // The source's tokens before the cut, <eos> not counted: more than num_steps - 1 means the
  // encoder did not read the whole sentence, which the caller may want to say.
  int64_t source_length = 0;
  std::vector<std::string> tokens;  // the prediction, without <eos>
  std::string text;                 // the prediction detokenised
  // (decoding steps, source_tokens.size()): one row per predicted token, plus the step that
  // predicted <eos> when it came before the step limit.
  Tensor attention;
};

class Translator {
 public:
  // ValueError when the vocabularies' sizes differ from the model's or num_steps < 1.
  Translator(Seq2Seq model, Vocabulary source_vocabulary, Vocabulary target_vocabulary,
             TokenizerKind tokenizer, int64_t num_steps);

  // Greedy decoding as the book's predict_seq2seq, batch by batch: the source gets <eos> and is
  // cut or padded to num_steps; the decoder starts from <bos> and feeds back its most likely
  // token until <eos> or num_steps tokens. Puts the model in evaluation mode.
  std::vector<Translation> translate(const std::vector<std::vector<std::string>>& sources,
                                     int64_t batch_size = 256);
  // Tokenises `text` first; ValueError for a text without any token.
  Translation translate(std::string_view text);

  // Writes model.safetensors (the state dict), vocab.json ({"source": [...], "target": [...]})
  // and config.json (hyper-parameters, tokenizer, num_steps, and `training_record` under
  // "training": epochs, seconds, scores, ...) into `directory`, creating it; each file through a
  // temporary file renamed over the old one. FileError when that fails.
  // A record's value: a count or seed as the integer it is (a seed past 2^53 lost digits as a
  // double), a measure as a double.
  using RecordValue = std::variant<double, int64_t, uint64_t>;
  void save(const std::filesystem::path& directory,
            const std::map<std::string, RecordValue>& training_record = {}) const;
  // FileError naming the directory or file when it is missing, unreadable or not a regular file
  // (refused before reading, so a FIFO cannot block), or a field that is absent, of the wrong type
  // or out of range; ShapeError (from the strict state-dict loading) when the tensors do not fit
  // the configuration. The JSON is read within limits (config.json at most 1 MiB, vocab.json
  // 64 MiB, both nested at most 16 levels), and the weights must hold exactly the parameters the
  // configuration's sizes make before any is allocated.
  static Translator load(const std::filesystem::path& directory);
  // What load does with the three files' contents, named as files of `directory` in messages
  // (load reads them; fuzzing calls this directly).
  static Translator parse(std::string_view config_json, std::string_view vocab_json,
                          std::span<const std::byte> model_safetensors,
                          const std::filesystem::path& directory);

  Seq2Seq& model() { return model_; }
  const Vocabulary& source_vocabulary() const { return source_vocabulary_; }
  const Vocabulary& target_vocabulary() const { return target_vocabulary_; }
  TokenizerKind tokenizer() const { return tokenizer_; }
  int64_t num_steps() const { return num_steps_; }

 private:
  // parse, with the second and third files read only when the first passed.
  static Translator build(std::string_view config_json,
                          const std::function<std::string()>& read_vocab,
                          const std::function<std::vector<std::byte>()>& read_weights,
                          const std::filesystem::path& directory);

  Seq2Seq model_;
  Vocabulary source_vocabulary_;
  Vocabulary target_vocabulary_;
  TokenizerKind tokenizer_;
  int64_t num_steps_;
};

}  // namespace attn
