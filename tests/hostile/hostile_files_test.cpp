// Hostile files: JSON nested hundreds of kilobytes deep in every JSON attn reads (a safetensors
// header's __metadata__ and shapes, a model's config.json and vocab.json), numbers beyond double,
// wrong JSON types, NULs and escapes in names, FIFOs and devices given as files, empty arrays that
// claim billions of rows, and thread counts out of range. Each is a clean attn error naming the
// file — never a crash, a hang, a foreign exception or gigabytes of memory.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "attn/core/error.hpp"
#include "attn/core/threads.hpp"
#include "attn/functional/scaled_dot_product_attention.hpp"
#include "attn/io/files.hpp"
#include "attn/io/npy.hpp"
#include "attn/io/safetensors.hpp"
#include "attn/seq2seq/corpus.hpp"
#include "attn/seq2seq/translator.hpp"
#include "test_support.hpp"

namespace attn {
namespace {

namespace fs = std::filesystem;

std::vector<std::byte> bytes_of(std::string_view text) {
  const auto* begin = reinterpret_cast<const std::byte*>(text.data());
  return {begin, begin + text.size()};
}

// A safetensors file with `header` and `data` bytes of data.
std::vector<std::byte> safetensors(const std::string& header, size_t data = 0) {
  std::vector<std::byte> bytes(8);
  const uint64_t size = header.size();
  std::memcpy(bytes.data(), &size, 8);
  const std::vector<std::byte> text = bytes_of(header);
  bytes.insert(bytes.end(), text.begin(), text.end());
  bytes.resize(bytes.size() + data);
  return bytes;
}

// 300 000 levels of `open`, then as many `close`: 600 KB that a recursive reader cannot survive.
std::string nested(char open, char close, size_t depth = 300'000) {
  return std::string(depth, open) + std::string(depth, close);
}

class TempDirectory {
 public:
  TempDirectory() {
    path_ = fs::temp_directory_path() /
            ("attn_hostile_" +
             std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()) + "_" +
             std::to_string(::getpid()));
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDirectory() {
    std::error_code ignored;
    fs::remove_all(path_, ignored);
  }
  TempDirectory(const TempDirectory&) = delete;
  TempDirectory& operator=(const TempDirectory&) = delete;
  fs::path operator/(const std::string& name) const { return path_ / name; }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

void write_text(const fs::path& path, std::string_view text) {
  std::ofstream(path, std::ios::binary) << text;
}

// ---- JSON nested without end, in every JSON attn reads.

TEST(HostileJson, DeepNestingInTheSafetensorsMetadataAndShapes) {
  EXPECT_THROW_MESSAGE(
      parse_safetensors(safetensors("{\"__metadata__\":" + nested('[', ']') + "}"), "meta.st"),
      FileError, "meta.st: header nests arrays and objects deeper than 64 levels");
  EXPECT_THROW_MESSAGE(
      parse_safetensors(safetensors("{\"__metadata__\":" + nested('{', '}') + "}"), "obj.st"),
      FileError, "obj.st: header");
  EXPECT_THROW_MESSAGE(
      parse_safetensors(safetensors("{\"w\":{\"dtype\":\"F32\",\"shape\":" + nested('[', ']') +
                                    ",\"data_offsets\":[0,0]}}"),
                        "shape.st"),
      FileError, "shape.st: header nests arrays and objects deeper than 64 levels");
  // Just within the limit, a nested value is still quoted (cut short) in the message.
  EXPECT_THROW_MESSAGE(
      parse_safetensors(safetensors("{\"__metadata__\":" + nested('[', ']', 63) + "}"), "ok.st"),
      FileError, "ok.st: expected '__metadata__' to map strings to strings, got [[[[");
}

TEST(HostileJson, ManyValuesAreRefusedBeforeTheyCostGigabytes) {
  std::string many = "{\"__metadata__\":[";
  for (int i = 0; i < 1'000'001; ++i) many += "0,";
  many += "0]}";
  EXPECT_THROW_MESSAGE(parse_safetensors(safetensors(many), "many.st"), FileError,
                       "many.st: header holds more than 1000000 JSON values");
}

TEST(HostileJson, NumbersBeyondDoubleAndForeignErrorsBecomeFileErrors) {
  EXPECT_THROW_MESSAGE(parse_safetensors(safetensors("{\"w\":{\"dtype\":\"F32\",\"shape\":[1e999],"
                                                     "\"data_offsets\":[0,4]}}",
                                                     4),
                                         "big.st"),
                       FileError, "big.st: header is not valid JSON: number overflow");
  try {
    parse_safetensors(safetensors("{\"a\":1e999}"), "tag.st");
    ADD_FAILURE() << "expected FileError";
  } catch (const FileError& error) {
    EXPECT_EQ(std::string(error.what()).find("[json.exception"), std::string::npos) << error.what();
  }
}

TEST(HostileJson, NamesWithNulsAndEscapesAreEscapedInMessages) {
  const std::string header =
      "{\"a\\u0000\\u001b[31mb\":{\"dtype\":\"F16\\u0000\",\"shape\":[1],\"data_offsets\":[0,2]}}";
  try {
    parse_safetensors(safetensors(header, 2), "nul.st");
    ADD_FAILURE() << "expected FileError";
  } catch (const FileError& error) {
    const std::string message = error.what();
    EXPECT_EQ(message.find('\0'), std::string::npos);
    EXPECT_EQ(message.find('\x1b'), std::string::npos);
    EXPECT_NE(message.find("tensor 'a\\x00\\x1b[31mb': unsupported dtype 'F16\\x00'"),
              std::string::npos)
        << message;
  }
  // .npy header bytes too.
  std::string npy = "\x93NUMPY\x01";
  npy += '\0';
  const std::string dict = "{'descr': '<f4\x1b[2J', 'fortran_order': False, 'shape': (1,), }\n";
  npy += static_cast<char>(dict.size());
  npy += '\0';
  npy += dict;
  try {
    parse_npy(bytes_of(npy), "esc.npy");
    ADD_FAILURE() << "expected FileError";
  } catch (const FileError& error) {
    EXPECT_NE(std::string(error.what()).find("unsupported dtype '<f4\\x1b[2J'"), std::string::npos)
        << error.what();
  }
}

// A model directory as Translator::save writes it (small), for the config.json / vocab.json cases.
class HostileModel : public ::testing::Test {
 protected:
  void SetUp() override {
    Seq2SeqConfig config;
    config.source_vocab_size = 5;
    config.target_vocab_size = 5;
    config.embed_size = 2;
    config.num_hiddens = 2;
    const std::vector<std::string> tokens = {"<pad>", "<bos>", "<eos>", "<unk>", "x"};
    Translator(Seq2Seq(config, 1), Vocabulary::from_tokens(tokens), Vocabulary::from_tokens(tokens),
               TokenizerKind::kDates, 3)
        .save(directory_.path());
    config_ = read(directory_ / "config.json");
  }
  static std::string read(const fs::path& path) {
    std::ifstream file(path, std::ios::binary);
    return {std::istreambuf_iterator<char>(file), std::istreambuf_iterator<char>()};
  }
  // config.json with `from` replaced by `to`.
  void replace_in_config(const std::string& from, const std::string& to) {
    std::string text = config_;
    const size_t at = text.find(from);
    ASSERT_NE(at, std::string::npos) << from;
    text.replace(at, from.size(), to);
    write_text(directory_ / "config.json", text);
  }
  TempDirectory directory_;
  std::string config_;
};

TEST_F(HostileModel, LoadsAsWritten) {
  EXPECT_NO_THROW(Translator::load(directory_.path()));
}

TEST_F(HostileModel, DeepNestingInConfigAndVocabulary) {
  replace_in_config("\"training\": {}", "\"training\": " + nested('[', ']'));
  EXPECT_THROW_MESSAGE(Translator::load(directory_.path()), FileError,
                       "config.json: the file nests arrays and objects deeper than 16 levels");
  write_text(directory_ / "config.json", config_);
  write_text(directory_ / "vocab.json", "{\"source\":" + nested('[', ']') + "}");
  EXPECT_THROW_MESSAGE(Translator::load(directory_.path()), FileError,
                       "vocab.json: the file nests arrays and objects deeper than 16 levels");
}

TEST_F(HostileModel, WrongJsonTypesAreFileErrorsNamingTheField) {
  for (const auto& [from, to, message] :
       std::vector<std::tuple<std::string, std::string, std::string>>{
           {"\"format\": \"attn-seq2seq\"", "\"format\": 3",
            "expected \"format\": \"attn-seq2seq\", got 3"},
           {"\"num_hiddens\": 2", "\"num_hiddens\": \"2\"",
            "expected an integer field \"num_hiddens\""},
           {"\"num_hiddens\": 2", "\"num_hiddens\": 1e999",
            "config.json: the file is not valid JSON"},
           {"\"num_hiddens\": 2", "\"num_hiddens\": 18446744073709551615",
            "expected an integer field \"num_hiddens\""},
           {"\"dropout\": 0.0", "\"dropout\": [0]", "expected \"dropout\" in [0, 1], got [0]"},
           {"\"tokenizer\": \"dates\"", "\"tokenizer\": {}",
            "expected a string field \"tokenizer\""},
       }) {
    replace_in_config(from, to);
    EXPECT_THROW_MESSAGE(Translator::load(directory_.path()), FileError, message);
  }
  write_text(directory_ / "config.json", "[1, 2]");
  EXPECT_THROW_MESSAGE(Translator::load(directory_.path()), FileError, "expected \"format\"");
}

TEST_F(HostileModel, SizesTheWeightsDoNotHoldAllocateNothing) {
  // 65536 × 65536 embeddings would be 16 GiB; the weights file holds a few hundred floats.
  replace_in_config("\"embed_size\": 2", "\"embed_size\": 4000");
  EXPECT_THROW_MESSAGE(Translator::load(directory_.path()), ShapeError,
                       "model.safetensors: expected the");
  replace_in_config("\"num_hiddens\": 2", "\"num_hiddens\": 65536");
  EXPECT_THROW_MESSAGE(Translator::load(directory_.path()), FileError, "parameters");
}

// Finite parameters near float's maximum overflow inside the model's GRUs: translating is an
// error, never NaN logits or attention weights. The model is the seq2seq fuzzer's finding (GRU
// weights near 1e36), kept in its corpus: config.json, vocab.json and model.safetensors joined by
// the fuzzer's separator line.
TEST(HostileModelValues, ParametersThatOverflowWhileTranslatingAreAnError) {
  std::ifstream file(
      fs::path(ATTN_FIXTURES_DIR) / "../../fuzz/corpus/seq2seq_model/overflowing_gru",
      std::ios::binary);
  const std::string text{std::istreambuf_iterator<char>(file), std::istreambuf_iterator<char>()};
  const std::string separator = "\n#attn-fuzz#\n";
  const size_t first = text.find(separator);
  const size_t second = text.find(separator, first + separator.size());
  ASSERT_NE(second, std::string::npos) << "fixture missing or not three files";
  const std::string_view all(text);
  const std::string_view weights = all.substr(second + separator.size());
  Translator translator = Translator::parse(
      all.substr(0, first), all.substr(first + separator.size(), second - first - separator.size()),
      std::as_bytes(std::span(weights.data(), weights.size())), "overflowing_gru");
  EXPECT_THROW_MESSAGE(translator.translate("3 march 1987"), ValueError,
                       "model: its parameters overflow float while translating");
}

// ---- Files that are not regular files: refused before anything waits on them.

TEST(HostileFiles, FifosDevicesAndFoldersAreRefusedWithoutBlocking) {
  const TempDirectory directory;
  const fs::path fifo = directory / "pipe.npy";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const auto started = std::chrono::steady_clock::now();
  EXPECT_THROW_MESSAGE(read_npy(fifo), FileError, "expected a regular file, got a FIFO");
  EXPECT_THROW_MESSAGE(load_safetensors(fifo), FileError, "got a FIFO");
  EXPECT_THROW_MESSAGE(read_file(fifo), FileError, "got a FIFO");
  EXPECT_THROW_MESSAGE(read_tsv_pairs(fifo), FileError, "got a FIFO");
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(5));
  EXPECT_THROW_MESSAGE(read_npy("/dev/zero"), FileError, "got a character device");
  EXPECT_THROW_MESSAGE(load_safetensors(directory.path()), FileError, "got a directory");
  EXPECT_THROW_MESSAGE(read_npy(directory / "missing.npy"), FileError,
                       "cannot read the file (No such file or directory)");
}

TEST_F(HostileModel, AFifoInAModelDirectoryIsRefused) {
  fs::remove(directory_ / "vocab.json");
  ASSERT_EQ(::mkfifo((directory_ / "vocab.json").c_str(), 0600), 0);
  EXPECT_THROW_MESSAGE(Translator::load(directory_.path()), FileError,
                       "vocab.json: cannot read the file (expected a regular file, got a FIFO");
}

// ---- Empty arrays that claim billions of rows.

TEST(HostileShapes, ZeroWidthGiantsAreRefusedByTheReaders) {
  // 128 bytes claiming 2^31 rows of width 0: refused, not allocated for later.
  const std::string giant = testing::npy_header("<f4", "(1, 2147483648, 0)");
  ASSERT_EQ(giant.size(), 128U);
  EXPECT_THROW_MESSAGE(parse_npy(bytes_of(giant), "giant.npy"), FileError,
                       "giant.npy: shape (1, 2147483648, 0) holds no data, but its other "
                       "dimensions multiply to more than 65536");
  EXPECT_NO_THROW(parse_npy(bytes_of(testing::npy_header("<f4", "(2, 0, 3)")), "small.npy"));
  EXPECT_THROW_MESSAGE(
      parse_safetensors(safetensors("{\"w\":{\"dtype\":\"F32\",\"shape\":[0,4294967296],"
                                    "\"data_offsets\":[0,0]}}"),
                        "giant.st"),
      FileError, "giant.st: tensor 'w': shape [0,4294967296] holds no data");
}

TEST(HostileShapes, AShapeTupleMillionsLongIsRefusedAsItIsRead) {
  std::string tuple = "(";
  for (int i = 0; i < 1'000'000; ++i) tuple += "1, ";
  tuple += ")";
  std::string dict = "{'descr': '<f4', 'fortran_order': False, 'shape': " + tuple + ", }\n";
  std::string npy = "\x93NUMPY\x02";
  npy += '\0';
  const auto size = static_cast<uint32_t>(dict.size());
  npy.append(reinterpret_cast<const char*>(&size), 4);
  EXPECT_THROW_MESSAGE(parse_npy(bytes_of(npy + dict), "long.npy"), FileError,
                       "long.npy: expected a rank of at most 8, got a shape tuple of more than 64");
}

TEST(HostileShapes, ZeroWidthInputsCostNoPerElementWork) {
  // E = 0: every score is 0, so each output row is the mean of the values; nothing divides by E.
  EXPECT_EQ(log_sum_exp_size(Shape{3, 65536, 0}), 3 * 65536);
  const Tensor q(Shape{1, 4, 0}), k(Shape{1, 6, 0});
  const Tensor v(Shape{1, 6, 2}, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12});
  const AttentionForward forward = scaled_dot_product_attention(q, k, v, {});
  for (int64_t i = 0; i < 4; ++i) {
    EXPECT_FLOAT_EQ(forward.output(0, i, 0), 6.0F);
    EXPECT_FLOAT_EQ(forward.output(0, i, 1), 7.0F);
  }
  // Values of width 0 with many keys: an empty output, at once.
  const auto started = std::chrono::steady_clock::now();
  const AttentionForward empty = scaled_dot_product_attention(
      Tensor(Shape{1, 256, 0}), Tensor(Shape{1, 256, 0}), Tensor(Shape{1, 256, 0}), {});
  EXPECT_EQ(empty.output.numel(), 0);
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(5));
}

// ---- Thread counts.

TEST(HostileThreads, CountsOutsideOneToTheMaximumAreValueErrors) {
  EXPECT_NO_THROW(check_thread_count(1, "n"));
  EXPECT_NO_THROW(check_thread_count(kMaxThreads, "n"));
  EXPECT_THROW_MESSAGE(check_thread_count(0, "n"), ValueError,
                       "n: expected a thread count in [1, 1024], got 0");
  EXPECT_THROW_MESSAGE(check_thread_count(1'000'000, "--threads"), ValueError,
                       "--threads: expected a thread count in [1, 1024], got 1000000");
  EXPECT_THROW_MESSAGE(check_thread_count(-5, "n"), ValueError, "got -5");
}

}  // namespace
}  // namespace attn
