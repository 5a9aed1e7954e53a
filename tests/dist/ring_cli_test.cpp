// `mpiexec -n P attn run --ring ...` end to end: its output and gradient files against a
// single-process `attn run` on the same files (P = 1 to 4), and its errors — one rank's bad rows,
// a missing file, refused flags — reported once by rank 0 with exit status 1, never a hang.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

#include "attn/core/half.hpp"
#include "attn/core/random.hpp"
#include "attn/core/tensor.hpp"
#include "attn/io/npy.hpp"
#include "attn/io/npy_rows.hpp"
#include "test_support.hpp"

namespace attn {
namespace {

namespace fs = std::filesystem;

std::string read_text(const fs::path& path) {
  std::ifstream file(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(file), std::istreambuf_iterator<char>()};
}

struct CommandResult {
  int exit_code = -1;
  std::string out;
  std::string err;
};

class RingCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    directory_ = fs::temp_directory_path() /
                 ("attn_ring_cli_" + std::string(info->name()) + "_" + std::to_string(::getpid()));
    fs::remove_all(directory_);
    fs::create_directories(directory_);
  }
  void TearDown() override {
    std::error_code ignored;
    fs::remove_all(directory_, ignored);
  }
  fs::path path(const std::string& name) const { return directory_ / name; }

  // Runs `command` in the test directory under a time limit, so a hang fails instead of waiting.
  CommandResult shell(const std::string& command) const {
    const std::string line = "cd '" + directory_.string() + "' && timeout 120 " + command +
                             " > stdout.txt 2> stderr.txt";
    const int status = std::system(line.c_str());
    return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, read_text(path("stdout.txt")),
            read_text(path("stderr.txt"))};
  }
  CommandResult attn(const std::string& arguments) const {
    return shell("'" ATTN_CLI_PATH "' " + arguments);
  }
  // The environment tests/dist/CMakeLists.txt gives MPI processes: Open MPI refuses root (CI)
  // without its two variables; one OpenMP thread per rank on a shared machine.
  CommandResult ring(int ranks, const std::string& arguments) const {
    return shell("env " ATTN_MPI_ENVIRONMENT " '" ATTN_MPIEXEC "' -n " + std::to_string(ranks) +
                 " " ATTN_MPIEXEC_FLAGS " '" ATTN_CLI_PATH "' " + arguments + " --ring");
  }

  // One rank per argument list (MPI's MPMD form), as when each machine has its own copy of a file.
  CommandResult ring_per_rank(const std::vector<std::string>& arguments) const {
    std::string command = "env " ATTN_MPI_ENVIRONMENT " '" ATTN_MPIEXEC "' " ATTN_MPIEXEC_FLAGS;
    for (size_t rank = 0; rank < arguments.size(); ++rank) {
      command += std::string(rank == 0 ? "" : " :") + " -n 1 '" ATTN_CLI_PATH "' " +
                 arguments[rank] + " --ring";
    }
    return shell(command);
  }

  void save(const std::string& name, const Tensor& tensor) const { save_npy(path(name), tensor); }

  fs::path directory_;
};

// max |ring − single| ≤ 1e−5 · max |single|, over a whole file.
void expect_same_file(const fs::path& ring, const fs::path& single) {
  const Tensor a = load_npy_tensor(ring, "ring");
  const Tensor b = load_npy_tensor(single, "single");
  ASSERT_EQ(a.shape(), b.shape()) << ring;
  double largest = 0.0, worst = 0.0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    largest = std::max(largest, std::fabs(static_cast<double>(b.data()[i])));
    worst = std::max(worst, std::fabs(static_cast<double>(a.data()[i]) - b.data()[i]));
  }
  EXPECT_LE(worst, 1e-5 * largest) << ring << " against " << single;
}

// Rank-3 (B, n, H·d) files split by --heads 4 --kv-heads 2, causal, per-query valid lengths and a
// window; then rank-4 (N, H, L, E) files with more keys than queries, bottom-right causal and a
// scale. n = 37 and 29/41: divisible by no 2P.
TEST_F(RingCliTest, RingRunsMatchASingleProcessRun) {
  Rng rng(21);
  save("q3.npy", testing::random_tensor(Shape{2, 37, 4 * 8}, rng));
  save("k3.npy", testing::random_tensor(Shape{2, 37, 2 * 8}, rng));
  save("v3.npy", testing::random_tensor(Shape{2, 37, 2 * 6}, rng));
  save("g3.npy", testing::random_tensor(Shape{2, 37, 4 * 6}, rng));
  std::vector<int64_t> lengths;
  for (int64_t i = 0; i < 2 * 37; ++i) lengths.push_back((i * 7) % 38);
  save_npy(path("lens.npy"), lengths, Shape{2, 37});
  save("q4.npy", testing::random_tensor(Shape{1, 4, 29, 8}, rng));
  save("k4.npy", testing::random_tensor(Shape{1, 2, 41, 8}, rng));
  save("v4.npy", testing::random_tensor(Shape{1, 2, 41, 8}, rng));
  save("g4.npy", testing::random_tensor(Shape{1, 4, 29, 8}, rng));

  const std::string three =
      "run --layer dot-product --queries q3.npy --keys k3.npy --values v3.npy --heads 4 "
      "--kv-heads 2 --causal top-left --valid-lens lens.npy --window 9,2 --out-grad g3.npy";
  const std::string four =
      "run --layer dot-product --queries q4.npy --keys k4.npy --values v4.npy --causal "
      "bottom-right --scale 0.2 --out-grad g4.npy";
  for (const auto& [name, arguments] : {std::pair{"three", three}, std::pair{"four", four}}) {
    const std::string single = std::string(name) + "_single";
    const CommandResult reference =
        attn(arguments + " --out " + single + ".npy --grads-out " + single);
    ASSERT_EQ(reference.exit_code, 0) << reference.err;
    for (int ranks = 1; ranks <= 4; ++ranks) {
      const std::string mine = std::string(name) + "_ring" + std::to_string(ranks);
      const CommandResult result =
          ring(ranks, arguments + " --out " + mine + ".npy --grads-out " + mine);
      ASSERT_EQ(result.exit_code, 0) << result.err;
      EXPECT_NE(result.out.find("as ring attention over " + std::to_string(ranks)),
                std::string::npos)
          << result.out;
      expect_same_file(path(mine + ".npy"), path(single + ".npy"));
      for (const char* gradient : {"queries", "keys", "values"}) {
        expect_same_file(path(mine) / (std::string(gradient) + ".npy"),
                         path(single) / (std::string(gradient) + ".npy"));
      }
    }
  }
}

// float16 files, written as a single-process run writes them: the output and the gradients in
// float16 too (PyTorch's dtypes follow the inputs'), within float16's rounding of its values; and
// a gradient past float16's range an error, as there.
TEST_F(RingCliTest, Float16InputsGiveFloat16Outputs) {
  Rng rng(8);
  const auto save_float16 = [&](const std::string& name, const Tensor& values) {
    std::vector<uint16_t> bits;
    for (const float value : values.span())
      bits.push_back(float_to_half_bits(HalfType::kFloat16, value));
    save_npy_float16(path(name), bits, values.shape());
  };
  for (const char* name : {"q.npy", "k.npy", "v.npy", "g.npy"})
    save_float16(name, testing::random_tensor(Shape{2, 13, 8}, rng));
  const std::string arguments =
      "run --layer dot-product --queries q.npy --keys k.npy --values v.npy --causal top-left "
      "--out-grad g.npy";
  const CommandResult reference = attn(arguments + " --out single.npy --grads-out single");
  ASSERT_EQ(reference.exit_code, 0) << reference.err;
  const CommandResult result = ring(2, arguments + " --out ring.npy --grads-out ring");
  ASSERT_EQ(result.exit_code, 0) << result.err;
  for (const std::string file :
       {"ring.npy", "ring/queries.npy", "ring/keys.npy", "ring/values.npy"}) {
    EXPECT_EQ(read_npy_header(path(file)).dtype, NpyDType::kFloat16) << file;
  }
  // Two float16 roundings of one exact result differ by at most one step of float16 (2^-10 of
  // the largest value, relative).
  const auto expect_close = [&](const std::string& ring_file, const std::string& single_file) {
    const Tensor a = load_npy_tensor(path(ring_file), "ring");
    const Tensor b = load_npy_tensor(path(single_file), "single");
    ASSERT_EQ(a.shape(), b.shape()) << ring_file;
    double largest = 0.0, worst = 0.0;
    for (int64_t i = 0; i < a.numel(); ++i) {
      largest = std::max(largest, std::fabs(static_cast<double>(b.data()[i])));
      worst = std::max(worst, std::fabs(static_cast<double>(a.data()[i]) - b.data()[i]));
    }
    EXPECT_LE(worst, 0x1p-10 * largest) << ring_file;
  };
  expect_close("ring.npy", "single.npy");
  for (const char* gradient : {"queries", "keys", "values"}) {
    expect_close(std::string("ring/") + gradient + ".npy",
                 std::string("single/") + gradient + ".npy");
  }
  // G of 60000 everywhere: key 0's value gradient sums it over every query that sees key 0 (with
  // weight 1 for query 0 alone under the causal mask), past float16's 65504.
  save_float16("big.npy", Tensor::full(Shape{2, 13, 8}, 60000.0F));
  const CommandResult overflow =
      ring(2,
           "run --layer dot-product --queries q.npy --keys k.npy --values v.npy --causal top-left "
           "--out-grad big.npy --out big_out.npy --grads-out big_grads");
  EXPECT_EQ(overflow.exit_code, 1);
  EXPECT_NE(overflow.err.find("(it overflows float16); scale the inputs down"), std::string::npos)
      << overflow.err;
  EXPECT_FALSE(fs::exists(path("big_out.npy")));
  // float16 queries with float32 keys and values: refused as a single-process run refuses them
  // (PyTorch refuses the mix), not computed and written in float32.
  save("k32.npy", testing::random_tensor(Shape{2, 13, 8}, rng));
  save("v32.npy", testing::random_tensor(Shape{2, 13, 8}, rng));
  const std::string mixed =
      "run --layer dot-product --queries q.npy --keys k32.npy --values v32.npy --out mixed.npy";
  const CommandResult single_mixed = attn(mixed);
  const CommandResult ring_mixed = ring(2, mixed);
  EXPECT_EQ(single_mixed.exit_code, 1);
  EXPECT_EQ(ring_mixed.exit_code, 1);
  // The odd one out is named: the queries, beside float32 keys and values.
  const std::string refusal =
      "queries: expected float32 or float64 data like the other inputs (float16 or bfloat16 "
      "inputs run in their type when all three are), got float16";
  EXPECT_NE(single_mixed.err.find(refusal), std::string::npos) << single_mixed.err;
  EXPECT_NE(ring_mixed.err.find(refusal), std::string::npos) << ring_mixed.err;
  EXPECT_FALSE(fs::exists(path("mixed.npy")));
}

// ALiBi slopes the scores cannot hold (−1e37 over 58 positions: +∞ scores, NaN outputs) are
// refused as a single-process run refuses them, before any block is computed (the ring's block
// pairs saw only their own distances; it once wrote the NaN with exit 0). A gradient that
// overflows in one block pair stops
// every rank with one message (each rank printed its own, with MPI_Abort's). Errors of the flags
// come once (each rank printed its own), and shapes are the files' (a shard's were named).
TEST_F(RingCliTest, ErrorsAreASingleProcessRunsOnceEach) {
  Rng rng(9);
  for (const char* name : {"q.npy", "k.npy", "v.npy"})
    save(name, testing::random_tensor(Shape{1, 29, 16}, rng));
  save("alibi.npy", Tensor(Shape{2}, {-1e37F, -1.0F}));
  const std::string inputs = "run --layer dot-product --queries q.npy --keys k.npy --values v.npy";
  const std::string steep =
      "alibi_slopes: expected negative slopes of magnitude at most 4.0666507e+36 (float's largest "
      "over log2 e and the 58 positions a query can be from a key";
  const CommandResult single = attn(inputs + " --heads 2 --alibi alibi.npy --out single.npy");
  EXPECT_NE(single.err.find(steep), std::string::npos) << single.err;
  CommandResult result = ring(2, inputs + " --heads 2 --alibi alibi.npy --out o.npy");
  EXPECT_EQ(result.exit_code, 1) << result.err;
  EXPECT_NE(result.err.find(steep), std::string::npos) << result.err;
  EXPECT_EQ(result.err.find("attn: error:"), result.err.rfind("attn: error:")) << result.err;
  EXPECT_FALSE(fs::exists(path("o.npy")));

  Tensor big_values = testing::random_tensor(Shape{1, 29, 16}, rng);
  for (float& value : big_values.span()) value *= 1e20F;
  save("v_big.npy", big_values);
  save("g_big.npy", big_values);
  result = ring(4,
                "run --layer dot-product --queries q.npy --keys k.npy --values v_big.npy --out "
                "o.npy --out-grad g_big.npy --grads-out gr");
  EXPECT_EQ(result.exit_code, 1) << result.err;
  EXPECT_NE(result.err.find("attn: error: rank "), std::string::npos) << result.err;
  EXPECT_NE(result.err.find("the exact result overflows float32"), std::string::npos) << result.err;
  EXPECT_EQ(result.err.find("attn: error:"), result.err.rfind("attn: error:")) << result.err;
  EXPECT_EQ(result.err.find("MPI_ABORT"), std::string::npos) << result.err;
  EXPECT_FALSE(fs::exists(path("gr")));

  for (const std::string& flags :
       {std::string(" --out o.npy --scale abc"), std::string(" --out o.npy --out-grad g_big.npy"),
        std::string("")}) {
    result = ring(4, inputs + flags);
    EXPECT_EQ(result.exit_code, 1) << flags;
    EXPECT_NE(result.err.find("attn: error:"), std::string::npos) << flags << result.err;
    EXPECT_EQ(result.err.find("attn: error:"), result.err.rfind("attn: error:"))
        << flags << result.err;
  }

  save("k_e7.npy", testing::random_tensor(Shape{1, 29, 7}, rng));
  result = ring(3,
                "run --layer dot-product --queries q.npy --keys k_e7.npy --values v.npy --out "
                "o.npy");
  EXPECT_NE(result.err.find("keys: expected the last dimension to be 16 (the size of each "
                            "query), got shape (1, 29, 7)"),
            std::string::npos)
      << result.err;
  std::vector<int64_t> lengths(3 * 29, 5);
  save_npy(path("lengths.npy"), lengths, Shape{3, 29});
  result = ring(3, inputs + " --valid-lens lengths.npy --out o.npy");
  EXPECT_NE(result.err.find("valid_lens: expected shape (1, 29) to match the scores (1, 29, 29) "
                            "(B, n, m), got shape (3, 29)"),
            std::string::npos)
      << result.err;
  save_npy(path("k_int.npy"), std::vector<int64_t>(29 * 16, 1), Shape{1, 29, 16});
  result = ring(2,
                "run --layer dot-product --queries q.npy --keys k_int.npy --values v.npy --out "
                "o.npy");
  EXPECT_NE(result.err.find("keys (k_int.npy): expected float32, float64 or float16 data, got "
                            "integer (int64) data"),
            std::string::npos)
      << result.err;
}

// A NaN in rows that only rank 1 reads: every rank stops, rank 0 says which rank and file.
TEST_F(RingCliTest, BadRowsOnOneRankStopEveryRank) {
  Rng rng(4);
  save("q.npy", testing::random_tensor(Shape{1, 37, 8}, rng));
  Tensor keys = testing::random_tensor(Shape{1, 37, 8}, rng);
  // 37 over 4 zig-zag chunks (10, 9, 9, 9): rank 1 of 2 holds rows 10 to 27.
  keys(0, 12, 3) = std::numeric_limits<float>::quiet_NaN();
  save("k.npy", keys);
  save("v.npy", testing::random_tensor(Shape{1, 37, 8}, rng));
  const CommandResult result =
      ring(2, "run --layer dot-product --queries q.npy --keys k.npy --values v.npy --out o.npy");
  EXPECT_EQ(result.exit_code, 1) << result.err;
  EXPECT_NE(result.err.find("attn: error: rank 1: key: expected finite values, got NaN"),
            std::string::npos)
      << result.err;
  EXPECT_NE(result.err.find("(key from --keys k.npy)"), std::string::npos) << result.err;
  // Reported once, by rank 0, not by every rank.
  EXPECT_EQ(result.err.find("attn: error:"), result.err.rfind("attn: error:")) << result.err;
  EXPECT_FALSE(fs::exists(path("o.npy")));
}

TEST_F(RingCliTest, MissingFilesAndRefusedFlagsAreErrorsOnEveryRank) {
  Rng rng(4);
  save("q.npy", testing::random_tensor(Shape{1, 9, 8}, rng));
  const std::string inputs = "run --layer dot-product --queries q.npy --keys q.npy --values ";
  CommandResult result = ring(3, inputs + "missing.npy --out o.npy");
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_NE(result.err.find("attn: error: rank 0: --values: missing.npy"), std::string::npos)
      << result.err;
  // Outputs are checked as a single-process run checks them, before any work.
  result = ring(2, inputs + "q.npy --out q.npy");
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_NE(result.err.find("--out q.npy: the same file as --queries q.npy"), std::string::npos)
      << result.err;
  result = ring(2, inputs + "q.npy --out o.npy --mask q.npy");
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_NE(result.err.find("--mask: not available with --ring"), std::string::npos) << result.err;
  result = ring(2, inputs + "q.npy --out o.npy --weights-out w.npy");
  EXPECT_NE(result.err.find("--weights-out: not available with --ring"), std::string::npos)
      << result.err;
  result = ring(1,
                "run --layer additive --params p.safetensors --queries q.npy --keys q.npy "
                "--values q.npy --out o.npy");
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_NE(result.err.find("--ring: only --layer dot-product"), std::string::npos) << result.err;
  // Each rank reads its rows of a .npy file; a safetensors input is refused by name.
  std::ofstream(path("k.safetensors")) << "not read";
  result = ring(2,
                "run --layer dot-product --queries q.npy --keys k.safetensors --values q.npy "
                "--out o.npy");
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_NE(result.err.find("--keys: --ring reads .npy inputs"), std::string::npos) << result.err;
  // A safetensors --out, which a single-process run writes, is refused naming --ring as the
  // reason (it read as though --out took .npy files only).
  result = ring(1, inputs + "q.npy --out o.safetensors");
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_NE(result.err.find("--out: expected a file name ending in .npy (--ring writes .npy files "
                            "only), got 'o.safetensors'"),
            std::string::npos)
      << result.err;
  EXPECT_FALSE(fs::exists(path("o.safetensors")));
}

// Each rank cuts its rows from its own copy of a file: a copy that differs from rank 0's in shape
// or type is named before any rank reads rows (13 keys against rank 0's 14 gave exit 0 and an
// output over keys of neither file; 13 queries against 14 ended in MPI_ERR_TRUNCATE).
TEST_F(RingCliTest, RanksWhoseFilesDifferAreNamed) {
  Rng rng(6);
  save("q.npy", testing::random_tensor(Shape{2, 13, 8}, rng));
  save("k.npy", testing::random_tensor(Shape{2, 13, 8}, rng));
  save("v.npy", testing::random_tensor(Shape{2, 13, 8}, rng));
  save("k14.npy", testing::random_tensor(Shape{2, 14, 8}, rng));
  save("v14.npy", testing::random_tensor(Shape{2, 14, 8}, rng));
  save("q14.npy", testing::random_tensor(Shape{2, 14, 8}, rng));
  const std::string head = "run --layer dot-product ";
  CommandResult result =
      ring_per_rank({head + "--queries q.npy --keys k.npy --values v.npy --out o.npy",
                     head + "--queries q.npy --keys k14.npy --values v14.npy --out o.npy"});
  EXPECT_EQ(result.exit_code, 1) << result.err;
  EXPECT_NE(result.err.find("attn: error: rank 1: --keys: expected the array rank 0 reads, (2, "
                            "13, 8) float32, got (2, 14, 8) float32"),
            std::string::npos)
      << result.err;
  EXPECT_FALSE(fs::exists(path("o.npy")));
  result = ring_per_rank({head + "--queries q.npy --keys k.npy --values v.npy --out o.npy",
                          head + "--queries q14.npy --keys k.npy --values v.npy --out o.npy"});
  EXPECT_EQ(result.exit_code, 1) << result.err;
  EXPECT_NE(result.err.find("rank 1: --queries: expected the array rank 0 reads"),
            std::string::npos)
      << result.err;
  // The type too: rank 0's output type follows its own files.
  for (const char* name : {"q16.npy", "k16.npy", "v16.npy"})
    save_npy_float16(path(name), std::vector<uint16_t>(2 * 13 * 8, 0x3C00), Shape{2, 13, 8});
  result = ring_per_rank({head + "--queries q.npy --keys k.npy --values v.npy --out o.npy",
                          head + "--queries q16.npy --keys k16.npy --values v16.npy --out o.npy"});
  EXPECT_EQ(result.exit_code, 1) << result.err;
  EXPECT_NE(result.err.find("rank 1: --queries: expected the array rank 0 reads, (2, 13, 8) "
                            "float32, got (2, 13, 8) float16"),
            std::string::npos)
      << result.err;
  // The file that differs is named, not a check of another file against it (rank 1's G, of
  // rank 0's output shape, was named against its own 14 queries).
  save("g.npy", testing::random_tensor(Shape{2, 13, 8}, rng));
  const std::string gradients = " --out-grad g.npy --grads-out gr";
  result = ring_per_rank(
      {head + "--queries q.npy --keys k.npy --values v.npy --out o.npy" + gradients,
       head + "--queries q14.npy --keys k.npy --values v.npy --out o.npy" + gradients});
  EXPECT_EQ(result.exit_code, 1) << result.err;
  EXPECT_NE(result.err.find("rank 1: --queries: expected the array rank 0 reads"),
            std::string::npos)
      << result.err;
  // A flag given to rank 0 only (the ranks would have run different passes).
  result =
      ring_per_rank({head + "--queries q.npy --keys k.npy --values v.npy --out o.npy" + gradients,
                     head + "--queries q.npy --keys k.npy --values v.npy --out o.npy"});
  EXPECT_EQ(result.exit_code, 1) << result.err;
  EXPECT_NE(result.err.find("rank 1: --out-grad: expected the array rank 0 reads, (2, 13, 8) "
                            "float32, got none"),
            std::string::npos)
      << result.err;
  EXPECT_FALSE(fs::exists(path("o.npy")));
  // The same arrays on every rank run.
  result = ring_per_rank({head + "--queries q.npy --keys k.npy --values v.npy --out o.npy",
                          head + "--queries q.npy --keys k.npy --values v.npy --out o.npy"});
  EXPECT_EQ(result.exit_code, 0) << result.err;
  // Rank 0 alone writes: another rank's output folders need not exist, as on another machine
  // (it stopped the run: "rank 1: --out elsewhere/o.npy: the folder 'elsewhere' does not exist").
  fs::create_directories(path("sub"));
  result = ring_per_rank(
      {head + "--queries q.npy --keys k.npy --values v.npy --out sub/o.npy" + gradients,
       head + "--queries q.npy --keys k.npy --values v.npy --out elsewhere/o.npy --out-grad g.npy "
              "--grads-out elsewhere/gr"});
  EXPECT_EQ(result.exit_code, 0) << result.err;
  EXPECT_TRUE(fs::exists(path("sub/o.npy")));
  EXPECT_TRUE(fs::exists(path("gr/queries.npy")));
  EXPECT_FALSE(fs::exists(path("elsewhere")));
}

// A file where --grads-out's folder would go is found before the work, as in a single-process
// run (the ring ran its forward and backward passes first, then failed "Not a directory").
TEST_F(RingCliTest, AFileInTheWayOfTheGradientsIsFoundFirst) {
  Rng rng(7);
  for (const char* name : {"q.npy", "k.npy", "v.npy", "g.npy"})
    save(name, testing::random_tensor(Shape{1, 9, 8}, rng));
  std::ofstream(path("gr")) << "a file";
  const CommandResult result = ring(2,
                                    "run --layer dot-product --queries q.npy --keys k.npy "
                                    "--values v.npy --out-grad g.npy --grads-out gr --out o.npy");
  EXPECT_EQ(result.exit_code, 1) << result.err;
  EXPECT_NE(result.err.find("--grads-out: cannot create the directory 'gr' (a file is in the way)"),
            std::string::npos)
      << result.err;
  EXPECT_EQ(result.out.find("forward"), std::string::npos) << result.out;
  EXPECT_FALSE(fs::exists(path("o.npy")));
}

// All outputs or none, as a single-process run: an --out that fails last leaves no gradient
// written, no gradients folder this run created, no temporary file; an existing gradient file
// keeps its old bytes.
TEST_F(RingCliTest, ALateFailureWritesNoOutput) {
  Rng rng(5);
  for (const char* name : {"q.npy", "k.npy", "v.npy", "g.npy"})
    save(name, testing::random_tensor(Shape{1, 9, 8}, rng));
  const std::string inputs =
      "run --layer dot-product --queries q.npy --keys k.npy --values v.npy --out-grad g.npy "
      "--grads-out gr";
  // A folder where no file can be created.
  CommandResult result = ring(2, inputs + " --out /proc/o.npy");
  EXPECT_EQ(result.exit_code, 1) << result.err;
  EXPECT_NE(result.err.find("--out: /proc/o.npy: cannot write the file"), std::string::npos)
      << result.err;
  EXPECT_FALSE(fs::exists(path("gr")));
  fs::create_directory(path("gr"));
  std::ofstream(path("gr/keys.npy")) << "an older gradient";
  result = ring(2, inputs + " --out /proc/o.npy");
  EXPECT_EQ(result.exit_code, 1) << result.err;
  EXPECT_EQ(read_text(path("gr/keys.npy")), "an older gradient");
  EXPECT_FALSE(fs::exists(path("gr/queries.npy")));
  for (const auto& entry : fs::recursive_directory_iterator(directory_)) {
    EXPECT_EQ(entry.path().filename().string().find(".attn-"), std::string::npos)
        << "temporary file left: " << entry.path();
  }
  // Where every output can be written: all of them, the old gradient replaced.
  result = ring(2, inputs + " --out o.npy");
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_TRUE(fs::exists(path("o.npy")));
  EXPECT_EQ(load_npy_tensor(path("gr/keys.npy"), "keys").shape(), (Shape{1, 9, 8}));
}

}  // namespace
}  // namespace attn
