// Tests of the safetensors reader and writer: round trips, the reference implementation's exact
// bytes, a file safetensors.torch wrote (tests/fixtures/io), and malformed headers of every kind.
#include "attn/io/safetensors.hpp"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <span>
#include <string>
#include <vector>

#include "attn/core/error.hpp"
#include "test_support.hpp"

namespace attn {
namespace {

std::vector<std::byte> text_bytes(std::string_view text) {
  std::vector<std::byte> bytes;
  for (const char c : text) bytes.push_back(static_cast<std::byte>(c));
  return bytes;
}

// A safetensors file: the 8-byte little-endian length of `header`, `header`, then `data_size`
// bytes of data (each byte its index, so that tensors read distinct values).
std::vector<std::byte> make_safetensors(std::string_view header, size_t data_size,
                                        uint64_t header_size_field) {
  std::vector<std::byte> bytes(8);
  for (size_t index = 0; index < 8; ++index) {
    bytes[index] = static_cast<std::byte>((header_size_field >> (8 * index)) & 0xFF);
  }
  const std::vector<std::byte> text = text_bytes(header);
  bytes.insert(bytes.end(), text.begin(), text.end());
  for (size_t index = 0; index < data_size; ++index) {
    bytes.push_back(static_cast<std::byte>(index));
  }
  return bytes;
}

std::vector<std::byte> make_safetensors(std::string_view header, size_t data_size) {
  return make_safetensors(header, data_size, header.size());
}

std::string header_of(const std::vector<std::byte>& bytes) {
  uint64_t size = 0;
  std::memcpy(&size, bytes.data(), 8);
  return std::string(reinterpret_cast<const char*>(bytes.data()) + 8, static_cast<size_t>(size));
}

std::filesystem::path fixture(const std::string& name) {
  return std::filesystem::path(ATTN_FIXTURES_DIR) / "io" / name;
}

// A fresh directory for the current test, removed afterwards; the pid keeps concurrent runs of
// the suite (e.g. a sanitizer build) apart.
class TempDirectory {
 public:
  TempDirectory() {
    const std::string test = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    path_ = std::filesystem::temp_directory_path() /
            ("attn_safetensors_" + test + "_" + std::to_string(::getpid()));
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

// One F32 tensor of shape `shape` over `offsets`, named `name`, as a header entry.
std::string entry(std::string_view name, std::string_view shape, std::string_view offsets,
                  std::string_view dtype = "F32") {
  return "\"" + std::string(name) + "\":{\"dtype\":\"" + std::string(dtype) +
         "\",\"shape\":" + std::string(shape) + ",\"data_offsets\":" + std::string(offsets) + "}";
}

// ---- Round trips. Values are compared exactly: float32 data is copied byte for byte.

TEST(Safetensors, RoundTripsEveryRankAndEmptyTensors) {
  Rng rng(11);
  StateDict tensors;
  tensors.emplace("scalar", testing::random_tensor(Shape{}, rng));
  tensors.emplace("W_q.weight", testing::random_tensor(Shape{4, 3}, rng));
  tensors.emplace("bias", testing::random_tensor(Shape{5}, rng));
  tensors.emplace("cube", testing::random_tensor(Shape{2, 1, 3}, rng));
  tensors.emplace("rank4", testing::random_tensor(Shape{1, 2, 2, 3}, rng));
  tensors.emplace("empty", Tensor(Shape{0, 3}));
  const StateDict loaded =
      parse_safetensors(serialize_safetensors(tensors, {{"format", "pt"}}), "round trip");
  ASSERT_EQ(loaded.size(), tensors.size());
  for (const auto& [name, tensor] : tensors) {
    ASSERT_EQ(loaded.count(name), 1U) << name;
    EXPECT_EQ(loaded.at(name).shape(), tensor.shape()) << name;
    EXPECT_EQ(loaded.at(name).values(), tensor.values()) << name;
  }
  EXPECT_TRUE(parse_safetensors(serialize_safetensors({}), "empty").empty());
}

// ---- Bytes as the reference implementation (safetensors 0.8, Rust) writes them.

TEST(Safetensors, WritesTheReferenceBytes) {
  // safetensors.torch.save({'b': torch.ones(2), 'W_q.weight': torch.zeros(1, 2),
  //   'scalar': torch.tensor(3.0), 'empty': torch.zeros(0, 3)}, metadata={'format': 'pt'})
  StateDict tensors;
  tensors.emplace("b", Tensor::full(Shape{2}, 1.0F));
  tensors.emplace("W_q.weight", Tensor(Shape{1, 2}));
  tensors.emplace("scalar", Tensor(Shape{}, {3.0F}));
  tensors.emplace("empty", Tensor(Shape{0, 3}));
  const std::vector<std::byte> bytes = serialize_safetensors(tensors, {{"format", "pt"}});
  const std::string expected_header =
      R"({"__metadata__":{"format":"pt"},)"
      R"("W_q.weight":{"dtype":"F32","shape":[1,2],"data_offsets":[0,8]},)"
      R"("b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]},)"
      R"("empty":{"dtype":"F32","shape":[0,3],"data_offsets":[16,16]},)"
      R"("scalar":{"dtype":"F32","shape":[],"data_offsets":[16,20]}})"
      "  ";  // spaces up to a multiple of 8 bytes
  ASSERT_EQ(bytes.size(), 300U);
  EXPECT_EQ(std::to_integer<int>(bytes[0]), 0x10);  // header length 272 = 0x110
  EXPECT_EQ(std::to_integer<int>(bytes[1]), 0x01);
  EXPECT_EQ(header_of(bytes), expected_header);
  const std::vector<float> data = {0, 0, 1, 1, 3};
  EXPECT_EQ(std::memcmp(bytes.data() + 280, data.data(), 20), 0);

  // safetensors.torch.save({}): "{}" and six spaces.
  EXPECT_EQ(serialize_safetensors({}), make_safetensors("{}      ", 0));
}

TEST(Safetensors, ReadsAFileSafetensorsTorchWrote) {
  // Its header lists the F64 tensor first and its data first too, apart from name order.
  const StateDict loaded = load_safetensors(fixture("params.safetensors"));
  ASSERT_EQ(loaded.size(), 3U);
  EXPECT_EQ(loaded.at("W_q.weight").shape(), (Shape{2, 3}));
  EXPECT_EQ(loaded.at("W_q.weight").to_vector(),
            (std::vector<float>{-2.5F, -1.5F, -0.5F, 0.5F, 1.5F, 2.5F}));
  EXPECT_EQ(loaded.at("bias").to_vector(), (std::vector<float>{0.25F, -4.0F}));
  EXPECT_EQ(loaded.at("scale").shape().rank(), 0);
  EXPECT_EQ(loaded.at("scale").to_vector(), std::vector<float>{0.1F});  // F64 rounded to float32

  // PyTorch's half-precision state dicts: widened to float32 exactly.
  EXPECT_EQ(load_safetensors(fixture("f16.safetensors")).at("half").to_vector(),
            (std::vector<float>{1.0F, 2.0F}));
  EXPECT_EQ(load_safetensors(fixture("bf16.safetensors")).at("half").to_vector(),
            (std::vector<float>{1.5F, -2.0F, 3.140625F}));
}

// An F64 tensor 'z' {0.1, −3.0} listed before an F32 scalar 'a' 7.5, not in name order.
std::vector<std::byte> f64_then_f32() {
  const std::vector<double> doubles = {0.1, -3.0};
  const std::vector<float> floats = {7.5F};
  const std::string header =
      "{" + entry("z", "[2]", "[0,16]", "F64") + "," + entry("a", "[]", "[16,20]") + "}";
  std::vector<std::byte> bytes = make_safetensors(header, 0);
  const auto* double_bytes = reinterpret_cast<const std::byte*>(doubles.data());
  const auto* float_bytes = reinterpret_cast<const std::byte*>(floats.data());
  bytes.insert(bytes.end(), double_bytes, double_bytes + 16);
  bytes.insert(bytes.end(), float_bytes, float_bytes + 4);
  return bytes;
}

TEST(Safetensors, ReadsF64AndOffsetsInAnyOrder) {
  const StateDict loaded = parse_safetensors(f64_then_f32(), "mixed");
  EXPECT_EQ(loaded.at("z").to_vector(), (std::vector<float>{0.1F, -3.0F}));
  EXPECT_EQ(loaded.at("a").to_vector(), std::vector<float>{7.5F});
}

// An F64 value past float's range became ∞ without a word (the next call named the parameter,
// not the file): refused, naming the file and the tensor, by both readers; ±∞ and NaN stay, for
// the checks of their use, and float's largest rounds to itself.
TEST(Safetensors, F64ValuesPastFloatsRangeAreNamed) {
  const std::vector<double> doubles = {1.0, 3.4028234663852886e38,
                                       -std::numeric_limits<double>::infinity(), 1e300};
  const std::string header = "{" + entry("W.weight", "[2,2]", "[0,32]", "F64") + "}";
  std::vector<std::byte> bytes = make_safetensors(header, 0);
  const auto* double_bytes = reinterpret_cast<const std::byte*>(doubles.data());
  bytes.insert(bytes.end(), double_bytes, double_bytes + 32);
  const std::string message =
      "big.safetensors: tensor 'W.weight': expected F64 values float32 holds (within ±3.4e38; "
      "attn computes in float32), got 1e+300 at flat index 3";
  EXPECT_THROW_MESSAGE(parse_safetensors(bytes, "big.safetensors"), FileError, message);
  const TempDirectory directory;
  const std::filesystem::path file = directory.path() / "big.safetensors";
  std::ofstream(file, std::ios::binary)
      .write(reinterpret_cast<const char*>(bytes.data()),
             static_cast<std::streamsize>(bytes.size()));
  EXPECT_THROW_MESSAGE(load_safetensors_tensor(file, "W.weight"), FileError,
                       "tensor 'W.weight': expected F64 values float32 holds");
  std::memcpy(bytes.data() + bytes.size() - 8, &doubles[0], 8);  // 1.0 in place of 1e300
  const std::vector<float> loaded =
      parse_safetensors(bytes, "big.safetensors").at("W.weight").to_vector();
  EXPECT_EQ(loaded[1], std::numeric_limits<float>::max());
  EXPECT_EQ(loaded[2], -std::numeric_limits<float>::infinity());
}

TEST(Safetensors, WritingRejectsNamesItCannotStore) {
  StateDict reserved;
  reserved.emplace("__metadata__", Tensor(Shape{1}));
  EXPECT_THROW_MESSAGE(serialize_safetensors(reserved), ValueError, "'__metadata__' is reserved");
  StateDict bad_utf8;
  bad_utf8.emplace("caf\xE9", Tensor(Shape{1}));
  EXPECT_THROW_MESSAGE(serialize_safetensors(bad_utf8), ValueError, "must be valid UTF-8");
}

// ---- Malformed files: each must throw FileError naming the source (and the tensor) and what
// was wrong.

TEST(SafetensorsMalformed, HeaderLength) {
  EXPECT_THROW_MESSAGE(parse_safetensors(text_bytes("1234"), "short.st"), FileError,
                       "short.st: too short for a safetensors file: expected at least 8 bytes, "
                       "got 4");
  EXPECT_THROW_MESSAGE(parse_safetensors(make_safetensors("{}", 0, 3), "lying.st"), FileError,
                       "lying.st: header length 3 is larger than the 2 bytes after it");
  EXPECT_THROW_MESSAGE(parse_safetensors(make_safetensors("{}", 0, uint64_t{1} << 63), "huge.st"),
                       FileError, "header length 9223372036854775808 exceeds the limit");
}

TEST(SafetensorsMalformed, HeaderIsNotAJsonObject) {
  for (const std::string_view header :
       {"{\"a\":", "not json", "", "{\"a\":1,}", "{\"caf\xE9\":1}"}) {
    EXPECT_THROW_MESSAGE(parse_safetensors(make_safetensors(header, 0), "json.st"), FileError,
                         "json.st: header is not valid JSON");
  }
  for (const auto& [header, type] : {std::pair{"[1, 2]", "array"}, std::pair{"\"text\"", "string"},
                                     std::pair{"3", "number"}, std::pair{"null", "null"}}) {
    EXPECT_THROW_MESSAGE(parse_safetensors(make_safetensors(header, 0), "array.st"), FileError,
                         std::string("expected the header to be a JSON object, got ") + type);
  }
  // Deep nesting must neither overflow the stack nor be mistaken for a header: refused at the
  // 65th level, before the parser builds more.
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  EXPECT_THROW_MESSAGE(parse_safetensors(make_safetensors(deep, 0), "deep.st"), FileError,
                       "deep.st: header nests arrays and objects deeper than 64 levels");
}

TEST(SafetensorsMalformed, EntriesOfTheWrongForm) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"w":3})", "tensor 'w': expected an object with 'dtype', 'shape' and 'data_offsets'"},
      {R"({"w":{"shape":[1],"data_offsets":[0,4]}})", "tensor 'w': missing field 'dtype'"},
      {R"({"w":{"dtype":"F32","data_offsets":[0,4]}})", "tensor 'w': missing field 'shape'"},
      {R"({"w":{"dtype":"F32","shape":[1]}})", "tensor 'w': missing field 'data_offsets'"},
      {R"({"w":{"dtype":32,"shape":[1],"data_offsets":[0,4]}})",
       "tensor 'w': expected 'dtype' to be a string, got 32"},
      {R"({"w":{"dtype":"F32","shape":"1","data_offsets":[0,4]}})",
       "tensor 'w': expected 'shape' to be an array, got \"1\""},
      {R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})",
       "tensor 'w': expected every dimension of 'shape' to be a non-negative 64-bit integer, got "
       "-1"},
      {R"({"w":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}})", "integer, got 1.5"},
      {R"({"w":{"dtype":"F32","shape":[true],"data_offsets":[0,4]}})", "integer, got true"},
      {R"({"w":{"dtype":"F32","shape":[9223372036854775808],"data_offsets":[0,4]}})",
       "integer, got 9223372036854775808"},
      {R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0]}})",
       "tensor 'w': expected 'data_offsets' to be an array [begin, end], got [0]"},
      {R"({"w":{"dtype":"F32","shape":[1],"data_offsets":{"a":0}}})",
       "expected 'data_offsets' to be an array [begin, end]"},
      {R"({"w":{"dtype":"F32","shape":[1],"data_offsets":["0","4"]}})",
       "expected 'data_offsets' to be a non-negative 64-bit integer, got \"0\""},
      {R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,-4]}})", "got -4"},
      {R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,1e30]}})", "got 1e+30"},
      {R"({"__metadata__":{"format":1}})", "expected '__metadata__' to map strings to strings"},
      {R"({"__metadata__":"pt"})", "expected '__metadata__' to map strings to strings"},
      {R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
       R"("w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})",
       "header repeats the key 'w'"},
      {R"({"w":{"dtype":"F32","dtype":"F64","shape":[1],"data_offsets":[0,4]}})",
       "header repeats the key 'dtype'"},
  };
  for (const auto& [header, message] : cases) {
    EXPECT_THROW_MESSAGE(parse_safetensors(make_safetensors(header, 4), "form.st"), FileError,
                         message);
  }
  EXPECT_THROW_MESSAGE(parse_safetensors(make_safetensors(R"({"w":3})", 4), "form.st"), FileError,
                       "form.st: tensor 'w': expected an object");
}

TEST(SafetensorsMalformed, RankAndSizes) {
  // A hostile header does not make a huge message: JSON values are quoted only in part.
  std::string long_shape = "[1";
  for (int axis = 0; axis < 10000; ++axis) long_shape += ",1";
  try {
    parse_safetensors(make_safetensors("{" + entry("w", long_shape + "]", "[0,4]") + "}", 4),
                      "long.st");
    ADD_FAILURE() << "expected FileError";
  } catch (const FileError& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("expected a rank of at most 8, got shape [1,1,1,"), std::string::npos);
    EXPECT_LT(message.size(), 200U) << message;
  }
  EXPECT_THROW_MESSAGE(
      parse_safetensors(make_safetensors("{" + entry("w", "[1,1,1,1,1,1,1,1,1]", "[0,4]") + "}", 4),
                        "r.st"),
      FileError, "r.st: tensor 'w': expected a rank of at most 8, got shape [1,1,1,1,1,1,1,1,1]");
  EXPECT_THROW_MESSAGE(
      parse_safetensors(
          make_safetensors("{" + entry("w", "[4611686018427387904,4,4]", "[0,4]") + "}", 4),
          "overflow.st"),
      FileError, "tensor 'w': shape [4611686018427387904,4,4] has too many elements");
  // A zero does not excuse the other dimensions: Shape::numel multiplies them in order.
  EXPECT_THROW_MESSAGE(
      parse_safetensors(
          make_safetensors(
              "{" + entry("w", "[4611686018427387904,4611686018427387904,0]", "[0,0]") + "}", 0),
          "zero.st"),
      FileError, "has too many elements");
  // 2^60 elements fit in a Shape but 2^60 · 8 bytes do not fit in int64; the check must not
  // overflow either.
  EXPECT_THROW_MESSAGE(
      parse_safetensors(
          make_safetensors("{" + entry("w", "[1152921504606846976]", "[0,8]", "F64") + "}", 8),
          "bytes.st"),
      FileError,
      "tensor 'w': shape (1152921504606846976,) of F64 needs 1152921504606846976 elements of 8 "
      "bytes, but data_offsets span 8 bytes");
  // 2^61 elements are more than a Shape counts (Shape::kMaxElements): refused as the header's.
  EXPECT_THROW_MESSAGE(
      parse_safetensors(
          make_safetensors("{" + entry("w", "[2305843009213693952]", "[0,2]", "BF16") + "}", 2),
          "count.st"),
      FileError, "tensor 'w': shape [2305843009213693952] has too many elements");
  EXPECT_THROW_MESSAGE(
      parse_safetensors(make_safetensors("{" + entry("w", "[2]", "[0,4]") + "}", 4), "numel.st"),
      FileError,
      "tensor 'w': shape (2,) of F32 needs 2 elements of 4 bytes, but data_offsets "
      "span 4 bytes");
  EXPECT_THROW_MESSAGE(
      parse_safetensors(make_safetensors("{" + entry("w", "[1]", "[0,6]") + "}", 6), "odd.st"),
      FileError, "needs 1 elements of 4 bytes, but data_offsets span 6 bytes");
}

TEST(SafetensorsMalformed, UnsupportedDtypesNameTheTensor) {
  // Dtypes the format names, each its own size, and names it does not (checked first).
  for (const auto& [dtype, bytes] : {std::pair<std::string, int>{"I64", 8},
                                     {"I32", 4},
                                     {"U8", 1},
                                     {"BOOL", 1},
                                     {"F8_E4M3", 1},
                                     {"f32", 4},
                                     {"bf16", 2}}) {
    const std::string offsets = "[0," + std::to_string(bytes) + "]";
    EXPECT_THROW_MESSAGE(
        parse_safetensors(make_safetensors("{" + entry("layer.w", "[1]", offsets, dtype) + "}",
                                           static_cast<size_t>(bytes)),
                          "dtype.st"),
        FileError, "dtype.st: tensor 'layer.w': unsupported dtype '" + dtype + "'");
  }
}

// A file name of up to 255 bytes, the most one may have, is written: the temporary beside it
// (".NAME.attn-PID-N.tmp") went past that limit from 236 bytes on ("File name too long").
TEST(SafetensorsFiles, TheLongestFileNamesAreWritten) {
  const TempDirectory directory;
  for (const size_t length : {size_t{200}, size_t{236}, size_t{255}}) {
    const std::filesystem::path file = directory.path() / std::string(length, 'n');
    save_safetensors(file, {{"x", Tensor::full(Shape{2}, 1.5F)}});
    EXPECT_EQ(load_safetensors(file).at("x").to_vector(), (std::vector<float>{1.5F, 1.5F}));
  }
  size_t entries = 0;
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator(directory.path()))
    ++entries;
  EXPECT_EQ(entries, 3U);  // no temporary left behind
}

// A float tensor chosen from a file that also holds tensors attn does not read (a tokenizer's I64
// ids, a BOOL attention mask, as transformers' files hold them): `attn run FILE:q` refused the
// whole file ("tensor 'attention_mask': unsupported dtype 'BOOL'"). Their byte ranges are still
// checked; choosing one of them names its dtype.
TEST(SafetensorsFiles, AFloatTensorIsChosenBesideOthersOfAnyDtype) {
  const TempDirectory directory;
  const std::vector<std::byte> bytes = make_safetensors(
      "{" + entry("attention_mask", "[3]", "[0,3]", "BOOL") + "," +
          entry("input_ids", "[1]", "[3,11]", "I64") + "," + entry("q", "[2]", "[11,19]") + "}",
      19);
  const std::filesystem::path file = directory.path() / "mixed.safetensors";
  std::ofstream(file, std::ios::binary)
      .write(reinterpret_cast<const char*>(bytes.data()),
             static_cast<std::streamsize>(bytes.size()));
  const SafetensorsTensor q = load_safetensors_tensor(file, "q");
  EXPECT_EQ(q.shape, Shape{2});
  std::vector<float> expected(2);
  std::memcpy(expected.data(), bytes.data() + bytes.size() - 8, 8);
  EXPECT_EQ(q.floats.to_vector(), expected);
  EXPECT_THROW_MESSAGE(load_safetensors_tensor(file, "attention_mask"), FileError,
                       "tensor 'attention_mask': unsupported dtype 'BOOL'");
  EXPECT_THROW_MESSAGE(load_safetensors(file), FileError,
                       "tensor 'attention_mask': unsupported dtype 'BOOL'");
  EXPECT_TRUE(load_safetensors_metadata(file).empty());
  // A range that does not fit its dtype is refused whichever tensor is chosen.
  const std::vector<std::byte> short_ids = make_safetensors(
      "{" + entry("input_ids", "[1]", "[0,4]", "I64") + "," + entry("q", "[1]", "[4,8]") + "}", 8);
  EXPECT_THROW_MESSAGE(parse_safetensors(short_ids, "ids.st"), FileError,
                       "tensor 'input_ids': shape (1,) of I64 needs 1 elements of 8 bytes");
}

TEST(SafetensorsMalformed, OffsetsThatDoNotTileTheData) {
  EXPECT_THROW_MESSAGE(
      parse_safetensors(make_safetensors("{" + entry("w", "[1]", "[4,0]") + "}", 4), "rev.st"),
      FileError, "rev.st: tensor 'w': data_offsets [4, 0] end before they begin");
  EXPECT_THROW_MESSAGE(
      parse_safetensors(make_safetensors("{" + entry("w", "[2]", "[0,8]") + "}", 4), "past.st"),
      FileError, "tensor 'w': data_offsets end at byte 8, past the end of the 4-byte data buffer");
  EXPECT_THROW_MESSAGE(
      parse_safetensors(
          make_safetensors(
              "{" + entry("w", "[1]", "[18446744073709551612,18446744073709551616]") + "}", 4),
          "wrap.st"),
      FileError, "tensor 'w': expected 'data_offsets' to be a non-negative 64-bit integer");
  EXPECT_THROW_MESSAGE(
      parse_safetensors(
          make_safetensors(
              "{" + entry("a", "[2]", "[0,8]") + "," + entry("b", "[2]", "[4,12]") + "}", 12),
          "overlap.st"),
      FileError, "tensor 'b': data_offsets begin at byte 4, overlapping 'a' which ends at byte 8");
  EXPECT_THROW_MESSAGE(parse_safetensors(make_safetensors("{" + entry("a", "[1]", "[0,4]") + "," +
                                                              entry("b", "[1]", "[0,4]") + "}",
                                                          4),
                                         "same.st"),
                       FileError, "overlapping 'a'");
  EXPECT_THROW_MESSAGE(
      parse_safetensors(
          make_safetensors(
              "{" + entry("a", "[1]", "[0,4]") + "," + entry("b", "[1]", "[8,12]") + "}", 12),
          "gap.st"),
      FileError, "tensor 'b': data_offsets begin at byte 8, leaving a gap after 'a' at byte 4");
  EXPECT_THROW_MESSAGE(
      parse_safetensors(make_safetensors("{" + entry("a", "[1]", "[4,8]") + "}", 8), "start.st"),
      FileError, "leaving a gap after the start of the data at byte 0");
  EXPECT_THROW_MESSAGE(
      parse_safetensors(make_safetensors("{" + entry("a", "[1]", "[0,4]") + "}", 8), "tail.st"),
      FileError, "tail.st: the tensors cover 4 bytes of the 8-byte data buffer");
}

TEST(SafetensorsMalformed, EveryTruncationThrowsFileError) {
  StateDict tensors;
  tensors.emplace("a", Tensor::full(Shape{2, 2}, 0.5F));
  tensors.emplace("b", Tensor(Shape{3}));
  const std::vector<std::byte> bytes = serialize_safetensors(tensors, {{"k", "v"}});
  ASSERT_NO_THROW(parse_safetensors(bytes, "whole.st"));
  for (size_t length = 0; length < bytes.size(); ++length) {
    EXPECT_THROW(parse_safetensors(std::span(bytes).first(length), "cut.st"), FileError)
        << "truncated at " << length;
  }
}

// ---- Files on disk.

TEST(SafetensorsFiles, SaveThenLoad) {
  const TempDirectory directory;
  StateDict tensors;
  tensors.emplace("w", Tensor(Shape{1, 2}, {1.0F, -1.0F}));
  save_safetensors(directory.path() / "p.safetensors", tensors, {{"format", "pt"}});
  const StateDict loaded = load_safetensors(directory.path() / "p.safetensors");
  ASSERT_EQ(loaded.count("w"), 1U);
  EXPECT_EQ(loaded.at("w").to_vector(), (std::vector<float>{1.0F, -1.0F}));
}

TEST(SafetensorsFiles, MissingOrUnwritableFilesNameThePath) {
  const TempDirectory directory;
  const std::filesystem::path missing = directory.path() / "missing.safetensors";
  EXPECT_THROW_MESSAGE(load_safetensors(missing), FileError,
                       missing.string() + ": cannot read the file");
  const std::filesystem::path nowhere = directory.path() / "no_such_dir" / "p.safetensors";
  EXPECT_THROW_MESSAGE(save_safetensors(nowhere, {}), FileError,
                       nowhere.string() + ": cannot write the file");
}

// One tensor read as stored: F16 and BF16 as their words (the ones save_safetensors_half wrote),
// F32 as values, F64 rounded; by name, or the only one; a file truncated anywhere (the reader
// reads its header and one tensor only) throws FileError naming it, as do a missing name, a file
// of several tensors without one, a FIFO and a missing file.
TEST(SafetensorsFiles, OneTensorAsStored) {
  const TempDirectory directory;
  const std::vector<uint16_t> words = {0x3F80, 0xC000, 0x4049, 0x0001, 0x7BFF, 0x8000};
  for (const HalfType type : {HalfType::kFloat16, HalfType::kBFloat16}) {
    const std::filesystem::path file = directory.path() / "h.safetensors";
    save_safetensors_half(file, "x", type, Shape{2, 3}, words);
    for (const std::string_view name : {std::string_view("x"), std::string_view()}) {
      const SafetensorsTensor tensor = load_safetensors_tensor(file, name);
      EXPECT_EQ(tensor.half, type);
      EXPECT_EQ(tensor.shape, (Shape{2, 3}));
      EXPECT_EQ(tensor.bits, words);
    }
    // The whole-file reader widens the same tensor exactly.
    const std::vector<float> widened = load_safetensors(file).at("x").to_vector();
    for (size_t e = 0; e < words.size(); ++e)
      EXPECT_EQ(widened[e], half_bits_to_float(type, words[e]));
  }
  const std::vector<std::byte> bytes = f64_then_f32();
  const std::filesystem::path mixed = directory.path() / "mixed.safetensors";
  const auto write = [](const std::filesystem::path& path, std::span<const std::byte> data) {
    std::ofstream(path, std::ios::binary)
        .write(reinterpret_cast<const char*>(data.data()),
               static_cast<std::streamsize>(data.size()));
  };
  write(mixed, bytes);
  EXPECT_EQ(load_safetensors_tensor(mixed, "z").floats.to_vector(),
            (std::vector<float>{0.1F, -3.0F}));
  EXPECT_EQ(load_safetensors_tensor(mixed, "a").floats.to_vector(), std::vector<float>{7.5F});
  EXPECT_FALSE(load_safetensors_tensor(mixed, "a").half);
  EXPECT_THROW_MESSAGE(load_safetensors_tensor(mixed, ""), FileError,
                       "expected one tensor (or FILE:NAME to choose one), got 2: 'z', 'a'");
  EXPECT_THROW_MESSAGE(load_safetensors_tensor(mixed, "q"), FileError,
                       mixed.string() + ": no tensor 'q': it holds 'z', 'a'");
  const std::filesystem::path cut = directory.path() / "cut.safetensors";
  for (size_t length = 0; length < bytes.size(); ++length) {
    write(cut, std::span(bytes).first(length));
    EXPECT_THROW(load_safetensors_tensor(cut, "a"), FileError) << "truncated at " << length;
  }
  const std::filesystem::path missing = directory.path() / "missing.safetensors";
  EXPECT_THROW_MESSAGE(load_safetensors_tensor(missing, "a"), FileError,
                       missing.string() + ": cannot read the file");
  const std::filesystem::path fifo = directory.path() / "fifo.safetensors";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_THROW_MESSAGE(load_safetensors_tensor(fifo, "a"), FileError, "expected a regular file");
}

}  // namespace
}  // namespace attn
