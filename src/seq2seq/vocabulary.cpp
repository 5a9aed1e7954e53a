// Preprocessing, the two tokenisers and the vocabulary's construction, lookup and validation.
#include "attn/seq2seq/vocabulary.hpp"

#include <algorithm>
#include <cctype>
#include <unordered_map>

#include "attn/core/error.hpp"
#include "attn/seq2seq/unicode_lowercase.hpp"

namespace attn {

namespace {

const std::vector<std::string> kReserved = {"<pad>", "<bos>", "<eos>", "<unk>"};

enum class CharClass { kSpace, kLetter, kDigit, kOther };

CharClass classify(char c) {
  const auto byte = static_cast<unsigned char>(c);
  if (std::isspace(byte)) return CharClass::kSpace;
  if (std::isdigit(byte)) return CharClass::kDigit;
  // Bytes of multi-byte UTF-8 characters count as letters, so accented words stay whole.
  if (std::isalpha(byte) || byte >= 0x80) return CharClass::kLetter;
  return CharClass::kOther;
}

}  // namespace

std::string tokenizer_name(TokenizerKind kind) {
  return kind == TokenizerKind::kBook ? "book" : "dates";
}

TokenizerKind tokenizer_from_name(std::string_view name) {
  if (name == "book") return TokenizerKind::kBook;
  if (name == "dates") return TokenizerKind::kDates;
  throw ValueError("tokenizer: expected \"book\" or \"dates\", got \"" + std::string(name) + "\"");
}

std::string preprocess_text(std::string_view text) {
  // U+202F (E2 80 AF) and U+00A0 (C2 A0) in UTF-8, as the book replaces them.
  std::string spaced;
  spaced.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    if (text.substr(i, 3) == "\xE2\x80\xAF") {
      spaced += ' ';
      i += 2;
    } else if (text.substr(i, 2) == "\xC2\xA0") {
      spaced += ' ';
      i += 1;
    } else {
      spaced += text[i];
    }
  }
  // Lower-cased after the spaces are replaced, as the book's text.replace(...).lower().
  spaced = lowercase_utf8(spaced);
  std::string out;
  out.reserve(spaced.size() + spaced.size() / 4);
  for (size_t i = 0; i < spaced.size(); ++i) {
    const char c = spaced[i];
    const bool punctuation = c == ',' || c == '.' || c == '!' || c == '?';
    if (i > 0 && punctuation && spaced[i - 1] != ' ') out += ' ';
    out += c;
  }
  return out;
}

std::vector<std::string> tokenize(std::string_view text, TokenizerKind kind) {
  std::vector<std::string> tokens;
  if (kind == TokenizerKind::kBook) {
    const std::string processed = preprocess_text(text);
    std::string current;
    for (const char c : processed) {
      if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
        if (!current.empty()) tokens.push_back(std::move(current));
        current.clear();
      } else {
        current += c;
      }
    }
    if (!current.empty()) tokens.push_back(std::move(current));
    return tokens;
  }
  std::string current;
  CharClass current_class = CharClass::kSpace;
  for (const char c : lowercase_utf8(text)) {
    const CharClass kind_of_c = classify(c);
    const bool continues =
        !current.empty() && kind_of_c == current_class && kind_of_c != CharClass::kOther;
    if (!continues && !current.empty()) {
      tokens.push_back(std::move(current));
      current.clear();
    }
    if (kind_of_c != CharClass::kSpace) current += c;
    current_class = kind_of_c;
  }
  if (!current.empty()) tokens.push_back(std::move(current));
  return tokens;
}

std::string detokenize(std::span<const std::string> tokens, TokenizerKind kind) {
  std::string text;
  for (const std::string& token : tokens) {
    if (kind == TokenizerKind::kBook && !text.empty()) text += ' ';
    text += token;
  }
  return text;
}

Vocabulary::Vocabulary(const std::vector<std::vector<std::string>>& sentences, int64_t min_freq) {
  std::unordered_map<std::string, int64_t> counts;
  for (const auto& sentence : sentences)
    for (const std::string& token : sentence) ++counts[token];
  std::vector<std::pair<std::string, int64_t>> frequent;
  for (const auto& [token, count] : counts) {
    const bool reserved = std::find(kReserved.begin(), kReserved.end(), token) != kReserved.end();
    if (count >= min_freq && !reserved) frequent.emplace_back(token, count);
  }
  std::sort(frequent.begin(), frequent.end(), [](const auto& a, const auto& b) {
    return a.second != b.second ? a.second > b.second : a.first < b.first;
  });
  tokens_ = kReserved;
  for (auto& entry : frequent) tokens_.push_back(std::move(entry.first));
  index();
}

Vocabulary Vocabulary::from_tokens(std::vector<std::string> tokens) {
  if (tokens.size() < kReserved.size() ||
      !std::equal(kReserved.begin(), kReserved.end(), tokens.begin())) {
    throw ValueError(
        "vocabulary: expected a token list starting with <pad>, <bos>, <eos>, <unk>, got " +
        std::to_string(tokens.size()) + " tokens starting otherwise");
  }
  Vocabulary vocabulary;
  vocabulary.tokens_ = std::move(tokens);
  vocabulary.index();
  return vocabulary;
}

void Vocabulary::index() {
  ids_.clear();
  for (size_t i = 0; i < tokens_.size(); ++i) {
    if (tokens_[i].empty())
      throw ValueError("vocabulary: expected non-empty tokens, got an empty one at id " +
                       std::to_string(i));
    if (!ids_.emplace(tokens_[i], static_cast<int64_t>(i)).second)
      throw ValueError("vocabulary: expected distinct tokens, got \"" + tokens_[i] +
                       "\" twice (again at id " + std::to_string(i) + ")");
  }
}

int64_t Vocabulary::id(const std::string& token) const {
  const auto found = ids_.find(token);
  return found == ids_.end() ? kUnk : found->second;
}

const std::string& Vocabulary::token(int64_t id) const {
  if (id < 0 || id >= size()) {
    throw ValueError("vocabulary: expected a token id in [0, " + std::to_string(size()) +
                     "), got " + std::to_string(id));
  }
  return tokens_[static_cast<size_t>(id)];
}

std::vector<int64_t> Vocabulary::encode(std::span<const std::string> tokens) const {
  std::vector<int64_t> ids;
  ids.reserve(tokens.size());
  for (const std::string& token : tokens) ids.push_back(id(token));
  return ids;
}

std::vector<std::string> Vocabulary::decode(std::span<const int64_t> ids) const {
  std::vector<std::string> tokens;
  for (const int64_t value : ids) {
    if (value == kEos) break;
    if (value == kPad || value == kBos) continue;
    tokens.push_back(token(value));
  }
  return tokens;
}

}  // namespace attn
