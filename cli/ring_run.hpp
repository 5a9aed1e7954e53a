// `attn run --ring`: the dot-product attention of `attn run` as ring attention over MPI ranks
// (attn::dist): each rank reads only its shard of every input, rank 0 gathers and writes.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "run_arguments.hpp"

namespace attn::cli {

// What `attn run` hands the ring path: the same inputs and attention flags as a single-process
// run, and the outputs asked for.
struct RingRunRequest {
  std::string layer;
  RunArguments arguments;
  std::string out;
  std::optional<std::string> out_grad;   // G: run the backward pass too
  std::optional<std::string> grads_out;  // with out_grad
  // Flags given that need the whole (n, m) weights, which no rank holds: refused by name.
  std::vector<std::string> refused_flags;
};

// Runs on every rank of MPI_COMM_WORLD (initialising MPI unless the program has): an error on any
// rank becomes the same error on all of them, reported by rank 0 ("attn: error: rank r: ...")
// while the others exit with status 1 quietly. Without MPI in the build: ValueError naming --ring.
void run_ring(const RingRunRequest& request);

// Whether run_ring has started in this process: its errors from then on are reported by rank 0
// alone (run_ring's own doing); those before it, the flags' and `attn run`'s own checks, are every
// rank's alike, and main reports them from rank 0 alone too.
bool ring_started();

}  // namespace attn::cli
