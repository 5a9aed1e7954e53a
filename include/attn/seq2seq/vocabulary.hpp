// Text to token ids and back: the book's preprocessing and tokenisation (plus a finer one for the
// bundled date task), and Vocabulary, the token ↔ id table with <pad>, <bos>, <eos> and <unk>.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace attn {

enum class TokenizerKind {
  // The book's preprocessing for its English–French file: non-breaking spaces become spaces, the
  // text is lower-cased as Python's str.lower() does (attn/seq2seq/unicode_lowercase.hpp), a space
  // is put before , . ! ? that follow a non-space, then the text is split at spaces.
  kBook,
  // For the date task: lower-cased, then runs of letters, runs of digits and every other visible
  // character alone ("03/03/87" → 03 / 03 / 87, "1987-03-03" → 1987 - 03 - 03).
  kDates,
};

// "book" or "dates", and back; ValueError naming the unknown name.
std::string tokenizer_name(TokenizerKind kind);
TokenizerKind tokenizer_from_name(std::string_view name);

// The book's _preprocess: see TokenizerKind::kBook.
std::string preprocess_text(std::string_view text);
std::vector<std::string> tokenize(std::string_view text, TokenizerKind kind);
// Tokens back to text: joined by spaces (kBook) or concatenated (kDates, where the tokenizer
// splits only at character-class changes).
std::string detokenize(std::span<const std::string> tokens, TokenizerKind kind);

class Vocabulary {
 public:
  static constexpr int64_t kPad = 0;
  static constexpr int64_t kBos = 1;
  static constexpr int64_t kEos = 2;
  static constexpr int64_t kUnk = 3;

  // The four reserved tokens, then every token seen at least `min_freq` times, most frequent
  // first (ties in byte order), so a corpus always gives the same ids.
  Vocabulary(const std::vector<std::vector<std::string>>& sentences, int64_t min_freq);
  // From a saved token list: ValueError unless it starts with <pad>, <bos>, <eos>, <unk> and holds
  // no duplicate or empty token.
  static Vocabulary from_tokens(std::vector<std::string> tokens);

  int64_t size() const { return static_cast<int64_t>(tokens_.size()); }
  // The id of `token`, kUnk when it is not in the vocabulary.
  int64_t id(const std::string& token) const;
  // ValueError for an id outside [0, size()).
  const std::string& token(int64_t id) const;
  std::vector<int64_t> encode(std::span<const std::string> tokens) const;
  // The tokens of `ids` up to (without) the first <eos>, skipping <pad> and <bos>.
  std::vector<std::string> decode(std::span<const int64_t> ids) const;
  const std::vector<std::string>& tokens() const { return tokens_; }

 private:
  Vocabulary() = default;
  void index();

  std::vector<std::string> tokens_;
  std::map<std::string, int64_t, std::less<>> ids_;
};

}  // namespace attn
