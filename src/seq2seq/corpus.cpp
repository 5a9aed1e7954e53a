// Parallel corpora: the tab-separated reader with line-numbered errors, tokenisation of pairs, and
// the padded id arrays.
#include "attn/seq2seq/corpus.hpp"

#include <algorithm>
#include <cstdio>

#include "attn/core/error.hpp"
#include "core/file_access.hpp"

namespace attn {

namespace {

std::string quoted_excerpt(std::string_view line) {
  constexpr size_t kMaximum = 60;
  std::string excerpt(line.substr(0, kMaximum));
  for (char& c : excerpt)
    if (c == '\t') c = ' ';
  return "\"" + excerpt + (line.size() > kMaximum ? "...\"" : "\"");
}

}  // namespace

namespace {

// The byte offset of the first byte of `line` that does not begin or continue a UTF-8 sequence
// (RFC 3629: no overlong forms, no surrogates, nothing past U+10FFFF), or npos when it is all
// UTF-8 text.
size_t first_non_utf8(std::string_view line) {
  size_t at = 0;
  while (at < line.size()) {
    const auto lead = static_cast<unsigned char>(line[at]);
    size_t length = 1;
    unsigned char low = 0x80, high = 0xBF;  // the range of the second byte
    if (lead < 0x80) {
      ++at;
      continue;
    } else if (lead >= 0xC2 && lead <= 0xDF) {
      length = 2;
    } else if (lead >= 0xE0 && lead <= 0xEF) {
      length = 3;
      if (lead == 0xE0) low = 0xA0;
      if (lead == 0xED) high = 0x9F;
    } else if (lead >= 0xF0 && lead <= 0xF4) {
      length = 4;
      if (lead == 0xF0) low = 0x90;
      if (lead == 0xF4) high = 0x8F;
    } else {
      return at;
    }
    if (at + length > line.size()) return at;
    for (size_t k = 1; k < length; ++k) {
      const auto byte = static_cast<unsigned char>(line[at + k]);
      if (byte < (k == 1 ? low : 0x80) || byte > (k == 1 ? high : 0xBF)) return at;
    }
    at += length;
  }
  return std::string_view::npos;
}

}  // namespace

std::vector<TextPair> parse_tsv_pairs(std::string_view text, std::string_view source_name) {
  // Windows editors start UTF-8 files with a byte order mark, which is no text: kept, it became
  // part of the first source token ("\xef\xbb\xbfgo"), a word of the vocabulary of its own.
  constexpr std::string_view kByteOrderMark = "\xEF\xBB\xBF";
  if (text.starts_with(kByteOrderMark)) text.remove_prefix(kByteOrderMark.size());
  std::vector<TextPair> pairs;
  size_t line_number = 0;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(start, end - start);
    start = end + 1;
    ++line_number;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.find_first_not_of(" \t") == std::string_view::npos) continue;
    const std::string where = std::string(source_name) + ":" + std::to_string(line_number) + ": ";
    // The tokens become vocab.json's strings, which JSON holds as UTF-8: a Latin-1 corpus trained
    // to its end and then failed to write its vocabulary.
    if (const size_t bad = first_non_utf8(line); bad != std::string_view::npos) {
      char byte[8];
      std::snprintf(byte, sizeof byte, "0x%02X", static_cast<unsigned char>(line[bad]));
      throw FileError(where + "expected UTF-8 text, got the byte " + byte + " at byte " +
                      std::to_string(bad + 1) +
                      " of the line (convert the file, e.g. iconv -f "
                      "latin1 -t utf-8)");
    }
    // A third column is the attribution that Tatoeba's downloads (manythings.org's fra-eng.zip)
    // carry on every line, "CC-BY 2.0 (France) Attribution: tatoeba.org #…": not part of a pair.
    const size_t tabs = static_cast<size_t>(std::count(line.begin(), line.end(), '\t'));
    if (tabs != 1 && tabs != 2) {
      throw FileError(where +
                      "expected \"source<TAB>target\", or a third column of attribution after "
                      "another tab (one or two tabs), got " +
                      std::to_string(tabs) + " tabs in " + quoted_excerpt(line));
    }
    const size_t tab = line.find('\t');
    const size_t target_end = tabs == 2 ? line.find('\t', tab + 1) : line.size();
    TextPair pair{std::string(line.substr(0, tab)),
                  std::string(line.substr(tab + 1, target_end - tab - 1))};
    if (pair.source.find_first_not_of(' ') == std::string::npos ||
        pair.target.find_first_not_of(' ') == std::string::npos) {
      throw FileError(where + "expected a non-empty source and target, got " +
                      quoted_excerpt(line));
    }
    pairs.push_back(std::move(pair));
  }
  if (pairs.empty()) {
    throw FileError(std::string(source_name) +
                    ": expected at least one \"source<TAB>target\" line, got none");
  }
  return pairs;
}

std::vector<TextPair> read_tsv_pairs(const std::filesystem::path& path) {
  // A regular file only: a FIFO or a device is refused before anything waits on it.
  const std::vector<std::byte> bytes = file_access::read_regular_file(path);
  return parse_tsv_pairs(
      std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()), path.string());
}

ParallelCorpus tokenize_pairs(const std::vector<TextPair>& pairs, TokenizerKind tokenizer) {
  ParallelCorpus corpus;
  corpus.tokenizer = tokenizer;
  corpus.source.reserve(pairs.size());
  corpus.target.reserve(pairs.size());
  for (const TextPair& pair : pairs) {
    corpus.source.push_back(tokenize(pair.source, tokenizer));
    corpus.target.push_back(tokenize(pair.target, tokenizer));
  }
  return corpus;
}

EncodedSequences encode_sequences(const std::vector<std::vector<std::string>>& sentences,
                                  const Vocabulary& vocabulary, int64_t num_steps) {
  if (num_steps < 1)
    throw ValueError("num_steps: expected at least 1, got " + std::to_string(num_steps));
  EncodedSequences encoded;
  encoded.count = static_cast<int64_t>(sentences.size());
  encoded.num_steps = num_steps;
  encoded.ids.assign(static_cast<size_t>(encoded.count * num_steps), Vocabulary::kPad);
  encoded.valid_lens.reserve(sentences.size());
  for (size_t row = 0; row < sentences.size(); ++row) {
    std::vector<int64_t> ids = vocabulary.encode(sentences[row]);
    ids.push_back(Vocabulary::kEos);
    const int64_t length = std::min<int64_t>(static_cast<int64_t>(ids.size()), num_steps);
    std::copy(ids.begin(), ids.begin() + length,
              encoded.ids.begin() + static_cast<int64_t>(row) * num_steps);
    encoded.valid_lens.push_back(length);
  }
  return encoded;
}

}  // namespace attn
