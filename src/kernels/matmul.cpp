// Batched matrix products: shape checks, then loops ordered so the innermost one is contiguous.
#include "attn/kernels/matmul.hpp"

#include "attn/core/error.hpp"

namespace attn {

namespace {
void require_out(ConstTensorView out, int64_t batch, int64_t rows, int64_t cols) {
  if (out.shape() != Shape{batch, rows, cols}) {
    throw ShapeError("out: expected shape " + Shape{batch, rows, cols}.str() + ", got shape " +
                     out.shape().str());
  }
}
}  // namespace

void batched_matmul(ConstTensorView a, ConstTensorView rhs, TensorView out) {
  require_rank("a", a.shape(), 3);
  require_rank("rhs", rhs.shape(), 3);
  const int64_t batch = a.dim(0), rows = a.dim(1), inner = a.dim(2), cols = rhs.dim(2);
  require_dim("rhs", rhs.shape(), 0, batch, "the batch size of a");
  require_dim("rhs", rhs.shape(), 1, inner, "the last dimension of a");
  require_out(out, batch, rows, cols);
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t i = 0; i < rows; ++i) {
      float* out_row = &out(b, i, 0);
      for (int64_t j = 0; j < cols; ++j) out_row[j] = 0.0F;
      for (int64_t t = 0; t < inner; ++t) {
        const float scale = a(b, i, t);
        const float* rhs_row = &rhs(b, t, 0);
        for (int64_t j = 0; j < cols; ++j) out_row[j] += scale * rhs_row[j];
      }
    }
  }
}

void batched_matmul_transposed(ConstTensorView a, ConstTensorView rhs, TensorView out) {
  require_rank("a", a.shape(), 3);
  require_rank("rhs", rhs.shape(), 3);
  const int64_t batch = a.dim(0), rows = a.dim(1), inner = a.dim(2), cols = rhs.dim(1);
  require_dim("rhs", rhs.shape(), 0, batch, "the batch size of a");
  require_dim("rhs", rhs.shape(), 2, inner, "the last dimension of a");
  require_out(out, batch, rows, cols);
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t i = 0; i < rows; ++i) {
      const float* a_row = &a(b, i, 0);
      for (int64_t j = 0; j < cols; ++j) {
        const float* rhs_row = &rhs(b, j, 0);
        float sum = 0.0F;
        for (int64_t t = 0; t < inner; ++t) sum += a_row[t] * rhs_row[t];
        out(b, i, j) = sum;
      }
    }
  }
}

void batched_transposed_matmul(ConstTensorView a, ConstTensorView rhs, TensorView out) {
  require_rank("a", a.shape(), 3);
  require_rank("rhs", rhs.shape(), 3);
  const int64_t batch = a.dim(0), inner = a.dim(1), rows = a.dim(2), cols = rhs.dim(2);
  require_dim("rhs", rhs.shape(), 0, batch, "the batch size of a");
  require_dim("rhs", rhs.shape(), 1, inner, "the first matrix dimension of a");
  require_out(out, batch, rows, cols);
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t i = 0; i < rows; ++i) {
      float* out_row = &out(b, i, 0);
      for (int64_t j = 0; j < cols; ++j) out_row[j] = 0.0F;
    }
    // Row t of a and of rhs contribute the outer product a[t, :]ᵀ rhs[t, :]; rows stay contiguous.
    for (int64_t t = 0; t < inner; ++t) {
      const float* rhs_row = &rhs(b, t, 0);
      for (int64_t i = 0; i < rows; ++i) {
        const float scale = a(b, t, i);
        float* out_row = &out(b, i, 0);
        for (int64_t j = 0; j < cols; ++j) out_row[j] += scale * rhs_row[j];
      }
    }
  }
}

}  // namespace attn
