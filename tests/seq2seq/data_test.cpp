// The seq2seq data pipeline: tokenisers and the book's preprocessing, the vocabulary, the date
// generator, the tab-separated reader's errors, padded encoding, and BLEU.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "attn/core/error.hpp"
#include "attn/seq2seq/bleu.hpp"
#include "attn/seq2seq/corpus.hpp"
#include "attn/seq2seq/dates.hpp"
#include "attn/seq2seq/unicode_lowercase.hpp"
#include "attn/seq2seq/vocabulary.hpp"
#include "test_support.hpp"

namespace attn {
namespace {

using Tokens = std::vector<std::string>;

TEST(Tokenizer, BookPreprocessingSpacesPunctuationAndLowerCases) {
  EXPECT_EQ(preprocess_text("Go."), "go .");
  EXPECT_EQ(preprocess_text("Hi !"), "hi !");  // already spaced: unchanged
  EXPECT_EQ(tokenize("I'm OK, thanks.", TokenizerKind::kBook),
            (Tokens{"i'm", "ok", ",", "thanks", "."}));
  // Non-breaking spaces (U+00A0, U+202F) become spaces, as French punctuation uses them.
  EXPECT_EQ(tokenize("Va\xC2\xA0!", TokenizerKind::kBook), (Tokens{"va", "!"}));
  EXPECT_EQ(tokenize("Attends\xE2\x80\xAF?", TokenizerKind::kBook), (Tokens{"attends", "?"}));
  EXPECT_EQ(tokenize("  ", TokenizerKind::kBook), Tokens{});
}

TEST(Tokenizer, LowerCasesAsPythonsStrLower) {
  // The book lower-cases its corpus with str.lower(); attn lower-cased ASCII letters only, so
  // "À" and "Écoute" (sentence starts in fra.txt) stayed apart from "à" and "écoute". The fixture
  // (tools/make_unicode_lowercase.py) holds str.lower()'s results: every code point it changes, and
  // sentences with İ and final sigmas.
  std::ifstream fixture(std::filesystem::path(ATTN_FIXTURES_DIR) / "seq2seq" / "lowercase.txt");
  ASSERT_TRUE(fixture) << "tests/fixtures/seq2seq/lowercase.txt";
  int cases = 0;
  for (std::string line; std::getline(fixture, line); ++cases) {
    const size_t tab = line.find('\t');
    ASSERT_NE(tab, std::string::npos) << line;
    EXPECT_EQ(lowercase_utf8(line.substr(0, tab)), line.substr(tab + 1)) << "case " << cases;
  }
  EXPECT_EQ(cases, 55);
  EXPECT_EQ(tokenize("\xC3\x80 l'aide\xC2\xA0!", TokenizerKind::kBook),
            (Tokens{"\xC3\xA0", "l'aide", "!"}));  // À → à
  // Bytes that are not UTF-8 (a lone continuation byte, a truncated sequence, an overlong '/')
  // are kept as they are; the letters around them are still lower-cased.
  EXPECT_EQ(lowercase_utf8("A\x80"
                           "B\xC3"),
            "a\x80"
            "b\xC3");
  EXPECT_EQ(lowercase_utf8("\xC0\xAFZ"), "\xC0\xAFz");
}

TEST(Tokenizer, DatesSplitLettersDigitsAndSymbols) {
  EXPECT_EQ(tokenize("Tuesday, March 3rd, 1987", TokenizerKind::kDates),
            (Tokens{"tuesday", ",", "march", "3", "rd", ",", "1987"}));
  EXPECT_EQ(tokenize("03/03/87", TokenizerKind::kDates), (Tokens{"03", "/", "03", "/", "87"}));
  const Tokens iso = tokenize("1987-03-03", TokenizerKind::kDates);
  EXPECT_EQ(iso, (Tokens{"1987", "-", "03", "-", "03"}));
  EXPECT_EQ(detokenize(iso, TokenizerKind::kDates), "1987-03-03");
  EXPECT_EQ(detokenize(Tokens{"va", "!"}, TokenizerKind::kBook), "va !");
  EXPECT_EQ(tokenizer_from_name(tokenizer_name(TokenizerKind::kDates)), TokenizerKind::kDates);
  EXPECT_THROW_MESSAGE(tokenizer_from_name("chars"), ValueError, "\"chars\"");
}

TEST(Vocabulary, ReservesSpecialTokensAndOrdersByFrequency) {
  const Vocabulary vocabulary({{"b", "a", "c"}, {"a", "b", "a"}, {"d"}}, 2);
  EXPECT_EQ(vocabulary.tokens(), (Tokens{"<pad>", "<bos>", "<eos>", "<unk>", "a", "b"}));
  EXPECT_EQ(vocabulary.id("<pad>"), Vocabulary::kPad);
  EXPECT_EQ(vocabulary.id("<eos>"), Vocabulary::kEos);
  EXPECT_EQ(vocabulary.id("a"), 4);
  EXPECT_EQ(vocabulary.id("c"), Vocabulary::kUnk);  // seen once, below min_freq
  EXPECT_EQ(vocabulary.encode(Tokens{"b", "zzz"}), (std::vector<int64_t>{5, Vocabulary::kUnk}));
  EXPECT_EQ(vocabulary.decode(std::vector<int64_t>{1, 4, 0, 5, 2, 4}), (Tokens{"a", "b"}));
  EXPECT_THROW_MESSAGE(vocabulary.token(6), ValueError, "[0, 6), got 6");
  // Ties keep byte order, so the same corpus always gives the same ids.
  const Vocabulary tied({{"y", "x"}}, 1);
  EXPECT_EQ(tied.token(4), "x");
}

TEST(Vocabulary, FromTokensChecksTheList) {
  const Vocabulary vocabulary = Vocabulary::from_tokens({"<pad>", "<bos>", "<eos>", "<unk>", "x"});
  EXPECT_EQ(vocabulary.id("x"), 4);
  EXPECT_THROW_MESSAGE(Vocabulary::from_tokens({"<pad>", "<eos>", "<bos>", "<unk>"}), ValueError,
                       "starting with <pad>, <bos>, <eos>, <unk>");
  EXPECT_THROW_MESSAGE(Vocabulary::from_tokens({"<pad>", "<bos>", "<eos>", "<unk>", "x", "x"}),
                       ValueError, "\"x\" twice");
  EXPECT_THROW_MESSAGE(Vocabulary::from_tokens({"<pad>", "<bos>", "<eos>", "<unk>", ""}),
                       ValueError, "empty");
}

TEST(Dates, WritesTrueWeekdaysAndIsoTargets) {
  constexpr int64_t kMarch3rd1987 = 13575;  // days since 1950-01-01
  const TextPair long_form = write_date(kMarch3rd1987, 1);
  EXPECT_EQ(long_form.source, "tuesday, march 3, 1987");
  EXPECT_EQ(long_form.target, "1987-03-03");
  EXPECT_EQ(write_date(kMarch3rd1987, 0).source, "3 march 1987");
  EXPECT_EQ(write_date(kMarch3rd1987, 2).source, "03/03/87");
  EXPECT_EQ(write_date(kMarch3rd1987, 6).source, "3rd of march 1987");
  EXPECT_EQ(write_date(kMarch3rd1987, 7).source, "03.03.1987");
  EXPECT_EQ(write_date(0, 1).source, "sunday, january 1, 1950");
  const TextPair last = write_date(36524, 1);
  EXPECT_EQ(last.source, "friday, december 31, 2049");
  EXPECT_EQ(last.target, "2049-12-31");
  EXPECT_EQ(write_date(36524, 13).source, "friday 31 dec 49");
  EXPECT_THROW_MESSAGE(write_date(36525, 0), ValueError, "[0, 36525)");
  EXPECT_THROW_MESSAGE(write_date(0, kDateFormats), ValueError, "form");
}

TEST(Dates, GeneratorIsDeterministicVariedAndShort) {
  const std::vector<TextPair> pairs = generate_date_pairs(3000, 5);
  const std::vector<TextPair> again = generate_date_pairs(3000, 5);
  ASSERT_EQ(pairs.size(), 3000U);
  std::set<std::string> sources, years;
  size_t longest = 0;
  for (size_t i = 0; i < pairs.size(); ++i) {
    EXPECT_EQ(pairs[i].source, again[i].source);
    sources.insert(pairs[i].source);
    years.insert(pairs[i].target.substr(0, 4));
    longest = std::max(longest, tokenize(pairs[i].source, TokenizerKind::kDates).size());
    EXPECT_EQ(tokenize(pairs[i].target, TokenizerKind::kDates).size(), 5U) << pairs[i].target;
  }
  EXPECT_GT(sources.size(), 2900U);
  EXPECT_EQ(years.size(), 100U);  // 1950–2049
  // The CLI's default num_steps (10) fits every form with its <eos>.
  EXPECT_LE(longest + 1, 10U);
  EXPECT_NE(generate_date_pairs(1, 6).front().source, pairs.front().source);
  EXPECT_THROW_MESSAGE(generate_date_pairs(-1, 0), ValueError, "count");
}

TEST(Corpus, ParsesTabSeparatedPairs) {
  const std::vector<TextPair> pairs =
      parse_tsv_pairs("Go.\tVa !\r\n\nHi.\tSalut !\n", "fra-eng.txt");
  ASSERT_EQ(pairs.size(), 2U);
  EXPECT_EQ(pairs[1].source, "Hi.");
  EXPECT_EQ(pairs[1].target, "Salut !");
  const ParallelCorpus corpus = tokenize_pairs(pairs, TokenizerKind::kBook);
  EXPECT_EQ(corpus.source[0], (Tokens{"go", "."}));
  EXPECT_EQ(corpus.target[1], (Tokens{"salut", "!"}));
}

// A byte order mark before the first line (Windows editors write one) is not part of its source:
// it was, and the first token became "\xef\xbb\xbfgo".
TEST(Corpus, ALeadingByteOrderMarkIsSkipped) {
  const std::string bom = "\xEF\xBB\xBF";
  const std::vector<TextPair> pairs =
      parse_tsv_pairs(bom + "Go.\tVa !\nHi.\tSalut !\n", "fra-eng.txt");
  ASSERT_EQ(pairs.size(), 2U);
  EXPECT_EQ(pairs[0].source, "Go.");
  EXPECT_EQ(tokenize_pairs(pairs, TokenizerKind::kBook).source[0], (Tokens{"go", "."}));
  // Only at the start of the text: elsewhere it is the line's text.
  EXPECT_EQ(parse_tsv_pairs("a\tb\n" + bom + "c\td\n", "c.tsv")[1].source, bom + "c");
}

// Tatoeba's downloads (manythings.org's fra-eng.zip, the book's source) carry a third column of
// attribution on every line; it was refused ("got 2 tabs").
TEST(Corpus, AThirdColumnOfAttributionIsIgnored) {
  const std::vector<TextPair> pairs = parse_tsv_pairs(
      "Go.\tVa !\tCC-BY 2.0 (France) Attribution: tatoeba.org #2877272 (CM) & #1158250 "
      "(Wittydev)\r\nHi.\tSalut !\t\nRun!\tCours !\n",
      "fra.txt");
  ASSERT_EQ(pairs.size(), 3U);
  EXPECT_EQ(pairs[0].source, "Go.");
  EXPECT_EQ(pairs[0].target, "Va !");
  EXPECT_EQ(pairs[1].target, "Salut !");
  EXPECT_EQ(pairs[2].target, "Cours !");
  EXPECT_THROW_MESSAGE(parse_tsv_pairs("a\t\tc\n", "c.tsv"), FileError,
                       "c.tsv:1: expected a non-empty source and target");
}

// Tokens become vocab.json's strings, which JSON holds as UTF-8: a Latin-1 corpus trained to its
// end, then failed with the JSON library's own message after model.safetensors was replaced.
TEST(Corpus, TextThatIsNotUtf8IsNamedByItsLine) {
  EXPECT_THROW_MESSAGE(parse_tsv_pairs("Go.\tVa !\nWait!\tArr\xEAte !\n", "fra.txt"), FileError,
                       "fra.txt:2: expected UTF-8 text, got the byte 0xEA at byte 10 of the line");
  for (const std::string bad : {"\xC0\xAF", "\xED\xA0\x80", "\xF4\x90\x80\x80", "\xE2\x82"}) {
    EXPECT_THROW(parse_tsv_pairs("a" + bad + "\tb\n", "c.tsv"), FileError) << bad.size();
  }
  const std::vector<TextPair> pairs =
      parse_tsv_pairs("caf\xC3\xA9 \xE2\x82\xAC\t\xF0\x9F\x98\x80\n", "c.tsv");
  EXPECT_EQ(pairs[0].target, "\xF0\x9F\x98\x80");
}

TEST(Corpus, MalformedLinesAreClearErrors) {
  EXPECT_THROW_MESSAGE(parse_tsv_pairs("Go.\tVa !\nno tab here\n", "fra-eng.txt"), FileError,
                       "fra-eng.txt:2: expected \"source<TAB>target\", or a third column of "
                       "attribution after another tab (one or two tabs), got 0 tabs in "
                       "\"no tab here\"");
  EXPECT_THROW_MESSAGE(parse_tsv_pairs("a\tb\tc\td\n", "c.tsv"), FileError,
                       "c.tsv:1: expected \"source<TAB>target\", or a third column of attribution "
                       "after another tab (one or two tabs), got 3 tabs");
  EXPECT_THROW_MESSAGE(parse_tsv_pairs("a\tb\n \tb\n", "c.tsv"), FileError,
                       "c.tsv:2: expected a non-empty source and target");
  EXPECT_THROW_MESSAGE(parse_tsv_pairs("\n\n", "empty.tsv"), FileError,
                       "empty.tsv: expected at least one");
  EXPECT_THROW_MESSAGE(read_tsv_pairs("/nonexistent/corpus.tsv"), FileError,
                       "/nonexistent/corpus.tsv: cannot read the file (No such file or directory)");
}

TEST(Corpus, EncodesWithEosTruncatesAndPads) {
  const Vocabulary vocabulary({{"a", "b", "c"}}, 1);
  const EncodedSequences encoded =
      encode_sequences({{"a", "b"}, {"a", "b", "c", "a"}, {}}, vocabulary, 4);
  const int64_t a = vocabulary.id("a"), b = vocabulary.id("b"), c = vocabulary.id("c");
  const int64_t eos = Vocabulary::kEos, pad = Vocabulary::kPad;
  EXPECT_EQ(encoded.ids, (std::vector<int64_t>{a, b, eos, pad, a, b, c, a, eos, pad, pad, pad}));
  EXPECT_EQ(encoded.valid_lens, (std::vector<int64_t>{3, 4, 1}));
  EXPECT_THROW_MESSAGE(encode_sequences({}, vocabulary, 0), ValueError, "num_steps");
}

TEST(Bleu, FollowsTheBookDefinition) {
  const Tokens reference = {"a", "b", "c", "d"};
  EXPECT_DOUBLE_EQ(bleu(reference, reference), 1.0);
  // Short but correct: only the brevity penalty exp(1 − 4/2) remains.
  EXPECT_NEAR(bleu(Tokens{"a", "b"}, reference), std::exp(-1.0), 1e-12);
  // One wrong token: p1 = 3/4, p2 = 2/3, p3 = 1/2, and no matching 4-gram.
  const Tokens wrong_last = {"a", "b", "c", "x"};
  EXPECT_NEAR(bleu(wrong_last, reference, 3),
              std::pow(0.75, 0.5) * std::pow(2.0 / 3.0, 0.25) * std::pow(0.5, 0.125), 1e-12);
  EXPECT_DOUBLE_EQ(bleu(wrong_last, reference), 0.0);
  // A label n-gram is matched at most once.
  EXPECT_NEAR(bleu(Tokens{"a", "a"}, Tokens{"a", "b"}, 1), std::sqrt(0.5), 1e-12);
  EXPECT_DOUBLE_EQ(bleu(Tokens{}, reference), 0.0);
  EXPECT_THROW_MESSAGE(bleu(reference, reference, 0), ValueError, "k");

  const TranslationScores scores =
      score_translations({reference, Tokens{"a", "b"}}, {reference, reference});
  EXPECT_EQ(scores.count, 2);
  EXPECT_DOUBLE_EQ(scores.exact_match, 0.5);
  EXPECT_NEAR(scores.bleu, (1.0 + std::exp(-1.0)) / 2, 1e-12);
  EXPECT_THROW_MESSAGE(score_translations({reference}, {}), ValueError, "references");
}

}  // namespace
}  // namespace attn
