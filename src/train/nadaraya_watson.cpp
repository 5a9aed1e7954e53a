// Nadaraya–Watson kernel regression: data generation and the book's training loop, on top of
// GaussianKernelPooling, the MSE loss and SGD.
#include "attn/train/nadaraya_watson.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include "attn/core/error.hpp"
#include "attn/core/random.hpp"
#include "attn/nn/gaussian_kernel_pooling.hpp"
#include "attn/train/losses.hpp"
#include "attn/train/sgd.hpp"

namespace attn {

namespace {

float target_function(float x) {
  return 2.0F * std::sin(x) + std::pow(x, 0.8F);
}

// Queries (count, 1, 1) against keys and values (count, count − 1, 1): each training point sees
// every other one, as the book's X_tile[(1 − eye).bool()] construction.
struct LeaveOneOut {
  Tensor queries, keys, values;
};

LeaveOneOut leave_one_out(const Tensor& x, const Tensor& y) {
  const int64_t count = x.numel();
  LeaveOneOut tiles{Tensor(Shape{count, 1, 1}), Tensor(Shape{count, count - 1, 1}),
                    Tensor(Shape{count, count - 1, 1})};
  for (int64_t i = 0; i < count; ++i) {
    tiles.queries(i, 0, 0) = x(i);
    int64_t column = 0;
    for (int64_t j = 0; j < count; ++j) {
      if (j == i) continue;
      tiles.keys(i, column, 0) = x(j);
      tiles.values(i, column, 0) = y(j);
      ++column;
    }
  }
  return tiles;
}

struct Prediction {
  Tensor values;   // (test count,)
  Tensor weights;  // (test count, train count)
};

Prediction predict(GaussianKernelPooling& model, const NadarayaWatsonData& data) {
  const int64_t tests = data.x_test.numel(), trains = data.x_train.numel();
  const ConstTensorView keys = data.x_train.view().reshaped(Shape{1, trains, 1});
  const ConstTensorView values = data.y_train.view().reshaped(Shape{1, trains, 1});
  Tensor out = model(data.x_test.view().reshaped(Shape{1, tests, 1}), keys, values);
  out.reshape(Shape{tests});
  Tensor weights = model.attention_weights();
  weights.reshape(Shape{tests, trains});
  return {std::move(out), std::move(weights)};
}

float mse(const Tensor& prediction, const Tensor& truth) {
  return mse_loss(prediction, truth).loss;
}

}  // namespace

NadarayaWatsonData make_nadaraya_watson_data(uint64_t seed, int64_t train_count) {
  if (train_count < 2) {
    throw ValueError("train_count: expected at least 2 training points, got " +
                     std::to_string(train_count));
  }
  Rng rng(seed);
  std::vector<float> x(static_cast<size_t>(train_count));
  for (float& value : x) value = rng.uniform() * 5.0F;
  std::sort(x.begin(), x.end());
  std::vector<float> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = target_function(x[i]) + 0.5F * rng.normal();
  std::vector<float> x_test, y_truth;
  for (int step = 0; step < 50; ++step) {
    x_test.push_back(static_cast<float>(step) * 0.1F);
    y_truth.push_back(target_function(x_test.back()));
  }
  return {Tensor(Shape{train_count}, std::move(x)), Tensor(Shape{train_count}, std::move(y)),
          Tensor(Shape{50}, x_test), Tensor(Shape{50}, y_truth)};
}

NadarayaWatsonFit fit_nadaraya_watson(const NadarayaWatsonData& data,
                                      const NadarayaWatsonOptions& options,
                                      const std::function<void(int, float)>& on_epoch) {
  if (options.epochs < 0)
    throw ValueError("epochs: expected a number ≥ 0, got " + std::to_string(options.epochs));
  NadarayaWatsonFit fit;
  GaussianKernelPooling nonparametric(1.0F);
  const Prediction baseline = predict(nonparametric, data);
  fit.nonparametric_predictions = baseline.values;
  fit.nonparametric_weights = baseline.weights;
  fit.nonparametric_test_mse = mse(baseline.values, data.y_truth);

  Rng rng(options.seed);
  fit.initial_width = rng.uniform();
  GaussianKernelPooling model(fit.initial_width);
  Sgd optimizer(model.parameters(), options.lr);
  const LeaveOneOut tiles = leave_one_out(data.x_train, data.y_train);
  const int64_t count = data.x_train.numel();
  for (int epoch = 1; epoch <= options.epochs; ++epoch) {
    optimizer.zero_grad();
    Tensor prediction = model(tiles.queries, tiles.keys, tiles.values);
    prediction.reshape(Shape{count});
    const LossResult loss = mse_loss(prediction, data.y_train, Reduction::kSum);
    Tensor grad = loss.grad;
    grad.reshape(Shape{count, 1, 1});
    model.backward(grad);
    optimizer.step();
    fit.epoch_losses.push_back(loss.loss);
    if (on_epoch) on_epoch(epoch, loss.loss);
  }
  fit.trained_width = model.width();
  const Prediction trained = predict(model, data);
  fit.parametric_predictions = trained.values;
  fit.parametric_weights = trained.weights;
  fit.parametric_test_mse = mse(trained.values, data.y_truth);
  return fit;
}

}  // namespace attn
