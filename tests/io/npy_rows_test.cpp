// read_npy_header and read_npy_rows: chosen rows of one axis of a .npy file, against the same
// rows cut from the whole array that read_npy returns, and the errors a bad request or file gets.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "attn/core/error.hpp"
#include "attn/io/npy.hpp"
#include "attn/io/npy_rows.hpp"
#include "test_support.hpp"

namespace attn {
namespace {

namespace fs = std::filesystem;

class NpyRowsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    directory_ = fs::temp_directory_path() / ("attn_npy_rows_" + std::to_string(::getpid()));
    fs::create_directories(directory_);
  }
  void TearDown() override { fs::remove_all(directory_); }
  fs::path path(const std::string& name) const { return directory_ / name; }

  fs::path directory_;
};

// The (2, 7, 3) array with element (b, i, c) = 100·b + 10·i + c.
Tensor numbered() {
  Tensor tensor(Shape{2, 7, 3});
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t i = 0; i < 7; ++i)
      for (int64_t c = 0; c < 3; ++c) tensor(b, i, c) = static_cast<float>(100 * b + 10 * i + c);
  return tensor;
}

// A little-endian float64 .npy file of `shape` (rank 3) holding `values`.
void save_float64(const fs::path& file, const Shape& shape, const std::vector<double>& values) {
  std::string header = "{'descr': '<f8', 'fortran_order': False, 'shape': (" +
                       std::to_string(shape[0]) + ", " + std::to_string(shape[1]) + ", " +
                       std::to_string(shape[2]) + "), }";
  while ((10 + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  std::ofstream out(file, std::ios::binary);
  out.write("\x93NUMPY\x01\x00", 8);
  const auto length = static_cast<uint16_t>(header.size());
  const char length_bytes[2] = {static_cast<char>(length & 0xFF), static_cast<char>(length >> 8)};
  out.write(length_bytes, 2);
  out << header;
  out.write(reinterpret_cast<const char*>(values.data()),
            static_cast<std::streamsize>(values.size() * sizeof(double)));
}

// As load_npy_tensor: a float64 value past float's range, in the rows read, is named as the file
// holds it at its index in the whole array (a ring rank named "inf at flat index 11 of this
// rank's shard"); rows not read are not judged.
TEST_F(NpyRowsTest, Float64ValuesPastFloatRangeAreNamedAtTheirIndexInTheFile) {
  std::vector<double> values(2 * 7 * 3, 0.5);
  values[0] = -1e300;                  // (0, 0, 0): in no range read below
  values[(1 * 7 + 5) * 3 + 2] = 1e39;  // (1, 5, 2): flat index 38
  save_float64(path("x.npy"), Shape{2, 7, 3}, values);
  const std::vector<NpyRowRange> ranges = {{5, 2}, {1, 2}};
  EXPECT_THROW_MESSAGE(read_npy_rows(path("x.npy"), -2, ranges), FileError,
                       "expected float64 values float32 holds (within ±3.4e38; attn computes in "
                       "float32), got 1e+39 at flat index 38");
  const std::vector<NpyRowRange> first = {{0, 1}};
  EXPECT_THROW_MESSAGE(read_npy_rows(path("x.npy"), 1, first), FileError,
                       "got -1e+300 at flat index 0");
  // ±∞ in the file stays what it is, for the checks of its use.
  values[0] = -std::numeric_limits<double>::infinity();
  values[38] = 0.5;
  save_float64(path("x.npy"), Shape{2, 7, 3}, values);
  const NpyArray rows = read_npy_rows(path("x.npy"), 1, first);
  EXPECT_EQ(rows.floats[0], -std::numeric_limits<float>::infinity());
}

TEST_F(NpyRowsTest, HeaderAloneGivesShapeAndDtype) {
  save_npy(path("x.npy"), numbered());
  const NpyHeader header = read_npy_header(path("x.npy"));
  EXPECT_EQ(header.shape, (Shape{2, 7, 3}));
  EXPECT_EQ(header.dtype, NpyDType::kFloat32);
}

TEST_F(NpyRowsTest, RangesOfTheMiddleAxisConcatenateInTheOrderGiven) {
  save_npy(path("x.npy"), numbered());
  const std::vector<NpyRowRange> ranges = {{5, 2}, {0, 0}, {1, 2}};
  const NpyArray rows = read_npy_rows(path("x.npy"), -2, ranges);
  ASSERT_EQ(rows.shape, (Shape{2, 4, 3}));
  const int64_t order[] = {5, 6, 1, 2};
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t r = 0; r < 4; ++r)
      for (int64_t c = 0; c < 3; ++c)
        EXPECT_EQ(rows.floats[static_cast<size_t>((b * 4 + r) * 3 + c)],
                  static_cast<float>(100 * b + 10 * order[r] + c));
}

TEST_F(NpyRowsTest, LastAxisOfIntegersAndFirstAxisOfBools) {
  const std::vector<int64_t> lengths = {1, 2, 3, 4, 5, 6, 7, 8};
  save_npy(path("lens.npy"), lengths, Shape{2, 4});
  const std::vector<NpyRowRange> columns = {{1, 2}};
  const NpyArray integers = read_npy_rows(path("lens.npy"), 1, columns);
  EXPECT_EQ(integers.shape, (Shape{2, 2}));
  EXPECT_EQ(integers.integers, (std::vector<int64_t>{2, 3, 6, 7}));
  const std::vector<uint8_t> flags = {1, 0, 0, 1, 1, 1};
  save_npy_bool(path("b.npy"), flags, Shape{3, 2});
  const std::vector<NpyRowRange> first = {{2, 1}, {0, 1}};
  const NpyArray bools = read_npy_rows(path("b.npy"), 0, first);
  EXPECT_EQ(bools.shape, (Shape{2, 2}));
  EXPECT_EQ(bools.bools, (std::vector<uint8_t>{1, 1, 1, 0}));
}

TEST_F(NpyRowsTest, RangesOutsideTheAxisAndBadAxesAreShapeErrors) {
  save_npy(path("x.npy"), numbered());
  const std::vector<NpyRowRange> beyond = {{6, 2}};
  EXPECT_THROW_MESSAGE(read_npy_rows(path("x.npy"), 1, beyond), ShapeError,
                       "rows [6, 8) of axis 1 lie outside the array of shape (2, 7, 3)");
  const std::vector<NpyRowRange> negative = {{-1, 1}};
  EXPECT_THROW(read_npy_rows(path("x.npy"), 1, negative), ShapeError);
  EXPECT_THROW_MESSAGE(read_npy_rows(path("x.npy"), 3, negative), ShapeError, "axis 3");
}

TEST_F(NpyRowsTest, TruncatedMissingAndForeignFilesAreFileErrors) {
  save_npy(path("x.npy"), numbered());
  std::vector<char> bytes(fs::file_size(path("x.npy")));
  std::ifstream(path("x.npy"), std::ios::binary).read(bytes.data(), std::streamsize(bytes.size()));
  std::ofstream(path("short.npy"), std::ios::binary)
      .write(bytes.data(), std::streamsize(bytes.size() - 4));
  EXPECT_THROW_MESSAGE(read_npy_header(path("short.npy")), FileError,
                       "expected 168 bytes of data for shape (2, 7, 3) of '<f4', got 164 bytes");
  std::ofstream(path("tiny.npy"), std::ios::binary).write(bytes.data(), 5);
  EXPECT_THROW_MESSAGE(read_npy_header(path("tiny.npy")), FileError, "too short for a .npy file");
  std::ofstream(path("text.npy")) << "not an array at all";
  EXPECT_THROW_MESSAGE(read_npy_header(path("text.npy")), FileError, "not a .npy file");
  EXPECT_THROW_MESSAGE(read_npy_header(path("missing.npy")), FileError, "missing.npy");
  // Refused before anything waits on them.
  ASSERT_EQ(::mkfifo(path("fifo.npy").c_str(), 0600), 0);
  EXPECT_THROW_MESSAGE(read_npy_header(path("fifo.npy")), FileError,
                       "expected a regular file, got a FIFO");
  EXPECT_THROW_MESSAGE(read_npy_rows(directory_, 0, {}), FileError, "got a directory");
}

}  // namespace
}  // namespace attn
