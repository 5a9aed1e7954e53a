// Parallel corpora: sentence pairs from a tab-separated file (the book's English–French format)
// or from the date generator, tokenised, and encoded as padded id arrays with valid lengths.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "attn/seq2seq/vocabulary.hpp"

namespace attn {

struct TextPair {
  std::string source;
  std::string target;
};

struct ParallelCorpus {
  std::vector<std::vector<std::string>> source;  // tokens of each sentence, without <eos>
  std::vector<std::vector<std::string>> target;
  TokenizerKind tokenizer = TokenizerKind::kBook;
};

// One "source<TAB>target" pair a line, a third column after another tab ignored (the attribution
// of Tatoeba's downloads); blank lines (and a trailing '\r') are ignored. FileError naming
// `source_name` and the line number for a line with no tab or more than two, or with a side that
// has no token, and for a text without any pair.
std::vector<TextPair> parse_tsv_pairs(std::string_view text, std::string_view source_name);
// The same for a file; FileError naming it when it cannot be read.
std::vector<TextPair> read_tsv_pairs(const std::filesystem::path& path);

ParallelCorpus tokenize_pairs(const std::vector<TextPair>& pairs, TokenizerKind tokenizer);

// Sentences as the book's build_array makes them: the ids of the tokens, then <eos>, truncated or
// padded with <pad> to num_steps; the valid length counts the tokens that are not padding.
struct EncodedSequences {
  int64_t count = 0;
  int64_t num_steps = 0;
  std::vector<int64_t> ids;         // (count, num_steps), row-major
  std::vector<int64_t> valid_lens;  // (count)
};

// ValueError for num_steps < 1.
EncodedSequences encode_sequences(const std::vector<std::vector<std::string>>& sentences,
                                  const Vocabulary& vocabulary, int64_t num_steps);

}  // namespace attn
