// `attn run` and `attn heatmap` under careless or hostile use: every output is checked before the
// first is written (folder, extension, two outputs one file, an output that is an input, gradients
// over the inputs' own names), a write that fails midway (a file-size limit) keeps the old --out,
// a result that would overflow float is an error instead of an infinite file, and hostile input
// files (empty giants, deep JSON, FIFOs) are clean errors; a signal mid-write leaves nothing
// behind.
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstring>
#include <limits>

#include "attn/core/half.hpp"
#include "attn/core/pending_removal.hpp"
#include "attn/io/safetensors.hpp"
#include "attn/nn/multi_head_attention.hpp"
#include "cli_fixture.hpp"
#include "command_support.hpp"

namespace attn {
namespace {

using testing::random_tensor;

class OutputSafetyTest : public CliTest {
 protected:
  void SetUp() override {
    CliTest::SetUp();
    write_inputs(4, 4, 6, 31);
    save("old.npy", Tensor::full(Shape{1}, 42.0F));
    old_ = read_text(path("old.npy"));
  }
  // The run fails with `message`, and old.npy (given as --out) is untouched.
  void expect_refused(const std::string& arguments, const std::string& message) {
    expect_error("run --layer dot-product " + kInputArguments + " " + arguments, message);
    EXPECT_EQ(read_text(path("old.npy")), old_) << arguments;
  }
  std::string old_;
};

TEST_F(OutputSafetyTest, EveryOutputIsCheckedBeforeAnyIsWritten) {
  expect_refused("--out old.npy --weights-out missing/w.npy",
                 "--weights-out missing/w.npy: the folder 'missing' does not exist");
  expect_refused("--out old.npy --heatmap h.bmp",
                 "--heatmap: expected a picture ending in .png, .svg or .pdf, got 'h.bmp'");
  expect_refused("--out old.npy --weights-out w.txt",
                 "--weights-out: expected a file name ending in .npy, got 'w.txt'");
  expect_refused("--out old.npy --weights-out ./old.npy",
                 "--weights-out ./old.npy: the same file as --out old.npy");
  expect_refused("--out old.npy --heatmap missing/h.png", "the folder 'missing' does not exist");
  EXPECT_FALSE(fs::exists(path("w.txt")));
}

TEST_F(OutputSafetyTest, NoOutputOverwritesAnInput) {
  const std::string before = read_text(path("q.npy"));
  expect_error(
      "run --layer dot-product " + kInputArguments + " --out q.npy",
      "--out q.npy: the same file as --queries q.npy (writing it would overwrite an input)");
  expect_error("run --layer dot-product " + kInputArguments + " --out o.npy --weights-out k.npy",
               "--weights-out k.npy: the same file as --keys k.npy");
  // Through a symbolic link too.
  fs::create_symlink("v.npy", path("link.npy"));
  expect_error("run --layer dot-product " + kInputArguments + " --out link.npy",
               "the same file as --values v.npy");
  // Gradients into the folder that holds the inputs: queries.npy is one of them.
  fs::copy_file(path("q.npy"), path("queries.npy"));
  Rng rng(32);
  save("g.npy", random_tensor(Shape{2, 3, 6}, rng));
  expect_error(
      "run --layer dot-product --queries queries.npy --keys k.npy --values v.npy "
      "--out o.npy --out-grad g.npy --grads-out .",
      "--grads-out (queries) ./queries.npy: the same file as --queries queries.npy");
  EXPECT_FALSE(fs::exists(path("o.npy")));
  EXPECT_EQ(read_text(path("q.npy")), before);
  EXPECT_EQ(read_text(path("queries.npy")), before);
}

TEST_F(OutputSafetyTest, AWriteThatFailsMidwayKeepsTheOldOutput) {
  // 128 KiB of output under a 64 KiB file-size limit (SIGXFSZ ignored, so write() fails with
  // EFBIG): the command fails naming the reason, and old.npy keeps its bytes.
  Rng rng(33);
  save("q.npy", random_tensor(Shape{2, 2048, 4}, rng));
  const CommandResult result =
      attn("run --layer dot-product " + kInputArguments + " --out old.npy; trap '' XFSZ");
  ASSERT_EQ(result.exit_code, 0) << result.err;  // without a limit the run works
  save("old.npy", Tensor::full(Shape{1}, 42.0F));
  const std::string command =
      "cd '" + directory_.string() + "' && trap '' XFSZ && ulimit -f 64 && '" +
      ATTN_CLI_PATH "' run --layer dot-product " + kInputArguments + " --out old.npy 2> stderr.txt";
  const int status = std::system(command.c_str());
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 1) << status;
  EXPECT_NE(read_text(path("stderr.txt")).find("old.npy: cannot write the file (File too large)"),
            std::string::npos)
      << read_text(path("stderr.txt"));
  EXPECT_EQ(read_text(path("old.npy")), old_);
  for (const auto& entry : fs::directory_iterator(directory_)) {
    EXPECT_EQ(entry.path().filename().string().find(".attn-"), std::string::npos)
        << "temporary file left: " << entry.path();
  }
}

// SIGXFSZ's default action, whatever the process running the tests was given, so that attn
// meets it as a shell started from a terminal would, then the previous one again.
class DefaultSignalActions {
 public:
  DefaultSignalActions() : xfsz_(std::signal(SIGXFSZ, SIG_DFL)) {}
  ~DefaultSignalActions() { std::signal(SIGXFSZ, xfsz_); }
  DefaultSignalActions(const DefaultSignalActions&) = delete;
  DefaultSignalActions& operator=(const DefaultSignalActions&) = delete;

 private:
  void (*xfsz_)(int);
};

// The same without the shell's `trap '' XFSZ`: a file-size limit used to kill attn with SIGXFSZ
// (exit 153, no message), leaving its temporary files and an empty --grads-out folder behind.
TEST_F(OutputSafetyTest, AFileSizeLimitIsAnErrorThatLeavesNothingBehind) {
  Rng rng(34);
  save("q.npy", random_tensor(Shape{2, 2048, 4}, rng));
  save("g.npy", random_tensor(Shape{2, 2048, 6}, rng));
  save("w.npy", random_tensor(Shape{4, 64, 64}, rng));
  const DefaultSignalActions default_actions;
  const auto limited = [&](const std::string& arguments) {
    const std::string command = "cd '" + directory_.string() + "' && ulimit -f 64 && '" +
                                ATTN_CLI_PATH "' " + arguments + " 2> stderr.txt";
    const int status = std::system(command.c_str());
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 1) << arguments << ": " << status;
    return read_text(path("stderr.txt"));
  };
  std::string err = limited("run --layer dot-product " + kInputArguments +
                            " --out old.npy --out-grad g.npy --grads-out gr");
  EXPECT_NE(err.find("cannot write the file (File too large)"), std::string::npos) << err;
  EXPECT_EQ(read_text(path("old.npy")), old_);
  EXPECT_FALSE(fs::exists(path("gr")));
  // An SVG of 4 panels of 64 × 64 cells, a rectangle each, is far past 64 KiB.
  err = limited("heatmap w.npy --out h.svg");
  EXPECT_NE(err.find("File too large"), std::string::npos) << err;
  EXPECT_FALSE(fs::exists(path("h.svg")));
  for (const auto& entry : fs::directory_iterator(directory_)) {
    EXPECT_EQ(entry.path().filename().string().find(".attn-"), std::string::npos)
        << "temporary file left: " << entry.path();
  }
}

// A signal that ends a run mid-write (Ctrl-C, or mpirun passing SIGTERM on) removes the staged
// temporaries and the --grads-out folder the run made (a ring run interrupted at 0.2 s left them;
// write_atomically's own temporaries are registered alike), and the process still ends by it. The
// run's writing steps (write_with_gradients_directory, StagedOutputs, save_npy) in a forked child
// that raises SIGINT inside the last write, with the handlers main installs.
TEST_F(OutputSafetyTest, ASignalMidWriteLeavesNothingBehind) {
  const fs::path gradients = path("gr");
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    remove_pending_paths_on_signals();
    cli::write_with_gradients_directory(gradients.string(), [&] {
      cli::StagedOutputs staged;
      staged.write("--grads-out", gradients / "queries.npy", [](const fs::path& file) {
        save_npy(file, Tensor(Shape{2, 3}));
      });
      staged.write("--out", path("o.npy"), [](const fs::path& file) {
        std::ofstream(file) << "half an output";
        std::raise(SIGINT);
      });
      staged.commit();
    });
    ::_exit(0);  // not reached
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFSIGNALED(status)) << status;
  EXPECT_EQ(WTERMSIG(status), SIGINT);
  EXPECT_FALSE(fs::exists(gradients));
  EXPECT_FALSE(fs::exists(path("o.npy")));
  for (const auto& entry : fs::recursive_directory_iterator(directory_)) {
    const std::string name = entry.path().filename().string();
    EXPECT_EQ(name.find(".attn-"), std::string::npos) << "temporary file left: " << entry.path();
  }
}

// All outputs or none: an output that fails last (--out is written after the heatmap, the weights
// and the gradients) leaves none of the others written, no temporary file, and an existing file
// as it was; a tensor name the safetensors writer refuses is refused before the run.
TEST_F(OutputSafetyTest, ALateFailureWritesNoOutput) {
  Rng rng(35);
  save("g.npy", random_tensor(Shape{2, 3, 6}, rng));
  std::ofstream(path("h.png")) << "an older picture";
  const std::string outputs = "--heatmap h.png --weights-out w.npy --out-grad g.npy --grads-out gr";
  // A folder where no file can be created.
  expect_error("run --layer dot-product " + kInputArguments + " --out /proc/o.npy " + outputs,
               "--out: /proc/o.npy: cannot write the file");
  EXPECT_EQ(read_text(path("h.png")), "an older picture");
  EXPECT_FALSE(fs::exists(path("w.npy")));
  EXPECT_FALSE(fs::exists(path("gr")));
  // A gradients folder that exists is kept, empty.
  fs::create_directory(path("gr"));
  expect_error("run --layer dot-product " + kInputArguments + " --out /proc/o.npy " + outputs,
               "--out: /proc/o.npy: cannot write the file");
  EXPECT_TRUE(fs::is_empty(path("gr")));
  fs::remove(path("gr"));
  expect_error(
      "run --layer dot-product " + kInputArguments + " --out o.safetensors:__metadata__ " + outputs,
      "--out: expected a tensor name other than '__metadata__'");
  EXPECT_EQ(read_text(path("h.png")), "an older picture");
  EXPECT_FALSE(fs::exists(path("w.npy")));
  EXPECT_FALSE(fs::exists(path("gr")));
  EXPECT_FALSE(fs::exists(path("o.safetensors")));
  for (const auto& entry : fs::directory_iterator(directory_)) {
    EXPECT_EQ(entry.path().filename().string().find(".attn-"), std::string::npos)
        << "temporary file left: " << entry.path();
  }
  // The same outputs where every one can be written: all of them, the old picture replaced.
  const CommandResult result =
      attn("run --layer dot-product " + kInputArguments + " --out o.safetensors:y " + outputs);
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_TRUE(starts_with_bytes(path("h.png"), kPngSignature));
  EXPECT_TRUE(fs::exists(path("w.npy")));
  EXPECT_TRUE(fs::exists(path("gr/queries.safetensors")));
  EXPECT_EQ(load_safetensors(path("o.safetensors")).count("y"), 1U);
  for (const auto& entry : fs::directory_iterator(directory_)) {
    EXPECT_EQ(entry.path().filename().string().find(".attn-"), std::string::npos)
        << "temporary file left: " << entry.path();
  }
}

TEST_F(OutputSafetyTest, ValuesNearFloatMaxGiveAFiniteOutput) {
  Rng rng(34);
  // Normal values of deviation 8e37: a few near ±2e38, and the kernel's sum over 5 keys beyond
  // float without the power-of-two scaling.
  save("v.npy", random_tensor(Shape{2, 5, 6}, rng, 8.0e37F));
  ASSERT_EQ(attn("run --layer dot-product " + kInputArguments + " --out o.npy").exit_code, 0);
  const Tensor output = load_npy_tensor(path("o.npy"), "o");
  for (const float value : output.span()) EXPECT_TRUE(std::isfinite(value));
}

TEST_F(OutputSafetyTest, AMultiHeadProjectionThatOverflowsIsAnError) {
  MultiHeadAttention layer(4, 4, 6, 4, 2, 0.0F);
  StateDict state = layer.state_dict();
  // Positive values and W_v: each concatenated head is 6 · 4 = 24, each output 4 · 24 · 3e38.
  for (float& w : state.at("W_v.weight").span()) w = 1.0F;
  for (float& w : state.at("W_o.weight").span()) w = 3.0e38F;
  save_safetensors(path("p.safetensors"), state);
  save("v.npy", Tensor::full(Shape{2, 5, 6}, 4.0F));
  expect_error("run --layer multi-head --heads 2 --params p.safetensors " + kInputArguments +
                   " --out old.npy",
               "W_o: the projection of the concatenated heads overflows float32");
  EXPECT_EQ(read_text(path("old.npy")), old_);
}

// A float16 run writes its gradients as float16 bits; one beyond float16's range (a key every
// query attends to alone, G near float16's largest) is an error naming the file and the dtype,
// and nothing is written.
TEST_F(OutputSafetyTest, AFloat16GradientThatOverflowsIsAnError) {
  const auto half_file = [&](const std::string& name, const Shape& shape, float value) {
    const std::vector<uint16_t> bits(static_cast<size_t>(shape.numel()), float_to_half(value));
    save_npy_float16(path(name), bits, shape);
  };
  // 8 queries against one key: P = 1, so dV = Σ_i G_i = 8 · 60000 > 65504.
  half_file("q16.npy", Shape{1, 8, 4}, 0.5F);
  half_file("k16.npy", Shape{1, 1, 4}, 0.5F);
  half_file("v16.npy", Shape{1, 1, 4}, 1.0F);
  half_file("g16.npy", Shape{1, 8, 4}, 60000.0F);
  expect_error(
      "run --layer dot-product --queries q16.npy --keys k16.npy --values v16.npy --out old.npy "
      "--out-grad g16.npy --grads-out grads",
      "--grads-out (values): the result holds inf at flat index 0 although every input is finite "
      "(it overflows float16)");
  EXPECT_EQ(read_text(path("old.npy")), old_);
  EXPECT_FALSE(fs::exists(path("grads")));
}

TEST_F(OutputSafetyTest, HostileInputFilesAreCleanErrors) {
  // 128 bytes that claim 2^31 queries of width 0.
  std::ofstream(path("giant.npy"), std::ios::binary)
      << testing::npy_header("<f4", "(1, 2147483648, 0)");
  expect_error(
      "run --layer dot-product --queries giant.npy --keys giant.npy --values giant.npy "
      "--out o.npy",
      "--queries: giant.npy: shape (1, 2147483648, 0) holds no data");
  // JSON nested 300 000 levels deep in a safetensors header's metadata.
  const std::string header =
      "{\"__metadata__\":" + std::string(300000, '[') + std::string(300000, ']') + "}";
  std::string file(8, '\0');
  const uint64_t size = header.size();
  std::memcpy(file.data(), &size, 8);
  std::ofstream(path("deep.safetensors"), std::ios::binary) << file << header;
  expect_error("run --layer additive --params deep.safetensors " + kInputArguments + " --out o.npy",
               "--params: deep.safetensors: header nests arrays and objects deeper than 64");
  // A FIFO as an input: refused at once, not waited on.
  ASSERT_EQ(::mkfifo(path("fifo.npy").c_str(), 0600), 0);
  expect_error("run --layer dot-product --queries fifo.npy --keys k.npy --values v.npy --out o.npy",
               "fifo.npy: cannot read the file (expected a regular file, got a FIFO");
  expect_error("heatmap fifo.npy --out h.png", "got a FIFO");
  expect_error("heatmap q.npy --out q.png --titles a", "titles");
  EXPECT_FALSE(fs::exists(path("o.npy")));
}

}  // namespace
}  // namespace attn
