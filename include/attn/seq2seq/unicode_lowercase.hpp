// Lower-casing UTF-8 text as Python's str.lower() does, for the book's corpus preprocessing.
#pragma once

#include <string>
#include <string_view>

namespace attn {

// text lower-cased by the Unicode mappings Python's str.lower() applies (its table is
// src/seq2seq/unicode_lowercase_table.inc, made by tools/make_unicode_lowercase.py): every
// one-to-one mapping, U+0130 → "i" + U+0307, and Σ → ς at a word's end (after a cased letter, not
// before one; the letters' case told by the same table, a few case-ignorable marks skipped
// between). Bytes that are not UTF-8 are kept as they are.
std::string lowercase_utf8(std::string_view text);

}  // namespace attn
