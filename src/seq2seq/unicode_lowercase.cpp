// lowercase_utf8: UTF-8 decoding and encoding around the generated table of str.lower()'s
// one-to-one mappings, and its two other rules (U+0130, the final sigma).
#include "attn/seq2seq/unicode_lowercase.hpp"

#include <algorithm>
#include <array>
#include <cstdint>
#include <vector>

namespace attn {

namespace {

struct LowercaseRun {
  char32_t first;
  char32_t last;
  char32_t step;
  int32_t delta;
};

constexpr LowercaseRun kRuns[] = {
#include "unicode_lowercase_table.inc"
};

// The run holding `code`, or nullptr (runs are disjoint and ordered by their first code point).
const LowercaseRun* run_of(char32_t code) {
  const auto* after =
      std::upper_bound(std::begin(kRuns), std::end(kRuns), code,
                       [](char32_t c, const LowercaseRun& run) { return c < run.first; });
  if (after == std::begin(kRuns)) return nullptr;
  const LowercaseRun* run = after - 1;
  return code <= run->last && (code - run->first) % run->step == 0 ? run : nullptr;
}

char32_t lower_code(char32_t code) {
  const LowercaseRun* run = run_of(code);
  return run == nullptr ? code : static_cast<char32_t>(static_cast<int32_t>(code) + run->delta);
}

// A letter with case: one that lower-cases to another, or the lower case of one.
bool is_cased(char32_t code) {
  if (run_of(code) != nullptr) return true;
  return std::any_of(std::begin(kRuns), std::end(kRuns), [code](const LowercaseRun& run) {
    const auto upper = static_cast<char32_t>(static_cast<int32_t>(code) - run.delta);
    return upper >= run.first && upper <= run.last && (upper - run.first) % run.step == 0;
  });
}

// The case-ignorable characters likeliest between a word's letters (Unicode's Case_Ignorable has
// more: the apostrophes, the full stop and colon, the middle dot, the soft hyphen, combining
// diacritics, modifier letters).
bool is_case_ignorable(char32_t code) {
  return code == U'\'' || code == U'.' || code == U':' || code == 0x00AD || code == 0x00B7 ||
         code == 0x2019 || (code >= 0x02B0 && code <= 0x036F);
}

constexpr char32_t kNotUtf8 = 0xFFFFFFFF;  // a byte that starts no UTF-8 character

// The character at text[at] and its length in bytes; kNotUtf8 and 1 for an invalid sequence
// (overlong forms, surrogates and code points past U+10FFFF included).
std::pair<char32_t, size_t> decode(std::string_view text, size_t at) {
  const auto byte = [&](size_t i) { return static_cast<unsigned char>(text[at + i]); };
  const unsigned char lead = byte(0);
  if (lead < 0x80) return {lead, 1};
  size_t length = 0;
  char32_t code = 0;
  char32_t smallest = 0;
  if ((lead & 0xE0) == 0xC0) {
    length = 2, code = lead & 0x1F, smallest = 0x80;
  } else if ((lead & 0xF0) == 0xE0) {
    length = 3, code = lead & 0x0F, smallest = 0x800;
  } else if ((lead & 0xF8) == 0xF0) {
    length = 4, code = lead & 0x07, smallest = 0x10000;
  } else {
    return {kNotUtf8, 1};
  }
  if (at + length > text.size()) return {kNotUtf8, 1};
  for (size_t i = 1; i < length; ++i) {
    if ((byte(i) & 0xC0) != 0x80) return {kNotUtf8, 1};
    code = (code << 6) | (byte(i) & 0x3F);
  }
  if (code < smallest || code > 0x10FFFF || (code >= 0xD800 && code <= 0xDFFF))
    return {kNotUtf8, 1};
  return {code, length};
}

void encode(char32_t code, std::string& out) {
  if (code < 0x80) {
    out += static_cast<char>(code);
  } else if (code < 0x800) {
    out += static_cast<char>(0xC0 | (code >> 6));
    out += static_cast<char>(0x80 | (code & 0x3F));
  } else if (code < 0x10000) {
    out += static_cast<char>(0xE0 | (code >> 12));
    out += static_cast<char>(0x80 | ((code >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (code & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (code >> 18));
    out += static_cast<char>(0x80 | ((code >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((code >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (code & 0x3F));
  }
}

}  // namespace

std::string lowercase_utf8(std::string_view text) {
  // Decoded first, so that a capital sigma can look at the letters on both sides of it.
  struct Unit {
    char32_t code;  // kNotUtf8 for a byte kept as it is
    size_t at;
  };
  std::vector<Unit> units;
  units.reserve(text.size());
  for (size_t at = 0; at < text.size();) {
    const auto [code, length] = decode(text, at);
    units.push_back({code, at});
    at += length;
  }
  // Whether a cased letter comes next from unit i on in direction `step`, past case-ignorables.
  const auto cased_beside = [&](size_t i, std::ptrdiff_t step) {
    for (auto j = static_cast<std::ptrdiff_t>(i) + step;
         j >= 0 && j < static_cast<std::ptrdiff_t>(units.size()); j += step) {
      const char32_t code = units[static_cast<size_t>(j)].code;
      if (code == kNotUtf8 || !is_case_ignorable(code)) return code != kNotUtf8 && is_cased(code);
    }
    return false;
  };
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < units.size(); ++i) {
    const char32_t code = units[i].code;
    if (code == kNotUtf8) {
      out += text[units[i].at];
    } else if (code == 0x0130) {  // İ: "i" and a combining dot above, as str.lower() writes it
      encode(U'i', out);
      encode(0x0307, out);
    } else if (code == 0x03A3 && cased_beside(i, -1) && !cased_beside(i, +1)) {
      encode(0x03C2, out);  // ς: the final sigma
    } else {
      encode(lower_code(code), out);
    }
  }
  return out;
}

}  // namespace attn
