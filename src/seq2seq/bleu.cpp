// BLEU with the book's n-gram matching and brevity penalty, and corpus-level averages.
#include "attn/seq2seq/bleu.hpp"

#include <algorithm>
#include <cmath>
#include <map>

#include "attn/core/error.hpp"

namespace attn {

double bleu(std::span<const std::string> prediction, std::span<const std::string> label, int k) {
  if (k < 1)
    throw ValueError("k: expected a maximum n-gram length of at least 1, got " + std::to_string(k));
  const auto predicted = static_cast<int64_t>(prediction.size());
  const auto reference = static_cast<int64_t>(label.size());
  if (predicted == 0) return 0.0;
  double score = std::exp(
      std::min(0.0, 1.0 - static_cast<double>(reference) / static_cast<double>(predicted)));
  using NGram = std::span<const std::string>;
  const auto less = [](const NGram& a, const NGram& b) {
    return std::lexicographical_compare(a.begin(), a.end(), b.begin(), b.end());
  };
  for (int64_t n = 1; n <= std::min<int64_t>(k, predicted); ++n) {
    std::map<NGram, int64_t, decltype(less)> label_counts(less);
    for (int64_t i = 0; i + n <= reference; ++i)
      ++label_counts[label.subspan(static_cast<size_t>(i), static_cast<size_t>(n))];
    int64_t matches = 0;
    for (int64_t i = 0; i + n <= predicted; ++i) {
      const auto found =
          label_counts.find(prediction.subspan(static_cast<size_t>(i), static_cast<size_t>(n)));
      if (found != label_counts.end() && found->second > 0) {
        ++matches;
        --found->second;
      }
    }
    const double precision = static_cast<double>(matches) / static_cast<double>(predicted - n + 1);
    score *= std::pow(precision, std::pow(0.5, static_cast<double>(n)));
  }
  return score;
}

TranslationScores score_translations(const std::vector<std::vector<std::string>>& predictions,
                                     const std::vector<std::vector<std::string>>& references) {
  if (predictions.size() != references.size()) {
    throw ValueError("references: expected one per prediction (" +
                     std::to_string(predictions.size()) + "), got " +
                     std::to_string(references.size()));
  }
  TranslationScores scores;
  scores.count = static_cast<int64_t>(predictions.size());
  if (predictions.empty()) return scores;
  for (size_t i = 0; i < predictions.size(); ++i) {
    scores.bleu += bleu(predictions[i], references[i]);
    scores.exact_match += predictions[i] == references[i] ? 1.0 : 0.0;
  }
  scores.bleu /= static_cast<double>(predictions.size());
  scores.exact_match /= static_cast<double>(predictions.size());
  return scores;
}

}  // namespace attn
