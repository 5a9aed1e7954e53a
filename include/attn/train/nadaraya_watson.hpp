// The book's Nadaraya–Watson kernel regression: its synthetic data, the nonparametric model
// (Gaussian kernel of width 1) and the parametric one (learnable width) trained with SGD.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "attn/core/tensor.hpp"

namespace attn {

// x_train: 50 points uniform in [0, 5), sorted; y_train = 2 sin x + x^0.8 + N(0, 0.5²);
// x_test = 0, 0.1, …, 4.9; y_truth = 2 sin x + x^0.8 on x_test. All of shape (count,).
struct NadarayaWatsonData {
  Tensor x_train;
  Tensor y_train;
  Tensor x_test;
  Tensor y_truth;
};

NadarayaWatsonData make_nadaraya_watson_data(uint64_t seed, int64_t train_count = 50);

struct NadarayaWatsonOptions {
  int epochs = 5;
  float lr = 0.5F;
  uint64_t seed = 0;  // draws the initial width uniformly in [0, 1), as the book's torch.rand
};

struct NadarayaWatsonFit {
  float initial_width = 0.0F;
  float trained_width = 0.0F;
  std::vector<float>
      epoch_losses;  // Σ over training points of the squared error, after each epoch's forward pass
  Tensor nonparametric_predictions;     // (test count,)
  Tensor parametric_predictions;        // (test count,)
  Tensor nonparametric_weights;         // (test count, train count)
  Tensor parametric_weights;            // (test count, train count)
  float nonparametric_test_mse = 0.0F;  // against y_truth
  float parametric_test_mse = 0.0F;
};

// Trains the parametric model as the book does: every training point queries all the others
// (itself excluded), loss Σ (ŷ − y)², full-batch SGD for `epochs` steps. `on_epoch(epoch, loss)`
// is called after each (1-based) epoch.
NadarayaWatsonFit fit_nadaraya_watson(const NadarayaWatsonData& data,
                                      const NadarayaWatsonOptions& options = {},
                                      const std::function<void(int, float)>& on_epoch = {});

}  // namespace attn
