// attn_ring_bench: times ring attention (attn::dist) under mpirun against the functional API on
// the whole sequence in one process — the figures of docs/distributed.md. Run e.g.
//   OMP_NUM_THREADS=2 attn_ring_bench --single --causal          (one process, two threads)
//   mpirun -np 2 -x OMP_NUM_THREADS=1 attn_ring_bench --causal   (two ranks, one thread each)
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "attn/core/random.hpp"
#include "attn/core/tensor.hpp"
#include "attn/dist/ring_attention.hpp"
#include "attn/dist/sequence_shards.hpp"
#include "attn/functional/scaled_dot_product_attention.hpp"

namespace {

struct Settings {
  int64_t n = 16384, batch = 1, heads = 8, kv_heads = 0, dim = 64;
  bool causal = false, backward = false, single = false, contiguous = false;
  int repeats = 3;
};

[[noreturn]] void usage(const char* problem) {
  std::fprintf(stderr,
               "attn_ring_bench: %s\nusage: attn_ring_bench [--n N] [--batch B] [--heads H] "
               "[--kv-heads G] [--dim D] [--causal] [--backward] [--repeats R] [--single] "
               "[--contiguous]\n",
               problem);
  std::exit(2);
}

Settings parse(int argc, char** argv) {
  Settings s;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    const auto value = [&]() -> int64_t {
      if (i + 1 >= argc) usage(("missing value after " + flag).c_str());
      return std::atoll(argv[++i]);
    };
    if (flag == "--n")
      s.n = value();
    else if (flag == "--batch")
      s.batch = value();
    else if (flag == "--heads")
      s.heads = value();
    else if (flag == "--kv-heads")
      s.kv_heads = value();
    else if (flag == "--dim")
      s.dim = value();
    else if (flag == "--repeats")
      s.repeats = static_cast<int>(value());
    else if (flag == "--causal")
      s.causal = true;
    else if (flag == "--backward")
      s.backward = true;
    else if (flag == "--single")
      s.single = true;
    else if (flag == "--contiguous")
      s.contiguous = true;
    else
      usage(("unknown flag " + flag).c_str());
  }
  if (s.kv_heads == 0) s.kv_heads = s.heads;
  return s;
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

double slowest(double seconds) {
  double result = 0.0;
  MPI_Allreduce(&seconds, &result, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return result;
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  int rank = 0, ranks = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  const Settings s = parse(argc, argv);
  if (s.single && ranks != 1) usage("--single runs the whole sequence in one process: -np 1");
  const attn::dist::Sharding sharding =
      s.contiguous ? attn::dist::Sharding::kContiguous : attn::dist::Sharding::kZigZag;
  const attn::dist::SequenceShards shards(s.n, ranks, sharding);
  const int64_t rows = s.single ? s.n : shards.local_length(rank);
  attn::Rng rng(1000 + static_cast<uint64_t>(rank));
  const auto random = [&](int64_t heads) {
    attn::Tensor tensor(attn::Shape{s.batch, heads, rows, s.dim});
    for (float& x : tensor.span()) x = rng.normal();
    return tensor;
  };
  const attn::Tensor q = random(s.heads), k = random(s.kv_heads), v = random(s.kv_heads),
                     g = random(s.heads);
  attn::AttentionOptions options;
  options.causal = s.causal;
  options.enable_gqa = s.kv_heads != s.heads;

  std::vector<double> forward_times, backward_times, waits, computes;
  for (int repeat = 0; repeat < s.repeats; ++repeat) {
    MPI_Barrier(MPI_COMM_WORLD);
    double start = MPI_Wtime();
    attn::Tensor output;
    std::vector<float> log_sum_exp;
    if (s.single) {
      attn::AttentionForward forward = attn::scaled_dot_product_attention(q, k, v, options);
      output = std::move(forward.output);
      log_sum_exp = std::move(forward.log_sum_exp);
    } else {
      attn::dist::RingAttentionForward forward =
          attn::dist::ring_attention_forward(MPI_COMM_WORLD, q, k, v, options, sharding);
      output = std::move(forward.output);
      log_sum_exp = std::move(forward.log_sum_exp);
      waits.push_back(slowest(attn::dist::last_ring_statistics().wait_seconds));
      computes.push_back(slowest(attn::dist::last_ring_statistics().compute_seconds));
    }
    forward_times.push_back(slowest(MPI_Wtime() - start));
    if (!s.backward) continue;
    MPI_Barrier(MPI_COMM_WORLD);
    start = MPI_Wtime();
    if (s.single) {
      (void)attn::scaled_dot_product_attention_backward(q, k, v, output, g, log_sum_exp, options);
    } else {
      (void)attn::dist::ring_attention_backward(MPI_COMM_WORLD, q, k, v, output, g, log_sum_exp,
                                                options, sharding);
    }
    backward_times.push_back(slowest(MPI_Wtime() - start));
  }

  if (rank == 0) {
    // Visible (query, key) pairs of the whole sequence; 4·d flops each forward (QKᵀ and PV),
    // 10·d backward (five products).
    const auto n = static_cast<double>(s.n);
    const double pairs =
        static_cast<double>(s.batch * s.heads) * (s.causal ? 0.5 * n * (n + 1.0) : n * n);
    const double forward = median(forward_times);
    std::printf("%s P=%d n=%lld B=%lld H=%lld/%lld d=%lld %s: forward %.3f s (%.1f GFLOP/s)",
                s.single ? "single" : (s.contiguous ? "ring-contiguous" : "ring-zigzag"), ranks,
                static_cast<long long>(s.n), static_cast<long long>(s.batch),
                static_cast<long long>(s.heads), static_cast<long long>(s.kv_heads),
                static_cast<long long>(s.dim), s.causal ? "causal" : "full", forward,
                pairs * 4.0 * static_cast<double>(s.dim) / forward * 1e-9);
    if (!s.single) {
      std::printf(" [slowest rank: computing %.3f s, waiting %.3f s]", median(computes),
                  median(waits));
    }
    if (s.backward) {
      const double backward = median(backward_times);
      std::printf(", backward %.3f s (%.1f GFLOP/s)", backward,
                  pairs * 10.0 * static_cast<double>(s.dim) / backward * 1e-9);
    }
    std::printf("; median of %d\n", s.repeats);
  }
  MPI_Finalize();
  return 0;
}
