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
  // Rank 0's fields as "<name>\n<text>\n" each: one broadcast of the length, one of the text.
  std::string root;
  if (rank == 0) {
    for (const auto& [name, text] : fields) root += name + "\n" + text + "\n";
  }
  auto size = static_cast<long long>(root.size());
  MPI_Bcast(&size, 1, MPI_LONG_LONG, 0, comm);
  root.resize(static_cast<size_t>(size));
  MPI_Bcast(root.data(), static_cast<int>(size), MPI_CHAR, 0, comm);
  if (rank == 0) return std::nullopt;
  // Its lines, two a field (every one ends in a newline, and neither part holds one).
  std::vector<std::string> lines;
  for (size_t at = 0, end; (end = root.find('\n', at)) != std::string::npos; at = end + 1) {
    lines.push_back(root.substr(at, end - at));
  }
  std::vector<std::pair<std::string, std::string>> root_fields;
  for (size_t i = 0; i + 1 < lines.size(); i += 2) root_fields.emplace_back(lines[i], lines[i + 1]);
  // A field one side has and the other lacks (a flag given to some ranks only) differs too.
  for (size_t i = 0; i < std::max(fields.size(), root_fields.size()); ++i) {
    if (i >= fields.size())
      return FieldDifference{root_fields[i].first, root_fields[i].second, "none"};
    if (i >= root_fields.size()) return FieldDifference{fields[i].first, "none", fields[i].second};
    if (root_fields[i] != fields[i]) {
      return FieldDifference{fields[i].first,
                             root_fields[i].first == fields[i].first
                                 ? root_fields[i].second
                                 : root_fields[i].first + " " + root_fields[i].second,
                             fields[i].second};
    }
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
