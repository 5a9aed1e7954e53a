// check_on_all_ranks, first_difference_from_root and abort_all_ranks: one rank's failure made
// every rank's, before or while they exchange data.
#include "attn/dist/collective_check.hpp"

#include <algorithm>
#include <climits>
#include <exception>
#include <iostream>

#include "attn/core/error.hpp"

namespace attn::dist {

namespace {

// The kinds of error that cross the communicator, so that every rank throws the same type.
enum ErrorKind : int { kNone = 0, kShape, kValue, kFile, kOther };

[[noreturn]] void throw_kind(int kind, const std::string& message) {
  switch (kind) {
    case kShape:
      throw ShapeError(message);
    case kValue:
      throw ValueError(message);
    case kFile:
      throw FileError(message);
    default:
      throw Error(message);
  }
}

}  // namespace

void check_on_all_ranks(MPI_Comm comm, const std::function<void()>& check) {
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  int kind = kNone;
  std::string message;
  try {
    check();
  } catch (const ShapeError& error) {
    kind = kShape;
    message = error.what();
  } catch (const ValueError& error) {
    kind = kValue;
    message = error.what();
  } catch (const FileError& error) {
    kind = kFile;
    message = error.what();
  } catch (const std::exception& error) {
    kind = kOther;
    message = error.what();
  }
  // The lowest failing rank speaks for all: its kind and message go to everyone.
  int failing = kind == kNone ? size : rank;
  int first = size;
  MPI_Allreduce(&failing, &first, 1, MPI_INT, MPI_MIN, comm);
  if (first == size) return;
  if (message.size() > static_cast<size_t>(INT_MAX / 2)) message.resize(INT_MAX / 2);
  int header[2] = {kind, static_cast<int>(message.size())};
  MPI_Bcast(header, 2, MPI_INT, first, comm);
  message.resize(static_cast<size_t>(header[1]));
  MPI_Bcast(message.data(), header[1], MPI_CHAR, first, comm);
  throw_kind(header[0], size > 1 ? "rank " + std::to_string(first) + ": " + message : message);
}

std::optional<FieldDifference> first_difference_from_root(
    MPI_Comm comm, const std::vector<std::pair<std::string, std::string>>& fields) {
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  // Rank 0's fields as "<text>\n" each: one broadcast of the length, one of the text.
  std::string root;
  if (rank == 0) {
    for (const auto& field : fields) root += field.second + "\n";
  }
  auto size = static_cast<long long>(root.size());
  MPI_Bcast(&size, 1, MPI_LONG_LONG, 0, comm);
  root.resize(static_cast<size_t>(size));
  MPI_Bcast(root.data(), static_cast<int>(size), MPI_CHAR, 0, comm);
  if (rank == 0) return std::nullopt;
  size_t at = 0;
  for (const auto& [name, text] : fields) {
    const size_t end = std::min(root.find('\n', at), root.size());
    std::string root_text = root.substr(std::min(at, root.size()), end - std::min(at, end));
    if (root_text != text) return FieldDifference{name, std::move(root_text), text};
    at = end + 1;
  }
  return std::nullopt;
}

void abort_all_ranks(MPI_Comm comm, const std::string& message) {
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  std::cerr << "attn: error: rank " << rank << ": " << message << std::endl;
  MPI_Abort(comm, 1);
  std::terminate();  // MPI_Abort does not return; this keeps [[noreturn]] honest if it did
}

}  // namespace attn::dist
