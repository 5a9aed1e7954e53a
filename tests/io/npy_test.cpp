// Tests of the .npy reader and writer: round trips, files NumPy wrote (tests/fixtures/io, made by
// tools/make_io_fixtures.py), NumPy's exact header bytes, and malformed files of every kind.
#include "attn/io/npy.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>

#include "attn/core/error.hpp"
#include "attn/core/half.hpp"
#include "attn/io/files.hpp"
#include "attn/io/npy_rows.hpp"
#include "test_support.hpp"

namespace attn {
namespace {

std::vector<std::byte> text_bytes(std::string_view text) {
  std::vector<std::byte> bytes;
  for (const char c : text) bytes.push_back(static_cast<std::byte>(c));
  return bytes;
}

template <class T>
std::vector<std::byte> value_bytes(const std::vector<T>& values) {
  std::vector<std::byte> bytes(values.size() * sizeof(T));
  if (!values.empty()) std::memcpy(bytes.data(), values.data(), bytes.size());
  return bytes;
}

// A .npy file holding `dict` as its header (no alignment padding) and then `data`.
std::vector<std::byte> make_npy(std::string_view dict, const std::vector<std::byte>& data,
                                int major = 1) {
  std::string preamble = std::string("\x93NUMPY", 6) + static_cast<char>(major) + '\0';
  const size_t length = dict.size();
  preamble += static_cast<char>(length & 0xFF);
  preamble += static_cast<char>((length >> 8) & 0xFF);
  if (major > 1) preamble += std::string(2, '\0');
  std::vector<std::byte> bytes = text_bytes(preamble + std::string(dict));
  bytes.insert(bytes.end(), data.begin(), data.end());
  return bytes;
}

std::filesystem::path fixture(const std::string& name) {
  return std::filesystem::path(ATTN_FIXTURES_DIR) / "io" / name;
}

std::vector<std::byte> fixture_bytes(const std::string& name) {
  std::ifstream file(fixture(name), std::ios::binary);
  const std::string contents{std::istreambuf_iterator<char>(file), {}};
  EXPECT_FALSE(contents.empty()) << "cannot read fixture " << name;
  return text_bytes(contents);
}

// A fresh directory for the current test, removed afterwards; the pid keeps concurrent runs of
// the suite (e.g. a sanitizer build) apart.
class TempDirectory {
 public:
  TempDirectory() {
    const std::string test = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    path_ = std::filesystem::temp_directory_path() /
            ("attn_npy_" + test + "_" + std::to_string(::getpid()));
    std::filesystem::create_directories(path_);
  }
  ~TempDirectory() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  TempDirectory(const TempDirectory&) = delete;
  TempDirectory& operator=(const TempDirectory&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

constexpr std::string_view kFloat32Dict =
    "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }\n";

std::vector<std::byte> valid_float32_file() {
  return make_npy(kFloat32Dict, value_bytes(std::vector<float>{1, 2, 3, 4, 5, 6}));
}

// ---- Round trips. Values are compared exactly: float32 data is copied byte for byte.

TEST(Npy, Float32RoundTripsAtEveryRank) {
  Rng rng(7);
  for (const Shape& shape : {Shape{}, Shape{3}, Shape{2, 3}, Shape{2, 1, 3}, Shape{1, 2, 3, 2}}) {
    const Tensor tensor = testing::random_tensor(shape, rng);
    const NpyArray array = parse_npy(serialize_npy(tensor), "round trip");
    EXPECT_EQ(array.shape, shape);
    EXPECT_EQ(array.dtype, NpyDType::kFloat32);
    EXPECT_FALSE(array.is_integer());
    EXPECT_EQ(array.floats, tensor.to_vector()) << "shape " << shape.str();
    EXPECT_TRUE(array.integers.empty());
  }
}

TEST(Npy, EmptyDimensionsRoundTrip) {
  for (const Shape& shape : {Shape{0}, Shape{0, 3}, Shape{2, 0, 4}}) {
    const NpyArray array = parse_npy(serialize_npy(Tensor(shape)), "empty");
    EXPECT_EQ(array.shape, shape);
    EXPECT_EQ(array.shape.numel(), 0);
    EXPECT_TRUE(array.floats.empty());
  }
}

TEST(Npy, Int64RoundTrips) {
  const std::vector<int64_t> values = {std::numeric_limits<int64_t>::min(), -1, 0, 42, 7,
                                       std::numeric_limits<int64_t>::max()};
  const NpyArray array = parse_npy(serialize_npy(values, Shape{2, 3}), "ints");
  EXPECT_EQ(array.shape, (Shape{2, 3}));
  EXPECT_EQ(array.dtype, NpyDType::kInt64);
  EXPECT_TRUE(array.is_integer());
  EXPECT_EQ(array.integers, values);
  EXPECT_TRUE(array.floats.empty());

  const NpyArray scalar = parse_npy(serialize_npy(std::vector<int64_t>{-5}, Shape{}), "scalar");
  EXPECT_EQ(scalar.shape.rank(), 0);
  EXPECT_EQ(scalar.integers, std::vector<int64_t>{-5});
}

TEST(Npy, Int64SerializationChecksTheCount) {
  EXPECT_THROW_MESSAGE(serialize_npy(std::vector<int64_t>{1, 2}, Shape{3}), ShapeError,
                       "shape (3,) needs 3 values, got 2");
}

TEST(Npy, Float64IsRoundedToFloat32) {
  const std::vector<double> values = {0.1, -2.5, 1e300, -1e-50};
  const NpyArray array = parse_npy(
      make_npy("{'descr': '<f8', 'fortran_order': False, 'shape': (2, 2), }", value_bytes(values)),
      "doubles");
  EXPECT_EQ(array.dtype, NpyDType::kFloat64);
  EXPECT_EQ(array.shape, (Shape{2, 2}));
  ASSERT_EQ(array.floats.size(), 4U);
  EXPECT_EQ(array.floats[0], 0.1F);  // the float nearest 0.1, not the double
  EXPECT_EQ(array.floats[1], -2.5F);
  EXPECT_EQ(array.floats[2], std::numeric_limits<float>::infinity());  // as numpy's astype does
  EXPECT_EQ(array.floats[3], 0.0F);
  EXPECT_TRUE(std::signbit(array.floats[3]));
}

TEST(Npy, Int32IsWidened) {
  const std::vector<int32_t> values = {1, -2, std::numeric_limits<int32_t>::min(),
                                       std::numeric_limits<int32_t>::max()};
  const NpyArray array = parse_npy(
      make_npy("{'descr': '<i4', 'fortran_order': False, 'shape': (4,), }", value_bytes(values)),
      "int32");
  EXPECT_EQ(array.dtype, NpyDType::kInt32);
  EXPECT_EQ(array.integers, (std::vector<int64_t>{1, -2, std::numeric_limits<int32_t>::min(),
                                                  std::numeric_limits<int32_t>::max()}));
}

// ---- Bool arrays ('|b1'), as attention masks come.

TEST(Npy, BoolRoundTripsAndMatchesNumPyByteForByte) {
  const std::vector<uint8_t> values = {1, 0, 1, 0, 0, 1};
  const std::vector<std::byte> bytes = serialize_npy_bool(values, Shape{2, 3});
  // np.save(np.array([[True, False, True], [False, False, True]])) (NumPy 2.4): the data starts
  // at byte 128 and holds one byte per element.
  const std::string expected_header =
      std::string("\x93NUMPY\x01\x00\x76\x00", 10) +
      "{'descr': '|b1', 'fortran_order': False, 'shape': (2, 3), }" + std::string(58, ' ') + "\n";
  ASSERT_EQ(bytes.size(), 128U + 6);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(bytes.data()), 128), expected_header);
  const NpyArray array = parse_npy(bytes, "mask.npy");
  EXPECT_EQ(array.dtype, NpyDType::kBool);
  EXPECT_TRUE(array.is_bool());
  EXPECT_FALSE(array.is_integer());
  EXPECT_EQ(array.shape, (Shape{2, 3}));
  EXPECT_EQ(array.bools, values);
  EXPECT_TRUE(array.floats.empty());
  EXPECT_TRUE(array.integers.empty());
  // Any nonzero byte given to the writer is True.
  EXPECT_EQ(parse_npy(serialize_npy_bool(std::vector<uint8_t>{7, 0}, Shape{2}), "b").bools,
            (std::vector<uint8_t>{1, 0}));
  EXPECT_THROW_MESSAGE(serialize_npy_bool(std::vector<uint8_t>{1}, Shape{2}), ShapeError,
                       "shape (2,) needs 2 values, got 1");
}

TEST(Npy, BoolAtEveryRankAndEmpty) {
  for (const Shape& shape : {Shape{}, Shape{0}, Shape{4}, Shape{1, 2, 1, 3, 1}}) {
    std::vector<uint8_t> values(static_cast<size_t>(shape.numel()));
    for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<uint8_t>(i % 2);
    const NpyArray array = parse_npy(serialize_npy_bool(values, shape), "bools");
    EXPECT_EQ(array.shape, shape);
    EXPECT_EQ(array.bools, values) << shape.str();
  }
}

// NumPy only ever stores 0 and 1 in a bool array; any other byte means the data is something else
// under a bool header, so it is refused (naming the first offending index) rather than read as
// True.
TEST(NpyMalformed, BoolBytesOtherThanZeroOrOne) {
  const std::string dict = "{'descr': '|b1', 'fortran_order': False, 'shape': (2, 2), }";
  for (const uint8_t bad : {uint8_t{2}, uint8_t{255}}) {
    const std::vector<std::byte> data = {std::byte{1}, std::byte{0}, std::byte{0}, std::byte{bad}};
    EXPECT_THROW_MESSAGE(parse_npy(make_npy(dict, data), "bad_bool.npy"), FileError,
                         "bad_bool.npy: bool data must hold bytes 0 or 1 (False or True), got " +
                             std::to_string(bad) + " at flat index 3");
  }
  // A bool file's data is one byte per element, checked as for every dtype.
  EXPECT_THROW_MESSAGE(parse_npy(make_npy(dict, std::vector<std::byte>(8)), "wide.npy"), FileError,
                       "expected 4 bytes of data for shape (2, 2) of '|b1', got 8 bytes");
}

TEST(Npy, ReadsVersions2And3) {
  const std::vector<std::byte> data = value_bytes(std::vector<float>{1, 2, 3, 4, 5, 6});
  for (const int major : {2, 3}) {
    const NpyArray array = parse_npy(make_npy(kFloat32Dict, data, major), "v2/v3");
    EXPECT_EQ(array.shape, (Shape{2, 3}));
    EXPECT_EQ(array.floats, (std::vector<float>{1, 2, 3, 4, 5, 6}));
  }
}

TEST(Npy, AcceptsAnyKeyOrderQuotesAndPadding) {
  const std::vector<std::byte> data = value_bytes(std::vector<float>{1.5F, -1.0F});
  for (const std::string_view dict : {
           std::string_view("{'shape': (2,), 'fortran_order': False, 'descr': '<f4', }   \n"),
           std::string_view("{\"descr\": \"<f4\", \"fortran_order\": False, \"shape\": (2,)}"),
           std::string_view("{'fortran_order':False,'descr':'<f4','shape':(2 ,)}\n\n  \n"),
           std::string_view(
               " { 'descr' : '<f4' ,\n 'shape' : ( 2 , ) , 'fortran_order' : False } "),
       }) {
    const NpyArray array = parse_npy(make_npy(dict, data), "padded");
    EXPECT_EQ(array.shape, Shape{2}) << dict;
    EXPECT_EQ(array.floats, (std::vector<float>{1.5F, -1.0F})) << dict;
  }
}

// ---- Bytes as NumPy writes them.

TEST(Npy, HeaderMatchesNumPyByteForByte) {
  // np.save of a (2, 3) float32 array (NumPy 2.4): 1.0 header, 20 spaces of growth room after the
  // dictionary, padded so that the data starts at byte 128 (0x76 = 118 header bytes).
  const std::string expected_header =
      std::string("\x93NUMPY\x01\x00\x76\x00", 10) +
      "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }" + std::string(58, ' ') + "\n";
  ASSERT_EQ(expected_header.size(), 128U);
  const std::vector<std::byte> bytes = serialize_npy(Tensor(Shape{2, 3}));
  ASSERT_EQ(bytes.size(), 128U + 6 * sizeof(float));
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(bytes.data()), 128), expected_header);

  // np.save(np.int64(5).reshape(())): no growth room without a first axis.
  const std::string expected_scalar = std::string("\x93NUMPY\x01\x00\x76\x00", 10) +
                                      "{'descr': '<i8', 'fortran_order': False, 'shape': (), }" +
                                      std::string(62, ' ') + "\n";
  const std::vector<std::byte> scalar = serialize_npy(std::vector<int64_t>{5}, Shape{});
  ASSERT_EQ(scalar.size(), 128U + sizeof(int64_t));
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(scalar.data()), 128), expected_scalar);
}

TEST(Npy, WritesTheSameFilesAsNumPy) {
  const Tensor tensor(Shape{2, 3}, {-0.5F, -0.25F, 0.0F, 0.25F, 0.5F, 0.75F});
  EXPECT_EQ(serialize_npy(tensor), fixture_bytes("f4_2x3.npy"));
  EXPECT_EQ(serialize_npy(Tensor(Shape{0, 3})), fixture_bytes("f4_0x3.npy"));
  EXPECT_EQ(serialize_npy(std::vector<int64_t>{2, 6}, Shape{2}), fixture_bytes("i8_2.npy"));
  EXPECT_EQ(serialize_npy(std::vector<int64_t>{-7}, Shape{}), fixture_bytes("i8_scalar.npy"));
}

TEST(Npy, ReadsFilesNumPyWrote) {
  const NpyArray f4 = read_npy(fixture("f4_2x3.npy"));
  EXPECT_EQ(f4.shape, (Shape{2, 3}));
  EXPECT_EQ(f4.floats, (std::vector<float>{-0.5F, -0.25F, 0.0F, 0.25F, 0.5F, 0.75F}));

  const NpyArray f8 = read_npy(fixture("f8_3.npy"));
  EXPECT_EQ(f8.dtype, NpyDType::kFloat64);
  EXPECT_EQ(f8.floats, (std::vector<float>{0.1F, -2.5F, std::numeric_limits<float>::infinity()}));
  // load_npy_tensor decodes into the tensor's storage itself: the same values and shapes; an
  // input's float64 value past float's range is named there (Float64InputsPastFloatsRangeAreNamed).
  EXPECT_THROW_MESSAGE(load_npy_tensor(fixture("f8_3.npy"), "f8"), FileError,
                       "got 1e+300 at flat index 2");
  const Tensor f4_tensor = load_npy_tensor(fixture("f4_2x3.npy"), "f4");
  EXPECT_EQ(f4_tensor.shape(), f4.shape);
  EXPECT_EQ(f4_tensor.to_vector(), f4.floats);

  // float16: widened exactly, and its bits kept; written back byte for byte as NumPy wrote it.
  const NpyArray f2 = read_npy(fixture("f2_3.npy"));
  EXPECT_EQ(f2.dtype, NpyDType::kFloat16);
  EXPECT_EQ(f2.floats, (std::vector<float>{0.5F, -1.25F, 65504.0F}));
  EXPECT_EQ(f2.halves, (std::vector<uint16_t>{0x3800, 0xbd00, 0x7bff}));
  EXPECT_EQ(serialize_npy_float16(f2.halves, f2.shape), fixture_bytes("f2_3.npy"));
  EXPECT_EQ(load_npy_tensor(fixture("f2_3.npy"), "f2").to_vector(), f2.floats);
  EXPECT_THROW_MESSAGE(serialize_npy_float16(f2.halves, Shape{4}), ShapeError,
                       "shape (4,) needs 4 values, got 3");

  const NpyArray i4 = read_npy(fixture("i4_2x2.npy"));
  EXPECT_EQ(i4.dtype, NpyDType::kInt32);
  EXPECT_EQ(i4.integers, (std::vector<int64_t>{1, -2, 3, 2147483647}));

  const NpyArray scalar = read_npy(fixture("i8_scalar.npy"));
  EXPECT_EQ(scalar.shape.rank(), 0);
  EXPECT_EQ(scalar.integers, std::vector<int64_t>{-7});

  EXPECT_EQ(read_npy(fixture("f4_0x3.npy")).shape, (Shape{0, 3}));
  const NpyArray rank5 = read_npy(fixture("f4_rank5.npy"));  // ranks up to 8: (N, ..., H, L, E)
  EXPECT_EQ(rank5.shape, (Shape{1, 1, 1, 1, 2}));
  EXPECT_EQ(rank5.floats, (std::vector<float>{1.0F, 2.0F}));
  for (const std::string name : {"f4_v2.npy", "f4_v3.npy"}) {
    EXPECT_EQ(read_npy(fixture(name)).floats, (std::vector<float>{1.5F, -1.0F})) << name;
  }
}

// NumPy writes a transposed array (x.T, a permuted tensor's .numpy()) in Fortran order, first axis
// fastest: it was refused; it reads as the same array in C order.
TEST(Npy, FortranOrderReadsAsTheSameArray) {
  const NpyArray fixture_array = read_npy(fixture("f4_fortran.npy"));  // arange(6).reshape(2, 3)
  EXPECT_EQ(fixture_array.shape, (Shape{2, 3}));
  EXPECT_EQ(fixture_array.floats, (std::vector<float>{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(load_npy_tensor(fixture("f4_fortran.npy"), "q").span()[1], 1.0F);

  // Rank 4, extents 2, 3, 1, 4: element (i, j, 0, l) = 100i + 10j + l (exact in float16), stored
  // with i fastest; every dtype, through every reader.
  const Shape shape{2, 3, 1, 4};
  std::vector<double> c_order, fortran(24);
  for (int i = 0; i < 2; ++i) {
    for (int j = 0; j < 3; ++j) {
      for (int l = 0; l < 4; ++l) {
        const double value = 100 * i + 10 * j + l;
        c_order.push_back(value);
        fortran[static_cast<size_t>(i + 2 * j + 6 * l)] = value;
      }
    }
  }
  const std::string header = "'fortran_order': True, 'shape': (2, 3, 1, 4), }";
  const auto as = [&](auto type) {
    using T = decltype(type);
    std::vector<T> values(fortran.begin(), fortran.end());
    return value_bytes(values);
  };
  const NpyArray f8 = parse_npy(make_npy("{'descr': '<f8', " + header, as(double{})), "f8.npy");
  EXPECT_EQ(f8.shape, shape);
  EXPECT_EQ(f8.floats, std::vector<float>(c_order.begin(), c_order.end()));
  const NpyArray i4 = parse_npy(make_npy("{'descr': '<i4', " + header, as(int32_t{})), "i4.npy");
  EXPECT_EQ(i4.integers, std::vector<int64_t>(c_order.begin(), c_order.end()));

  const TempDirectory dir;
  const auto write = [&](const std::string& name, const std::string& descr,
                         const std::vector<std::byte>& data) {
    const std::vector<std::byte> bytes = make_npy("{'descr': '" + descr + "', " + header, data);
    std::ofstream(dir.path() / name, std::ios::binary)
        .write(reinterpret_cast<const char*>(bytes.data()),
               static_cast<std::streamsize>(bytes.size()));
    return dir.path() / name;
  };
  const Tensor f4 = load_npy_tensor(write("f4.npy", "<f4", as(float{})), "q");
  EXPECT_EQ(f4.shape(), shape);
  EXPECT_EQ(std::vector<float>(f4.span().begin(), f4.span().end()),
            std::vector<float>(c_order.begin(), c_order.end()));
  std::vector<uint16_t> half_bits;
  for (const double value : fortran) half_bits.push_back(float_to_half(static_cast<float>(value)));
  const auto f2 = write("f2.npy", "<f2", value_bytes(half_bits));
  const NpyFloat16 halves = load_npy_float16(f2, "q");
  const Tensor widened = load_npy_tensor(f2, "q");
  for (size_t e = 0; e < c_order.size(); ++e) {
    EXPECT_EQ(half_to_float(halves.bits[e]), c_order[e]) << e;
    EXPECT_EQ(widened.span()[e], c_order[e]) << e;
  }
  // A ring rank's rows of axis 1 (j = 2, then j = 0), as from the C-order file.
  const NpyRowRange ranges[] = {{2, 1}, {0, 1}};
  const NpyArray rows = read_npy_rows(write("rows.npy", "<f4", as(float{})), 1, ranges);
  EXPECT_EQ(rows.shape, (Shape{2, 2, 1, 4}));
  std::vector<float> expected;
  for (int i = 0; i < 2; ++i) {
    for (const int j : {2, 0}) {
      for (int l = 0; l < 4; ++l) expected.push_back(static_cast<float>(100 * i + 10 * j + l));
    }
  }
  EXPECT_EQ(rows.floats, expected);
}

// A float64 input value past float's range was rounded to ∞ and refused later as "got inf", a
// value the file never held: load_npy_tensor names the file's value; ±∞ stays (a mask's −∞ is
// meaningful), and read_npy (masks) keeps rounding.
TEST(Npy, Float64InputsPastFloatsRangeAreNamed) {
  const TempDirectory dir;
  const std::vector<double> values = {1.0, -std::numeric_limits<double>::infinity(), -1e300};
  const std::vector<std::byte> bytes =
      make_npy("{'descr': '<f8', 'fortran_order': False, 'shape': (3,), }", value_bytes(values));
  const std::filesystem::path file = dir.path() / "big.npy";
  std::ofstream(file, std::ios::binary)
      .write(reinterpret_cast<const char*>(bytes.data()),
             static_cast<std::streamsize>(bytes.size()));
  EXPECT_THROW_MESSAGE(load_npy_tensor(file, "queries"), FileError,
                       "queries (" + file.string() +
                           "): expected float64 values float32 holds (within ±3.4e38; attn "
                           "computes in float32), got -1e+300 at flat index 2");
  EXPECT_EQ(read_npy(file).floats[2], -std::numeric_limits<float>::infinity());
}

TEST(Npy, RejectsFilesNumPyWroteThatAttnCannotHold) {
  EXPECT_THROW_MESSAGE(read_npy(fixture("f4_big_endian.npy")), FileError,
                       "unsupported dtype '>f4'");
}

// ---- Malformed files: each must throw FileError naming the source and what was wrong.

TEST(NpyMalformed, TooShortOrBadMagicOrVersion) {
  EXPECT_THROW_MESSAGE(parse_npy({}, "empty.npy"), FileError,
                       "empty.npy: too short for a .npy file: expected at least 8 bytes, got 0");
  std::vector<std::byte> bytes = valid_float32_file();
  bytes[1] = std::byte{'X'};
  EXPECT_THROW_MESSAGE(parse_npy(bytes, "magic.npy"), FileError, "magic.npy: not a .npy file");

  for (const auto& [major, minor, text] : {std::tuple{0, 0, "0.0"}, std::tuple{4, 0, "4.0"},
                                           std::tuple{1, 1, "1.1"}, std::tuple{255, 0, "255.0"}}) {
    bytes = valid_float32_file();
    bytes[6] = static_cast<std::byte>(major);
    bytes[7] = static_cast<std::byte>(minor);
    EXPECT_THROW_MESSAGE(parse_npy(bytes, "version.npy"), FileError,
                         std::string("unsupported .npy version ") + text);
  }
}

TEST(NpyMalformed, HeaderLengthBeyondTheFile) {
  std::vector<std::byte> bytes = valid_float32_file();
  bytes[8] = std::byte{0xFF};
  bytes[9] = std::byte{0xFF};
  EXPECT_THROW_MESSAGE(parse_npy(bytes, "lying.npy"), FileError,
                       "header length field says 65535 bytes, but only");
  // Version 2.0 has 4 length bytes: a length of 4 GiB in a small file.
  bytes = make_npy(kFloat32Dict, {}, 2);
  for (size_t index = 8; index < 12; ++index) bytes[index] = std::byte{0xFF};
  EXPECT_THROW_MESSAGE(parse_npy(bytes, "lying2.npy"), FileError,
                       "header length field says 4294967295 bytes");
}

TEST(NpyMalformed, DataSizeMustMatchTheShapeExactly) {
  std::vector<std::byte> bytes = valid_float32_file();
  bytes.erase(bytes.end() - 4, bytes.end());  // (not resize: GCC 12 -O1 misreads it as a huge fill)
  EXPECT_THROW_MESSAGE(parse_npy(bytes, "short.npy"), FileError,
                       "short.npy: expected 24 bytes of data for shape (2, 3) of '<f4', got 20");
  bytes = valid_float32_file();
  bytes.push_back(std::byte{0});
  EXPECT_THROW_MESSAGE(parse_npy(bytes, "long.npy"), FileError,
                       "expected 24 bytes of data for shape (2, 3) of '<f4', got 25 bytes");
  // A huge shape that fits in 64 bits fails on the size check, before any allocation.
  EXPECT_THROW_MESSAGE(
      parse_npy(
          make_npy("{'descr': '<f8', 'fortran_order': False, 'shape': (1000000, 1000000), }", {}),
          "huge.npy"),
      FileError, "expected 8000000000000 bytes of data for shape (1000000, 1000000)");
}

TEST(NpyMalformed, ShapesWhoseSizeOverflows) {
  auto with_shape = [](const std::string& shape) {
    return make_npy("{'descr': '<f4', 'fortran_order': False, 'shape': " + shape + ", }", {});
  };
  // 2^62 · 4 elements overflow int64 before the item size does.
  EXPECT_THROW_MESSAGE(parse_npy(with_shape("(4611686018427387904, 4)"), "overflow.npy"), FileError,
                       "shape (4611686018427387904, 4) has too many elements for 64-bit sizes");
  // 2^61 elements fit, but not 2^61 · 4 bytes.
  EXPECT_THROW_MESSAGE(parse_npy(with_shape("(2305843009213693952,)"), "bytes.npy"), FileError,
                       "has too many elements");
  // A zero does not excuse the other dimensions: Shape::numel multiplies them in order.
  EXPECT_THROW_MESSAGE(
      parse_npy(with_shape("(4611686018427387904, 4611686018427387904, 0)"), "zero.npy"), FileError,
      "has too many elements");
  // 2^61 one-byte (bool) elements fit in int64 bytes but are more than a Shape counts
  // (Shape::kMaxElements).
  EXPECT_THROW_MESSAGE(
      parse_npy(
          make_npy("{'descr': '|b1', 'fortran_order': False, 'shape': (2305843009213693952,), }",
                   {}),
          "count.npy"),
      FileError, "shape (2305843009213693952,) has too many elements for 64-bit sizes");
  EXPECT_THROW_MESSAGE(parse_npy(with_shape("(99999999999999999999,)"), "digits.npy"), FileError,
                       "shape dimension 99999999999999999999 is too large for a 64-bit integer");
}

TEST(NpyMalformed, UnsupportedDtypes) {
  for (const std::string descr : {"'>f4'", "'>i8'", "'>f2'", "'|u1'", "'<b1'", "'b1'", "'f4'",
                                  "'=f4'", "'|f4'", "'<c8'", "'|O'", "'<U3'", "'float32'"}) {
    const std::string dict = "{'descr': " + descr + ", 'fortran_order': False, 'shape': (1,), }";
    EXPECT_THROW_MESSAGE(parse_npy(make_npy(dict, std::vector<std::byte>(4)), "dtype.npy"),
                         FileError, "dtype.npy: unsupported dtype " + descr);
  }
  EXPECT_THROW_MESSAGE(
      parse_npy(make_npy("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (1,), }",
                         std::vector<std::byte>(4)),
                "structured.npy"),
      FileError, "unsupported dtype: structured arrays");
}

TEST(NpyMalformed, FortranOrderOfTheWrongSizeAndRankAboveEight) {
  EXPECT_THROW_MESSAGE(
      parse_npy(make_npy("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }",
                         std::vector<std::byte>(20)),
                "fortran.npy"),
      FileError, "fortran.npy: expected 24 bytes of data for shape (2, 3) of '<f4', got 20 bytes");
  EXPECT_THROW_MESSAGE(
      parse_npy(
          make_npy(
              "{'descr': '<f4', 'fortran_order': False, 'shape': (1, 1, 1, 1, 1, 1, 1, 1, 1), }",
              std::vector<std::byte>(4)),
          "rank9.npy"),
      FileError,
      "rank9.npy: expected a rank of at most 8, got shape (1, 1, 1, 1, 1, 1, 1, 1, 1) (rank 9)");
}

TEST(NpyMalformed, GarbageDictionaries) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"", "expected '{', got the end of the header"},
      {"hello", "malformed header at character 0: expected '{'"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), ",
       "expected a quoted string, got the end of the header"},
      {"{'descr': '<f4', 'fortran_order': False}", "expected the keys 'descr', 'fortran_order'"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (6,), 'extra': 1}",
       "unexpected or repeated key 'extra'"},
      {"{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (6,)}",
       "unexpected or repeated key 'descr'"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (6)}", "a tuple such as (3,)"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': [6]}", "expected '('"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (-6,)}", "non-negative integer"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (6.0,)}", "expected ')'"},
      {"{'descr': '<f4', 'fortran_order': 0, 'shape': (6,)}", "True or False"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (6,)} junk",
       "expected the end of the header after '}'"},
      {"{'descr': '<f4, 'fortran_order': False, 'shape': (6,)}", "expected '}'"},
      {"{'descr': '<f4", "expected a closing quote"},
      {"{'descr': '<\\x66', 'fortran_order': False, 'shape': (6,)}", "without escape sequences"},
      {"{descr: '<f4', 'fortran_order': False, 'shape': (6,)}", "expected a quoted string"},
      {std::string("{'descr'\0: '<f4'}", 16), "expected ':'"},
  };
  for (const auto& [dict, message] : cases) {
    EXPECT_THROW_MESSAGE(parse_npy(make_npy(dict, std::vector<std::byte>(24)), "dict.npy"),
                         FileError, message);
  }
  EXPECT_THROW_MESSAGE(parse_npy(make_npy("{}", {}), "keys.npy"), FileError,
                       "keys.npy: malformed header: expected the keys");
}

TEST(NpyMalformed, EveryTruncationThrowsFileError) {
  const std::vector<std::byte> bytes = serialize_npy(Tensor::full(Shape{2, 3}, 1.5F));
  ASSERT_NO_THROW(parse_npy(bytes, "whole.npy"));
  for (size_t length = 0; length < bytes.size(); ++length) {
    EXPECT_THROW(parse_npy(std::span(bytes).first(length), "cut.npy"), FileError)
        << "truncated at " << length;
  }
}

// ---- Files on disk.

TEST(NpyFiles, SaveThenLoad) {
  const TempDirectory directory;
  const Tensor tensor(Shape{2, 2}, {1.0F, -2.0F, 3.5F, 0.0F});
  save_npy(directory.path() / "t.npy", tensor);
  const Tensor loaded = load_npy_tensor(directory.path() / "t.npy", "queries");
  EXPECT_EQ(loaded.shape(), tensor.shape());
  EXPECT_EQ(loaded.values(), tensor.values());

  const std::vector<int64_t> lengths = {2, 3};
  save_npy(directory.path() / "lens.npy", lengths, Shape{2});
  const ValidLengths valid = load_npy_valid_lengths(directory.path() / "lens.npy", "valid_lens");
  EXPECT_EQ(valid.kind(), ValidLengths::Kind::kPerBatch);
  EXPECT_EQ(valid.values(), lengths);
}

// The save functions write their header, then the data from where it lies (no joined copy): the
// same bytes as the serialize functions, byte for byte, for each dtype, empty data included; a
// count that does not fill the shape writes nothing.
TEST(NpyFiles, SavedFilesHoldTheSerializedBytes) {
  const TempDirectory directory;
  const auto saved = [&directory](const char* name) { return read_file(directory.path() / name); };
  const Tensor tensor(Shape{3, 1, 2}, {1.0F, -2.0F, 3.5F, 0.0F, 1e-30F, -7.25F});
  save_npy(directory.path() / "f4.npy", tensor);
  EXPECT_EQ(saved("f4.npy"), serialize_npy(tensor));
  const Tensor empty(Shape{0, 4});
  save_npy(directory.path() / "empty.npy", empty);
  EXPECT_EQ(saved("empty.npy"), serialize_npy(empty));
  const std::vector<int64_t> lengths = {2, -3, 1LL << 40};
  save_npy(directory.path() / "i8.npy", lengths, Shape{3, 1});
  EXPECT_EQ(saved("i8.npy"), serialize_npy(lengths, Shape{3, 1}));
  const std::vector<uint16_t> halves = {0x3800, 0xbd00, 0x7bff, 0x0001};
  save_npy_float16(directory.path() / "f2.npy", halves, Shape{2, 2});
  EXPECT_EQ(saved("f2.npy"), serialize_npy_float16(halves, Shape{2, 2}));
  EXPECT_THROW_MESSAGE(save_npy(directory.path() / "bad.npy", lengths, Shape{4}), ShapeError,
                       "save_npy: shape (4,) needs 4 values, got 3");
  EXPECT_THROW_MESSAGE(save_npy_float16(directory.path() / "bad.npy", halves, Shape{5}), ShapeError,
                       "save_npy_float16: shape (5,) needs 5 values, got 4");
  EXPECT_FALSE(std::filesystem::exists(directory.path() / "bad.npy"));
}

// A float16 file's bits and shape, read as they are; any other dtype is a FileError naming the
// argument; load_npy_tensor widens the same file to the same values read_npy gives.
TEST(NpyFiles, Float16BitsAsTheyAre) {
  const TempDirectory directory;
  const std::vector<uint16_t> halves = {0x3800, 0xbd00, 0x7bff, 0x0001, 0x8000, 0x3c00};
  save_npy_float16(directory.path() / "f2.npy", halves, Shape{2, 1, 3});
  const NpyFloat16 file = load_npy_float16(directory.path() / "f2.npy", "queries");
  EXPECT_EQ(file.shape, (Shape{2, 1, 3}));
  EXPECT_EQ(file.bits, halves);
  EXPECT_EQ(load_npy_tensor(directory.path() / "f2.npy", "queries").to_vector(),
            read_npy(directory.path() / "f2.npy").floats);
  save_npy(directory.path() / "f4.npy", Tensor(Shape{2}, {1.0F, 2.0F}));
  EXPECT_THROW_MESSAGE(load_npy_float16(directory.path() / "f4.npy", "keys"), FileError, "keys (");
  EXPECT_THROW_MESSAGE(load_npy_float16(directory.path() / "f4.npy", "keys"), FileError,
                       "expected float16 data, got dtype '<f4'");
}

TEST(NpyFiles, ValidLengthsFromNumPyFiles) {
  const ValidLengths per_batch = load_npy_valid_lengths(fixture("i8_2.npy"), "valid_lens");
  EXPECT_EQ(per_batch.kind(), ValidLengths::Kind::kPerBatch);
  EXPECT_EQ(per_batch.values(), (std::vector<int64_t>{2, 6}));

  const ValidLengths per_query = load_npy_valid_lengths(fixture("i4_2x2.npy"), "valid_lens");
  EXPECT_EQ(per_query.kind(), ValidLengths::Kind::kPerQuery);
  EXPECT_EQ(per_query.shape(), (Shape{2, 2}));
  EXPECT_EQ(per_query.values(), (std::vector<int64_t>{1, -2, 3, 2147483647}));
}

TEST(NpyFiles, WrongKindsOfDataNameTheArgument) {
  EXPECT_THROW_MESSAGE(load_npy_tensor(fixture("i8_2.npy"), "queries"), FileError,
                       "queries (" + fixture("i8_2.npy").string() +
                           "): expected float32, float64 or float16 data, got integer dtype '<i8'");
  EXPECT_THROW_MESSAGE(load_npy_valid_lengths(fixture("f4_2x3.npy"), "valid_lens"), FileError,
                       "valid_lens (" + fixture("f4_2x3.npy").string() +
                           "): expected int32 or int64 valid lengths, got dtype '<f4'");
  const TempDirectory bools;
  save_npy_bool(bools.path() / "mask.npy", std::vector<uint8_t>{1, 0}, Shape{2});
  EXPECT_THROW_MESSAGE(load_npy_tensor(bools.path() / "mask.npy", "queries"), FileError,
                       "): expected float32, float64 or float16 data, got bool dtype '|b1'");
  EXPECT_THROW_MESSAGE(load_npy_valid_lengths(bools.path() / "mask.npy", "valid_lens"), FileError,
                       "expected int32 or int64 valid lengths, got dtype '|b1'");
  EXPECT_EQ(read_npy(bools.path() / "mask.npy").bools, (std::vector<uint8_t>{1, 0}));
  EXPECT_THROW_MESSAGE(load_npy_valid_lengths(fixture("i8_scalar.npy"), "valid_lens"), ShapeError,
                       "valid_lens (" + fixture("i8_scalar.npy").string() +
                           "): expected valid lengths of shape (B,) or (B, n), got shape ()");

  const TempDirectory directory;
  save_npy(directory.path() / "rank3.npy", std::vector<int64_t>{1, 1}, Shape{1, 1, 2});
  EXPECT_THROW_MESSAGE(load_npy_valid_lengths(directory.path() / "rank3.npy", "lens"), ShapeError,
                       "lens (");
}

TEST(NpyFiles, MissingOrUnreadableFilesNameThePath) {
  const TempDirectory directory;
  const std::filesystem::path missing = directory.path() / "missing.npy";
  EXPECT_THROW_MESSAGE(read_npy(missing), FileError, missing.string() + ": cannot read the file");
  EXPECT_THROW_MESSAGE(load_npy_tensor(missing, "keys"), FileError, missing.string());
  EXPECT_THROW_MESSAGE(read_npy(directory.path()), FileError,
                       directory.path().string() + ": cannot read the file");
  const std::filesystem::path nowhere = directory.path() / "no_such_dir" / "out.npy";
  EXPECT_THROW_MESSAGE(save_npy(nowhere, Tensor(Shape{1})), FileError,
                       nowhere.string() + ": cannot write the file");
}

}  // namespace
}  // namespace attn
