// BLEU as the book defines it (matching n-grams up to length k, each precision weighted by
// 1/2ⁿ, times a brevity penalty), and the scores of a set of translations against references.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace attn {

// exp(min(0, 1 − len(label)/len(prediction))) · Π_{n=1}^{min(k, len(prediction))} p_n^(1/2ⁿ),
// where p_n is the share of the prediction's n-grams found in the label (each label n-gram matched
// at most once). 0 for an empty prediction. ValueError for k < 1.
double bleu(std::span<const std::string> prediction, std::span<const std::string> label, int k = 4);

struct TranslationScores {
  double bleu = 0.0;         // the mean BLEU (k = 4) over the pairs
  double exact_match = 0.0;  // the share of predictions equal to their reference
  int64_t count = 0;
};

// ValueError unless both lists have the same size.
TranslationScores score_translations(const std::vector<std::vector<std::string>>& predictions,
                                     const std::vector<std::vector<std::string>>& references);

}  // namespace attn
