// check_on_all_ranks and abort_all_ranks: one rank's failure made every rank's, before or while
// they exchange data.
#include "attn/dist/collective_check.hpp"

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

void abort_all_ranks(MPI_Comm comm, const std::string& message) {
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  std::cerr << "attn: error: rank " << rank << ": " << message << std::endl;
  MPI_Abort(comm, 1);
  std::terminate();  // MPI_Abort does not return; this keeps [[noreturn]] honest if it did
}

}  // namespace attn::dist
