// Rows of floats quantised to int8 with one scale per row (the KV cache's int8 layout, as ggml's
// q8_0 stores a scale per block), at SIMD speed and on the OpenMP threads for large counts.
#pragma once

#include <cstddef>
#include <cstdint>

namespace attn {

// For each of `rows` rows of `cols` finite floats (row r at from + r·from_stride): scales[r] =
// max|x| / 127 (1 for a row of zeros) and to[r·cols + c] = round(x / scales[r]), halves rounded
// away from zero (std::lround) and clamped to [−127, 127]; bit-equal to that scalar definition on
// every SIMD target. Non-finite inputs give unspecified results: callers check them first.
void quantize_rows_int8(const float* from, size_t from_stride, size_t rows, size_t cols, int8_t* to,
                        float* scales);

}  // namespace attn
