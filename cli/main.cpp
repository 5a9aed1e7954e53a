// The attn command-line tool: sets up the subcommands and turns every error into a one-line
// message on stderr and exit code 1.
#include <omp.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <iostream>
#include <streambuf>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "attn/core/error.hpp"
#include "attn/core/pending_removal.hpp"
#include "attn/core/threads.hpp"
#include "bench_command.hpp"
#include "demo_command.hpp"
#include "generate_command.hpp"
#include "heatmap_command.hpp"
#include "ring_run.hpp"
#include "run_command.hpp"
#include "seq2seq_commands.hpp"
#include "train_command.hpp"

namespace {

// CLI11's own errors (unknown option, missing value, ...) read like attn's, and point to the help
// of the subcommand that was being parsed.
std::string usage_failure(const CLI::App* app, const CLI::Error& error) {
  // Down to the innermost one, e.g. `attn train nadaraya-watson`.
  std::string command = "attn";
  const CLI::App* innermost = app;
  for (auto selected = app->get_subcommands(); !selected.empty();
       selected = selected.front()->get_subcommands()) {
    innermost = selected.front();
    command += " " + innermost->get_name();
  }
  std::string message = error.what();
  // CLI11 checks that a required subcommand was given before it reports the words it could not
  // place, so `attn train bogus` read "A subcommand is required" without naming `bogus`.
  const std::vector<std::string> unplaced = innermost->remaining();
  if (innermost->get_require_subcommand_min() > 0 && innermost->get_subcommands().empty() &&
      !unplaced.empty()) {
    std::string choices;
    for (const CLI::App* subcommand :
         innermost->get_subcommands([](const CLI::App*) { return true; })) {
      choices += (choices.empty() ? "" : ", ") + subcommand->get_name();
    }
    message = "expected a subcommand of '" + command + "' (" + choices + "), got '" +
              unplaced.front() + "'";
  }
  return "attn: error: " + message + "\nRun '" + command + " --help' for more information.\n";
}

// std::cout's output through stdio, as the standard library's own buffer passes it, keeping the
// system's reason of the first write that failed: stdio keeps only a flag, and errno is long
// overwritten by the end of the command (a flush that failed in --version's std::endl left
// nothing for a later flush to retry, and no reason).
class ReasonKeepingStdout final : public std::streambuf {
 public:
  // errno of the first failed write or flush; 0 when none failed.
  int first_error() const { return first_error_; }

 protected:
  int_type overflow(int_type character) override {
    if (traits_type::eq_int_type(character, traits_type::eof())) {
      return traits_type::not_eof(character);
    }
    if (std::fputc(traits_type::to_char_type(character), stdout) == EOF) {
      remember_failure();
      return traits_type::eof();
    }
    return character;
  }
  std::streamsize xsputn(const char* text, std::streamsize count) override {
    const size_t written = std::fwrite(text, 1, static_cast<size_t>(count), stdout);
    if (written != static_cast<size_t>(count)) remember_failure();
    return static_cast<std::streamsize>(written);
  }
  int sync() override {
    if (std::fflush(stdout) == 0) return 0;
    remember_failure();
    return -1;
  }

 private:
  void remember_failure() {
    if (first_error_ == 0) first_error_ = errno != 0 ? errno : EIO;
  }
  int first_error_ = 0;
};

// Installs ReasonKeepingStdout under std::cout for the life of main, and puts the original back
// before it goes (the standard library flushes std::cout at exit, std::exit's included).
class StandardOutputWatch {
 public:
  StandardOutputWatch() : original_(std::cout.rdbuf(&buffer_)) {}
  ~StandardOutputWatch() { std::cout.rdbuf(original_); }
  StandardOutputWatch(const StandardOutputWatch&) = delete;
  StandardOutputWatch& operator=(const StandardOutputWatch&) = delete;

  // Writes to a full disk or a closed file may fail only when stdout's buffer is flushed, after a
  // command returned success; checked once, at the end, for every command, --help and --version
  // included. Returns `status`, or 1 with a message on stderr when output was lost.
  int checked(int status) {
    std::cout.flush();
    if (buffer_.first_error() == 0 && std::ferror(stdout) == 0) return status;
    const int reason = buffer_.first_error() != 0 ? buffer_.first_error() : EIO;
    std::cerr << "attn: error: cannot write to standard output (" << std::strerror(reason) << ")\n";
    return 1;
  }

 private:
  ReasonKeepingStdout buffer_;
  std::streambuf* original_;
};

// Whether this process is a rank other than 0 of an `attn run --ring` job under mpirun. Errors
// found before MPI starts (the flags, the checks of `attn run` itself) are every rank's alike, and
// each rank printed its own copy; rank 0 alone reports them.
bool quiet_ring_rank(int argc, char** argv) {
  if (std::find(argv + 1, argv + argc, std::string_view("--ring")) == argv + argc) return false;
  for (const char* variable : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"}) {
    const char* rank = std::getenv(variable);
    if (rank != nullptr) return std::string_view(rank) != "0";
  }
  return false;
}

// A failure's status on a quiet rank: 1, after a pause. mpirun ends the whole job at the first
// non-zero exit, which would cut rank 0 off before its message; rank 0 fails the same way at
// once, so its message is out before this rank's exit.
int quiet_failure() {
  std::this_thread::sleep_for(std::chrono::seconds(2));
  return 1;
}

// The arguments with each "--name=" (nothing after '=') split into "--name" and an empty value:
// CLI11 took the next argument as its value (`--xlabel= --ylabel=` labelled the x axis
// "--ylabel="), where the value typed is empty, which the options then accept (a label) or refuse
// by name (a number, a file). Arguments after a lone "--" stay as they are.
std::vector<std::string> with_empty_values_split(int argc, char** argv) {
  std::vector<std::string> arguments;
  bool options = true;
  for (int index = 0; index < argc; ++index) {
    std::string argument = argv[index];
    if (argument == "--") options = false;
    const bool empty_value = options && index > 0 && argument.size() > 3 &&
                             argument.starts_with("--") && argument.back() == '=' &&
                             argument.find('=') == argument.size() - 1;
    if (empty_value) {
      argument.pop_back();
      arguments.push_back(std::move(argument));
      arguments.emplace_back();
    } else {
      arguments.push_back(std::move(argument));
    }
  }
  return arguments;
}

// ValueError for an empty item in a comma-separated option's value ("--threads 1,,2", "--sizes
// 128,"): CLI11 drops empty items when it splits, so the run went on with fewer values than
// typed, where an empty value alone is refused by name.
void refuse_empty_list_items(const CLI::App& app, int argc, char** argv) {
  std::vector<std::string> list_options;
  for (const CLI::App* command : app.get_subcommands([](const CLI::App*) { return true; })) {
    for (const CLI::Option* option : command->get_options()) {
      if (option->get_delimiter() != ',') continue;
      for (const std::string& name : option->get_lnames()) list_options.push_back("--" + name);
    }
  }
  for (int index = 1; index < argc; ++index) {
    const std::string_view argument = argv[index];
    if (argument == "--") return;
    for (const std::string& name : list_options) {
      std::string_view value;
      if (argument == name && index + 1 < argc) {
        value = argv[index + 1];
      } else if (argument.starts_with(name + "=")) {
        value = argument.substr(name.size() + 1);
      } else {
        continue;
      }
      if (!value.empty() && (value.front() == ',' || value.back() == ',' ||
                             value.find(",,") != std::string_view::npos)) {
        throw attn::ValueError(name + ": expected comma-separated values, got an empty item in '" +
                               std::string(value) + "'");
      }
    }
  }
}

int run(CLI::App& app, int argc, char** argv) {
  const bool ring_rank = quiet_ring_rank(argc, argv);
  // Errors after run_ring started are its own to report (rank 0's collective message; a failure
  // on one rank alone is printed there).
  const auto quiet = [&] { return ring_rank && !attn::cli::ring_started(); };
  try {
    refuse_empty_list_items(app, argc, argv);
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    // --help and --version end parsing with code 0; every usage error is reported as 1.
    if (quiet()) return error.get_exit_code() == 0 ? 0 : quiet_failure();
    return app.exit(error) == 0 ? 0 : 1;
  } catch (const attn::Error& error) {
    if (quiet()) return quiet_failure();
    std::cerr << "attn: error: " << error.what() << '\n';
    return 1;
  } catch (const std::exception& error) {
    // Out of memory or a failing standard-library call: still a message, never a crash.
    if (quiet()) return quiet_failure();
    std::cerr << "attn: error: " << error.what() << '\n';
    return 1;
  }
  if (app.get_subcommands().empty()) std::cout << app.help();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // A write past a file-size limit (ulimit -f) must fail with EFBIG rather than kill the process:
  // the writers then remove their temporary files and empty --grads-out folders, and the error
  // names the file with the system's reason. By default SIGXFSZ ended attn at once (exit 153, no
  // message, the temporaries left behind). SIGPIPE keeps its default, as for other Unix tools: a
  // reader that closed the pipe (attn bench | head) ends attn at once, where ignoring it would let
  // a long benchmark run on to its end for nobody.
  std::signal(SIGXFSZ, SIG_IGN);
  // Ctrl-C (or SIGTERM, SIGHUP: mpirun passes them on to its ranks) mid-write left the staged
  // temporaries of `attn run` and a --grads-out folder it had made: removed, then the process ends
  // by the signal as before.
  attn::remove_pending_paths_on_signals();
  // OMP_NUM_THREADS above attn's maximum is capped to it, as the Python module caps it: at 100000
  // GNU OpenMP crashed at the first parallel region of many threads (`attn run` at n = 8192,
  // `attn generate`'s first projection), and a few thousand started that many threads.
  if (omp_get_max_threads() > attn::kMaxThreads) omp_set_num_threads(attn::kMaxThreads);
  // Static: it outlives main's locals when std::exit ends a failed ring run, and goes before the
  // standard streams' final flush.
  static StandardOutputWatch standard_output;
  CLI::App app{
      "attn: the attention mechanisms of \"Dive into Deep Learning\" (masked softmax, additive, "
      "dot-product and multi-head attention) on the CPU.\nExit status: 0 on success, 1 on any "
      "error.",
      "attn"};
  app.set_version_flag("--version", "attn " ATTN_VERSION, "Print the version and exit");
  app.require_subcommand(0, 1);
  app.option_defaults()->always_capture_default();
  app.failure_message(usage_failure);
  attn::cli::add_demo_command(app);
  attn::cli::add_run_command(app);
  attn::cli::add_heatmap_command(app);
  attn::cli::add_train_command(app);
  attn::cli::add_translate_command(app);
  attn::cli::add_bench_command(app);
  attn::cli::add_generate_command(app);

  std::vector<std::string> arguments = with_empty_values_split(argc, argv);
  std::vector<char*> pointers;
  for (std::string& argument : arguments) pointers.push_back(argument.data());
  pointers.push_back(nullptr);
  return standard_output.checked(run(app, static_cast<int>(arguments.size()), pointers.data()));
}
