// Errors every rank of a communicator agrees on: a check that fails on any one rank becomes the
// same attn::Error on all of them, so no rank waits forever on a peer that gave up.
#pragma once

#include <mpi.h>

#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace attn::dist {

// Runs `check` on this rank, then (a collective call on `comm`) finds whether any rank's check
// threw. If one did, every rank throws an error of the same kind (ShapeError, ValueError,
// FileError, else Error) carrying the lowest failing rank's message, prefixed "rank r: " when
// `comm` has more than one rank; otherwise every rank returns.
void check_on_all_ranks(MPI_Comm comm, const std::function<void()>& check);

// What one rank holds that rank 0 holds otherwise: the field's name, rank 0's text and this rank's.
struct FieldDifference {
  std::string name;
  std::string root_text;
  std::string text;
};

// A collective call on `comm`: rank 0's `fields` (name, text; names and texts without newlines)
// reach every rank, and each rank but 0 gets the first of its own that differs from rank 0's in
// name or text, or that one side lacks ("none" for the missing text); nullopt on rank 0 and where
// all agree. Text, so that a difference reads as the user would write it ("(2, 13, 8)" against
// "(2, 14, 8)").
std::optional<FieldDifference> first_difference_from_root(
    MPI_Comm comm, const std::vector<std::pair<std::string, std::string>>& fields);

// For a failure only one rank sees once the ranks are exchanging data (memory running out in the
// middle of the ring): prints "attn: error: rank r: <message>" and aborts every rank of `comm`
// (MPI_Abort), since its peers would otherwise wait for it forever.
[[noreturn]] void abort_all_ranks(MPI_Comm comm, const std::string& message);

}  // namespace attn::dist
