// `attn train seq2seq` and `attn translate`: data preparation and the held-out split, the progress
// bar, the loss curve, sample translations with BLEU, alignment heatmaps, and the model directory.
#include "seq2seq_commands.hpp"

#include <unistd.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "attn/core/error.hpp"
#include "attn/core/random.hpp"
#include "attn/seq2seq/bleu.hpp"
#include "attn/seq2seq/corpus.hpp"
#include "attn/seq2seq/dates.hpp"
#include "attn/seq2seq/model.hpp"
#include "attn/seq2seq/training.hpp"
#include "attn/seq2seq/translator.hpp"
#include "attn/seq2seq/vocabulary.hpp"
#include "attn/viz/heatmap.hpp"
#include "attn/viz/line_plot.hpp"
#include "command_support.hpp"
#include "file_name_check.hpp"
#include "number_options.hpp"

namespace attn::cli {

namespace {

namespace fs = std::filesystem;

// Defaults chosen for the date task: large enough to reach the BLEU ≥ 0.95 and exact
// match ≥ 90%, small enough to train in well under five minutes on two shared cores.
struct TrainSeq2SeqOptions {
  std::string data;
  std::string out;
  int64_t epochs = 0;  // 0: the task's default
  uint64_t seed = 0;
  int64_t examples = 20000;
  int64_t held_out = 1000;
  int64_t batch_size = 64;
  float lr = 0.005F;
  int64_t embed_size = 32;
  int64_t num_hiddens = 64;
  int64_t num_layers = 1;
  float dropout = 0.0F;
  int64_t num_steps = 0;  // 0: the task's default
  int64_t samples = 6;
  // Off by default (a deliberate deviation from the book, see Seq2SeqConfig::attend_to_eos).
  bool attend_to_eos = false;
};

constexpr int64_t kDateEpochs = 4;
constexpr int64_t kDateSteps = 10;
constexpr int64_t kCorpusEpochs = 30;
constexpr int64_t kCorpusSteps = 10;

struct PreparedData {
  TokenizerKind tokenizer = TokenizerKind::kDates;
  std::vector<TextPair> train;
  std::vector<TextPair> held_out;
  int64_t min_freq = 1;
};

PreparedData prepare_dates(const TrainSeq2SeqOptions& options) {
  PreparedData data;
  data.tokenizer = TokenizerKind::kDates;
  data.train = generate_date_pairs(options.examples, options.seed);
  std::set<std::string> seen;
  for (const TextPair& pair : data.train) seen.insert(pair.source);
  // Held-out dates come from another stream and never repeat a training source.
  uint64_t stream = options.seed ^ 0x7e57'da7e'0000'0001ULL;
  while (static_cast<int64_t>(data.held_out.size()) < options.held_out) {
    for (TextPair& pair : generate_date_pairs(options.held_out, stream++)) {
      if (static_cast<int64_t>(data.held_out.size()) >= options.held_out) break;
      if (seen.insert(pair.source).second) data.held_out.push_back(std::move(pair));
    }
  }
  return data;
}

PreparedData prepare_corpus(const TrainSeq2SeqOptions& options) {
  PreparedData data;
  data.tokenizer = TokenizerKind::kBook;
  data.min_freq = 2;  // the book's MTFraEng vocabulary
  std::vector<TextPair> pairs =
      with_context("--data", [&] { return read_tsv_pairs(options.data); });
  if (pairs.size() < 2) {
    throw ValueError("--data " + options.data +
                     ": expected at least 2 sentence pairs (training and held-out), got " +
                     std::to_string(pairs.size()));
  }
  Rng rng(options.seed);
  for (size_t i = pairs.size() - 1; i > 0; --i)
    std::swap(pairs[i], pairs[static_cast<size_t>(rng.next_u64() % (i + 1))]);
  const auto held_out = static_cast<size_t>(
      std::clamp<int64_t>(static_cast<int64_t>(pairs.size()) / 10, 1, options.held_out));
  data.held_out.assign(pairs.begin(), pairs.begin() + static_cast<std::ptrdiff_t>(held_out));
  data.train.assign(pairs.begin() + static_cast<std::ptrdiff_t>(held_out), pairs.end());
  return data;
}

std::string format_rate(double rate) {
  std::ostringstream text;
  text << std::fixed << std::setprecision(rate >= 100 ? 0 : 1) << rate;
  return text.str();
}

// One line, redrawn in place on a terminal; elsewhere (a log file) one line per epoch.
class ProgressBar {
 public:
  ProgressBar() : interactive_(isatty(fileno(stdout)) != 0) {}

  void update(const Seq2SeqTrainingProgress& progress) {
    const bool epoch_done = progress.batch == progress.batches;
    const auto now = std::chrono::steady_clock::now();
    if (interactive_ && !epoch_done && now - last_draw_ < std::chrono::milliseconds(100)) return;
    if (!interactive_ && !epoch_done) return;
    last_draw_ = now;
    constexpr int kWidth = 24;
    const double done = static_cast<double>(progress.batch) / static_cast<double>(progress.batches);
    const int filled = static_cast<int>(done * kWidth);
    std::ostringstream line;
    line << "epoch " << std::setw(3) << progress.epoch << "/" << progress.epochs << " ["
         << std::string(static_cast<size_t>(filled), '#')
         << std::string(static_cast<size_t>(kWidth - filled), '.') << "] " << std::setw(3)
         << static_cast<int>(done * 100) << "%  loss " << std::fixed << std::setprecision(4)
         << progress.epoch_loss << "  " << format_rate(progress.tokens_per_second) << " tokens/s  "
         << std::setprecision(1) << progress.seconds << " s";
    if (interactive_) {
      std::cout << "\r" << line.str() << (epoch_done ? "\n" : "") << std::flush;
    } else {
      std::cout << line.str() << "\n" << std::flush;
    }
  }

 private:
  bool interactive_;
  std::chrono::steady_clock::time_point last_draw_{};
};

// The heatmap of held-out sample i (from 0) in --out.
fs::path heatmap_path(const fs::path& out, int64_t i) {
  return out / ("attention_" + std::to_string(i + 1) + ".png");
}

void save_attention_heatmap(const Translation& translation, const fs::path& path,
                            const std::string& title, const std::string& option) {
  if (translation.attention.numel() == 0) return;
  HeatmapOptions heatmap;
  heatmap.xlabel = "Source tokens (keys)";
  heatmap.ylabel = "Predicted tokens (queries)";
  heatmap.titles = {title};
  heatmap.x_tick_labels = translation.source_tokens;
  heatmap.y_tick_labels = translation.tokens;
  if (static_cast<int64_t>(heatmap.y_tick_labels.size()) < translation.attention.dim(0))
    heatmap.y_tick_labels.push_back("<eos>");
  heatmap.panel_size = 240.0;
  with_context(option, [&] { save_heatmaps(translation.attention, path, heatmap); });
}

void save_loss_curve(const Seq2SeqTrainingHistory& history, int64_t batches_per_epoch,
                     const fs::path& path) {
  LineSeries batches{"batch loss", {}, {}, LineSeries::Style::kLine};
  for (size_t i = 0; i < history.batch_losses.size(); ++i) {
    batches.x.push_back(static_cast<double>(i + 1) / static_cast<double>(batches_per_epoch));
    batches.y.push_back(history.batch_losses[i]);
  }
  LineSeries epochs{"epoch mean", {}, {}, LineSeries::Style::kMarkers};
  for (size_t i = 0; i < history.epoch_losses.size(); ++i) {
    epochs.x.push_back(static_cast<double>(i + 1));
    epochs.y.push_back(history.epoch_losses[i]);
  }
  LinePlotOptions plot;
  plot.title = "Seq2seq with Bahdanau attention: training loss";
  plot.xlabel = "epoch";
  plot.ylabel = "cross-entropy per token";
  plot.log_y = true;
  save_line_plot({batches, epochs}, path, plot);
}

void train_seq2seq_command(const TrainSeq2SeqOptions& options) {
  if (options.examples < 1 || options.held_out < 1) {
    throw ValueError("--examples and --held-out: expected at least 1, got " +
                     std::to_string(options.examples) + " and " + std::to_string(options.held_out));
  }
  const bool dates = options.data.empty();
  const PreparedData data = dates ? prepare_dates(options) : prepare_corpus(options);
  const int64_t epochs = options.epochs > 0 ? options.epochs : dates ? kDateEpochs : kCorpusEpochs;
  const int64_t num_steps = options.num_steps > 0 ? options.num_steps
                            : dates               ? kDateSteps
                                                  : kCorpusSteps;

  const ParallelCorpus train = tokenize_pairs(data.train, data.tokenizer);
  const ParallelCorpus held_out = tokenize_pairs(data.held_out, data.tokenizer);
  Vocabulary source_vocabulary(train.source, data.min_freq);
  Vocabulary target_vocabulary(train.target, data.min_freq);
  const EncodedSequences source = encode_sequences(train.source, source_vocabulary, num_steps);
  const EncodedSequences target = encode_sequences(train.target, target_vocabulary, num_steps);

  Seq2SeqConfig config;
  config.source_vocab_size = source_vocabulary.size();
  config.target_vocab_size = target_vocabulary.size();
  config.embed_size = options.embed_size;
  config.num_hiddens = options.num_hiddens;
  config.num_layers = options.num_layers;
  config.dropout = options.dropout;
  config.attend_to_eos = options.attend_to_eos;
  Seq2Seq model(config, options.seed);
  int64_t parameter_count = 0;
  for (const NamedParameter& parameter : model.parameters())
    parameter_count += parameter.tensor->numel();

  std::cout << "attn train seq2seq: " << (dates ? "bundled date task" : "corpus " + options.data)
            << ", " << train.source.size() << " training and " << held_out.source.size()
            << " held-out pairs; vocabularies " << source_vocabulary.size() << " (source) and "
            << target_vocabulary.size() << " (target) tokens\nmodel: embedding "
            << config.embed_size << ", GRU " << config.num_layers << " x " << config.num_hiddens
            << ", dropout " << config.dropout << ", " << parameter_count << " parameters; Adam lr "
            << options.lr << ", batch " << options.batch_size << ", " << epochs << " epochs, seed "
            << options.seed << "\n";

  // Before training, which takes a while: a file in the way of --out fails now, not after it.
  const fs::path out = options.out;
  // The folders this run makes (the path's missing tail), removed again if training fails.
  std::error_code ignored;
  std::vector<fs::path> made;
  for (fs::path folder = out; !folder.empty() && !fs::exists(folder, ignored);
       folder = folder.parent_path()) {
    made.push_back(folder);
    if (folder == folder.parent_path()) break;
  }
  create_output_directory(out);
  // The model's files too (a folder named config.json failed after training), every one of them,
  // and the held-out samples' heatmaps (a folder named attention_3.png failed after training,
  // and the model was never saved).
  const int64_t samples =
      std::min<int64_t>(options.samples, static_cast<int64_t>(held_out.source.size()));
  std::vector<OutputFile> outputs = {{"--out", out / "model.safetensors"},
                                     {"--out", out / "vocab.json"},
                                     {"--out", out / "config.json"},
                                     {"--out", out / "loss.png", OutputKind::kPicture}};
  for (int64_t i = 0; i < samples; ++i)
    outputs.push_back({"--out", heatmap_path(out, i), OutputKind::kPicture});
  check_outputs(outputs, options.data.empty() ? std::vector<CommandFile>{}
                                              : std::vector<CommandFile>{{"--data", options.data}});

  Seq2SeqTrainingOptions training;
  training.epochs = epochs;
  training.batch_size = options.batch_size;
  training.lr = options.lr;
  training.seed = options.seed;
  ProgressBar bar;
  Seq2SeqTrainingHistory history;
  try {
    history =
        train_seq2seq(model, source, target, training,
                      [&bar](const Seq2SeqTrainingProgress& progress) { bar.update(progress); });
  } catch (const ValueError& error) {
    // The folders this run made go (empty: nothing is written before training ends).
    for (const fs::path& folder : made) fs::remove(folder, ignored);
    // Gradients or a loss that are not finite: the learning rate the user gave sent the weights
    // off (the library names clip_grad_norm, which found it).
    if (std::string_view(error.what()).find("finite") == std::string_view::npos) throw;
    rethrow_with_message(error, "--lr: training diverged with learning rate " +
                                    float_text(options.lr) + " (" + error.what() +
                                    "); try a smaller learning rate");
  }
  std::cout << "trained in " << std::fixed << std::setprecision(1) << history.seconds << " s ("
            << format_rate(static_cast<double>(history.tokens) / std::max(history.seconds, 1e-9))
            << " tokens/s)\n";

  const int64_t batches = (source.count + options.batch_size - 1) / options.batch_size;
  with_context("--out", [&] { save_loss_curve(history, batches, out / "loss.png"); });
  std::cout << "loss curve: " << (out / "loss.png").string() << "\n";

  Translator translator(std::move(model), std::move(source_vocabulary),
                        std::move(target_vocabulary), data.tokenizer, num_steps);
  const std::vector<Translation> translations = translator.translate(held_out.source);
  std::vector<std::vector<std::string>> predictions;
  for (const Translation& translation : translations) predictions.push_back(translation.tokens);
  const TranslationScores scores = score_translations(predictions, held_out.target);

  // The model first: a picture that then fails to draw costs no training.
  translator.save(out, {{"epochs", epochs},
                        {"batch_size", options.batch_size},
                        {"lr", shortest_double(options.lr)},
                        {"seed", options.seed},
                        {"training_pairs", static_cast<int64_t>(train.source.size())},
                        {"seconds", history.seconds},
                        {"final_loss", history.epoch_losses.back()},
                        {"held_out_pairs", scores.count},
                        {"held_out_bleu", scores.bleu},
                        {"held_out_exact_match", scores.exact_match}});
  // --samples 0 asks for none: no empty header, no heatmaps to name.
  if (samples > 0) std::cout << "\nheld-out translations:\n";
  for (int64_t i = 0; i < samples; ++i) {
    const auto at = static_cast<size_t>(i);
    std::cout << "  " << data.held_out[at].source << " => " << translations[at].text
              << "  (reference " << data.held_out[at].target << ", BLEU " << std::setprecision(3)
              << bleu(translations[at].tokens, held_out.target[at]) << ")\n";
    save_attention_heatmap(translations[at], heatmap_path(out, i), data.held_out[at].source,
                           "--out");
  }
  if (samples > 0) {
    std::cout << "attention heatmaps: " << (out / "attention_1.png").string() << " ... attention_"
              << samples << ".png\n";
  }
  std::cout << "held-out (" << scores.count << " pairs): BLEU " << std::setprecision(4)
            << scores.bleu << ", exact match " << std::setprecision(1) << 100.0 * scores.exact_match
            << "%\n";

  std::cout << "model: " << (out / "model.safetensors").string() << ", "
            << (out / "vocab.json").string() << ", " << (out / "config.json").string() << "\n";
}

struct TranslateOptions {
  std::string model;
  std::string text;
  std::string heatmap;
};

// The encoder reads num_steps tokens, <eos> included, and the rest of a longer sentence is dropped
// as the book's truncate_pad drops it: a translation of part of the sentence, with nothing to say
// so unless the command says it (the library stays quiet; Translation counts the tokens).
void warn_when_cut(const Translation& translation, int64_t num_steps) {
  const int64_t length = translation.source_length;
  if (length < num_steps) return;
  std::cerr << "attn translate: warning: the sentence has " << length << " tokens and the model "
            << "reads " << num_steps << " (num_steps in its config.json, <eos> included): ";
  if (length == num_steps) {
    std::cerr << "it reads every token but not the <eos> that ends the sentence";
  } else {
    const int64_t dropped = length - num_steps;
    std::cerr << "the last " << dropped << (dropped == 1 ? " token is" : " tokens are")
              << " not translated, nor the <eos>";
  }
  std::cerr << "\n";
}

void translate_command(const TranslateOptions& options) {
  // Translator::load says "no such model directory" for anything but a directory; a file that
  // exists is a different mistake (a model file given for its folder, say).
  std::error_code error;
  const fs::file_status model_status = fs::status(options.model, error);
  if (fs::exists(model_status) && !fs::is_directory(model_status)) {
    throw FileError("--model: " + options.model +
                    ": expected a model directory (written by 'attn train seq2seq', holding "
                    "model.safetensors, vocab.json and config.json), got a file that is not a "
                    "directory");
  }
  if (!options.heatmap.empty()) {
    const fs::path model = options.model;
    check_outputs({{"--heatmap", options.heatmap, OutputKind::kPicture}},
                  {{"--model", model / "config.json"},
                   {"--model", model / "vocab.json"},
                   {"--model", model / "model.safetensors"}});
  }
  Translator translator = with_context("--model", [&] { return Translator::load(options.model); });
  const Translation translation = translator.translate(options.text);
  warn_when_cut(translation, translator.num_steps());
  std::cout << translation.text << "\n";
  if (!options.heatmap.empty()) {
    save_attention_heatmap(translation, options.heatmap, options.text, "--heatmap");
    std::cerr << "attention heatmap: " << options.heatmap << "\n";
  }
}

}  // namespace

void add_train_seq2seq_command(CLI::App& train) {
  auto options = std::make_shared<TrainSeq2SeqOptions>();
  CLI::App* command = train.add_subcommand(
      "seq2seq", "Train a GRU encoder-decoder with Bahdanau attention (the book's seq2seq)");
  command->footer(
      "Without --data, the bundled task: dates in many written forms (\"3 march 1987\", "
      "\"tuesday, march 3, 1987\", \"03/03/87\", ...) to ISO form (\"1987-03-03\"), generated "
      "from --seed. With --data, a tab-separated file of \"source<TAB>target\" lines (like the "
      "book's fra-eng; a third column, Tatoeba's attribution, is ignored), lower-cased with spaces "
      "before punctuation. Writes to --out: loss.png, "
      "attention_<i>.png heatmaps, model.safetensors, vocab.json and config.json (for 'attn "
      "translate').");
  command->add_option("--data", options->data, "Tab-separated parallel corpus")
      ->type_name("FILE")
      ->check(file_name_check())
      ->default_str("the date task");
  command->add_option("--out", options->out, "Directory for the model and pictures")
      ->type_name("DIR")
      ->required();
  command->add_option("--epochs", options->epochs, "Passes over the training pairs")
      ->transform(number_check(options->epochs, positive()))
      ->default_str(std::to_string(kDateEpochs) + " (dates), " + std::to_string(kCorpusEpochs) +
                    " (--data)");
  command->add_option("--seed", options->seed, "Seed of the data, initialisation and order")
      ->transform(number_check(options->seed));
  command->add_option("--examples", options->examples, "Date task: generated training pairs")
      ->transform(number_check(options->examples, positive()));
  command
      ->add_option("--held-out", options->held_out,
                   "Held-out pairs to score (at most a tenth of --data)")
      ->transform(number_check(options->held_out, positive()));
  command->add_option("--batch-size", options->batch_size, "Pairs per minibatch")
      ->transform(number_check(options->batch_size, positive()));
  command->add_option("--lr", options->lr, "Adam learning rate")
      ->transform(number_check(options->lr, positive()));
  command->add_option("--embed-size", options->embed_size, "Token embedding size")
      ->transform(number_check(options->embed_size, from_to(1, 4096)));
  command->add_option("--num-hiddens", options->num_hiddens, "GRU and attention hidden size")
      ->transform(number_check(options->num_hiddens, from_to(1, 4096)));
  command->add_option("--num-layers", options->num_layers, "GRU layers")
      ->transform(number_check(options->num_layers, from_to(1, 16)));
  command->add_option("--dropout", options->dropout, "Dropout between GRU layers and on attention")
      ->transform(number_check(options->dropout, from_to(0, 1)));
  command->add_option("--num-steps", options->num_steps, "Tokens per sequence (with <eos>)")
      ->transform(number_check(options->num_steps, from_to(1, 4096)))
      ->default_str(std::to_string(kDateSteps));
  command->add_flag(
      "--attend-to-eos", options->attend_to_eos,
      "Let the decoder attend to the source's <eos>, as the book's model does (alignment "
      "heatmaps then show the last source token one step late)");
  command->add_option("--samples", options->samples, "Held-out translations to print and draw")
      ->transform(number_check(options->samples, non_negative()));
  command->callback([options] { train_seq2seq_command(*options); });
}

void add_translate_command(CLI::App& app) {
  auto options = std::make_shared<TranslateOptions>();
  CLI::App* command = app.add_subcommand(
      "translate", "Translate a sentence with a model from 'attn train seq2seq'");
  command->add_option("--model", options->model, "Model directory written by 'attn train seq2seq'")
      ->type_name("DIR")
      ->required();
  command->add_option("text", options->text, "The sentence to translate")->required();
  command
      ->add_option("--heatmap", options->heatmap,
                   "Also draw the attention weights (.png, .svg or .pdf)")
      ->type_name("FILE")
      ->check(file_name_check());
  command->callback([options] { translate_command(*options); });
}

}  // namespace attn::cli
