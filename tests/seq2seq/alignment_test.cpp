// What the alignment heatmaps of the date task show, asserted: after a short training run, the
// decoding step that writes the year attends most to the source's year token, the month step to
// the month token, the day step to the day token. Also the attention lengths that exclude <eos>.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "attn/seq2seq/corpus.hpp"
#include "attn/seq2seq/dates.hpp"
#include "attn/seq2seq/model.hpp"
#include "attn/seq2seq/training.hpp"
#include "attn/seq2seq/translator.hpp"
#include "attn/seq2seq/vocabulary.hpp"

namespace attn {
namespace {

TEST(AttentionValidLens, DropTheEosOnlyWhenAsked) {
  const int64_t eos = Vocabulary::kEos, pad = Vocabulary::kPad;
  // Three sequences of 4 steps: ends in <eos>, cut before its <eos> (full length), only <eos>.
  const std::vector<int64_t> source = {7, 8, eos, pad, 7, 8, 9, 10, eos, pad, pad, pad};
  const std::vector<int64_t> lengths = {3, 4, 1};
  EXPECT_EQ(attention_valid_lens(source, lengths, 4, true), lengths);
  EXPECT_EQ(attention_valid_lens(source, lengths, 4, false), (std::vector<int64_t>{2, 4, 0}));
}

// Where in `source_tokens` each field of the ISO date may be read; a field whose candidates also
// serve another field (as "03" in "03/03/87") is left out, since its alignment is ambiguous.
struct FieldPositions {
  std::set<size_t> year, month, day;
};

FieldPositions field_positions(const std::vector<std::string>& source_tokens,
                               const std::string& iso) {
  const std::string yyyy = iso.substr(0, 4), yy = iso.substr(2, 2), mm = iso.substr(5, 2),
                    dd = iso.substr(8, 2);
  const std::string d = dd[0] == '0' ? dd.substr(1) : dd;
  static const std::vector<std::string> kNames = {"january",   "february", "march",    "april",
                                                  "may",       "june",     "july",     "august",
                                                  "september", "october",  "november", "december"};
  const std::string name = kNames[static_cast<size_t>(std::stoi(mm) - 1)];
  const std::string abbreviation = name.substr(0, 3);
  FieldPositions positions;
  for (size_t j = 0; j < source_tokens.size(); ++j) {
    const std::string& token = source_tokens[j];
    if (token == yyyy || token == yy) positions.year.insert(j);
    if (token == mm || token == name || token == abbreviation) positions.month.insert(j);
    if (token == dd || token == d) positions.day.insert(j);
  }
  return positions;
}

bool overlaps(const std::set<size_t>& a, const std::set<size_t>& b) {
  return std::any_of(a.begin(), a.end(), [&](size_t j) { return b.contains(j); });
}

// 375 steps of 32 dates with the CLI's model (≈ 7 s in a Release build) translate 265 of 300
// held-out dates exactly, with 94% of their unambiguous fields (96% of the years) attended most at
// their own token, as the full run's heatmaps show. The same run with attend_to_eos (the book's
// model) aligns 0 of 256 years (it reads them at the next token) and 58% of all fields, so the
// stated 85% bounds fail for that defect while leaving margin for different rounding.
TEST(DateTaskAlignment, EachIsoFieldAttendsToItsSourceToken) {
  const ParallelCorpus corpus =
      tokenize_pairs(generate_date_pairs(12000, 11), TokenizerKind::kDates);
  const Vocabulary source_vocabulary(corpus.source, 1), target_vocabulary(corpus.target, 1);
  const EncodedSequences source = encode_sequences(corpus.source, source_vocabulary, 10);
  const EncodedSequences target = encode_sequences(corpus.target, target_vocabulary, 10);
  Seq2SeqConfig config{source_vocabulary.size(), target_vocabulary.size(), 32, 64, 1, 0.0F};
  config.attend_to_eos = false;
  Seq2Seq model(config, 0);
  Seq2SeqTrainingOptions options;
  options.epochs = 1;
  options.batch_size = 32;
  options.seed = 0;
  train_seq2seq(model, source, target, options);

  Translator translator(std::move(model), source_vocabulary, target_vocabulary,
                        TokenizerKind::kDates, 10);
  const std::vector<TextPair> held_out = generate_date_pairs(300, 12);
  std::vector<std::vector<std::string>> sources;
  for (const TextPair& pair : held_out)
    sources.push_back(tokenize(pair.source, TokenizerKind::kDates));
  const std::vector<Translation> translations = translator.translate(sources);

  int exact = 0;
  int fields = 0, aligned = 0;
  int year_fields = 0, year_aligned = 0;
  for (size_t i = 0; i < held_out.size(); ++i) {
    const Translation& translation = translations[i];
    if (translation.text != held_out[i].target) continue;
    ++exact;
    const FieldPositions positions = field_positions(translation.source_tokens, held_out[i].target);
    // Rows 0, 2 and 4 are the steps that wrote the year, the month and the day.
    const std::vector<std::pair<size_t, const std::set<size_t>*>> rows = {
        {0, &positions.year}, {2, &positions.month}, {4, &positions.day}};
    for (const auto& [row, expected] : rows) {
      const bool ambiguous =
          expected->empty() ||
          (expected != &positions.year && overlaps(*expected, positions.year)) ||
          (expected != &positions.month && overlaps(*expected, positions.month)) ||
          (expected != &positions.day && overlaps(*expected, positions.day));
      if (ambiguous) continue;
      size_t strongest = 0;
      for (size_t j = 1; j < translation.source_tokens.size(); ++j) {
        if (translation.attention(static_cast<int64_t>(row), static_cast<int64_t>(j)) >
            translation.attention(static_cast<int64_t>(row), static_cast<int64_t>(strongest)))
          strongest = j;
      }
      const bool hit = expected->contains(strongest);
      ++fields;
      aligned += hit ? 1 : 0;
      if (expected == &positions.year) {
        ++year_fields;
        year_aligned += hit ? 1 : 0;
      }
    }
  }
  EXPECT_GE(exact, 240) << "of 300 held-out dates translated exactly";
  ASSERT_GT(fields, 500);
  ASSERT_GT(year_fields, 150);
  EXPECT_GE(aligned, 0.85 * fields) << aligned << " of " << fields << " fields aligned";
  EXPECT_GE(year_aligned, 0.85 * year_fields)
      << year_aligned << " of " << year_fields << " years aligned";
}

}  // namespace
}  // namespace attn
