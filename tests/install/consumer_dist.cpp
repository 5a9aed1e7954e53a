// Runs ring attention through the installed attn::dist (found with find_package(attn), MPI found
// through attn's package) on one rank, causal, against the functional API on the same tensors.
#include <mpi.h>
#include <attn/dist/ring_attention.hpp>
#include <attn/functional/scaled_dot_product_attention.hpp>

#include <cmath>
#include <cstdio>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  attn::Tensor q(attn::Shape{1, 2, 9, 4});
  for (int64_t index = 0; index < q.numel(); ++index) {
    q.data()[index] = std::sin(0.7F * static_cast<float>(index));
  }
  attn::AttentionOptions options;
  options.causal = true;
  // One rank holds the whole sequence, its two zig-zag chunks in order.
  const attn::dist::RingAttentionForward ring =
      attn::dist::ring_attention_forward(MPI_COMM_WORLD, q, q, q, options);
  const attn::AttentionForward whole = attn::scaled_dot_product_attention(q, q, q, options);
  int status = 0;
  for (int64_t index = 0; index < q.numel(); ++index) {
    if (std::abs(ring.output.data()[index] - whole.output.data()[index]) > 1e-5F) {
      std::printf("output[%lld]: ring %g, functional %g\n", static_cast<long long>(index),
                  ring.output.data()[index], whole.output.data()[index]);
      status = 1;
    }
  }
  MPI_Finalize();
  return status;
}
