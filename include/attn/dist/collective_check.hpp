// Errors every rank of a communicator agrees on: a check that fails on any one rank becomes the
// same attn::Error on all of them, so no rank waits forever on a peer that gave up.
#pragma once

#include <mpi.h>

#include <functional>
#include <string>

namespace attn::dist {

// Runs `check` on this rank, then (a collective call on `comm`) finds whether any rank's check
// threw. If one did, every rank throws an error of the same kind (ShapeError, ValueError,
// FileError, else Error) carrying the lowest failing rank's message, prefixed "rank r: " when
// `comm` has more than one rank; otherwise every rank returns.
void check_on_all_ranks(MPI_Comm comm, const std::function<void()>& check);

// For a failure only one rank sees once the ranks are exchanging data (memory running out in the
// middle of the ring): prints "attn: error: rank r: <message>" and aborts every rank of `comm`
// (MPI_Abort), since its peers would otherwise wait for it forever.
[[noreturn]] void abort_all_ranks(MPI_Comm comm, const std::string& message);

}  // namespace attn::dist
