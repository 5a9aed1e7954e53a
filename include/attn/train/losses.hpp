// Losses with their gradients: mean squared error, and softmax cross-entropy over tokens with a
// padding mask (the book's MaskedSoftmaxCELoss).
#pragma once

#include <cstdint>
#include <span>

#include "attn/core/tensor.hpp"

namespace attn {

enum class Reduction { kMean, kSum };

struct LossResult {
  float loss;   // the reduced loss
  Tensor grad;  // d loss / d prediction, shaped like the prediction
};

// Σ (prediction − target)², divided by the element count for kMean (nn.MSELoss). ShapeError
// unless both have the same shape.
LossResult mse_loss(ConstTensorView prediction, ConstTensorView target,
                    Reduction reduction = Reduction::kMean);

struct SequenceLossResult {
  Tensor losses;  // (B): per sequence, the mean over all T steps of the masked token losses
  Tensor grad;    // (B, T, V): d Σ_b losses[b] / d logits
};

// For logits (B, T, V), labels (B, T) in [0, V) and valid lengths (B) in [0, T]: token loss
// −log softmax(logits[b, t])[labels[b, t]] for t < valid_lens[b], 0 for padding; each sequence's
// loss is the mean over all T steps, as the book's MaskedSoftmaxCELoss (which divides by T, not by
// the valid length). Stable for logits of any finite magnitude. ShapeError/ValueError naming the
// argument for wrong shapes, a label outside [0, V) or a length outside [0, T].
SequenceLossResult masked_softmax_cross_entropy(ConstTensorView logits,
                                                std::span<const int64_t> labels,
                                                std::span<const int64_t> valid_lens);

}  // namespace attn
