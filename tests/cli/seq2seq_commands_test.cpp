// End-to-end tests of `attn train seq2seq` and `attn translate`: a short run on the date task and
// on a tab-separated corpus, the model directory it writes, translating with it, and the errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>

#include "attn/io/safetensors.hpp"
#include "attn/seq2seq/translator.hpp"
#include "attn/seq2seq/vocabulary.hpp"
#include "cli_fixture.hpp"

namespace attn {
namespace {

// One epoch over 600 dates: well under a second, enough to exercise every output.
const std::string kShortDateRun =
    "train seq2seq --out model --examples 600 --held-out 50 --epochs 1 --batch-size 32 "
    "--samples 2";

TEST_F(CliTest, TrainSeq2SeqWritesTheModelDirectoryAndPictures) {
  const CommandResult result = attn(kShortDateRun);
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_NE(result.out.find("bundled date task, 600 training and 50 held-out pairs"),
            std::string::npos)
      << result.out;
  std::smatch match;
  ASSERT_TRUE(
      std::regex_search(result.out, match,
                        std::regex(R"(epoch +1/1 \[#+\] 100% +loss ([0-9.]+) +([0-9]+) tokens/s)")))
      << result.out;
  // The first epoch starts from a uniform guess over 135 target tokens (ln 135 ≈ 4.9) and learns
  // at least where "-" and <eos> go.
  EXPECT_LT(std::stod(match[1].str()), 4.9);
  EXPECT_GT(std::stod(match[2].str()), 0.0);
  ASSERT_TRUE(std::regex_search(
      result.out, match,
      std::regex(R"(held-out \(50 pairs\): BLEU ([0-9.]+), exact match ([0-9.]+)%)")))
      << result.out;
  EXPECT_GE(std::stod(match[1].str()), 0.0);
  EXPECT_LE(std::stod(match[1].str()), 1.0);

  for (const char* picture : {"model/loss.png", "model/attention_1.png", "model/attention_2.png"})
    EXPECT_TRUE(starts_with_bytes(path(picture), kPngSignature)) << picture;
  EXPECT_FALSE(fs::exists(path("model/attention_3.png")));
  const StateDict state = load_safetensors(path("model/model.safetensors"));
  EXPECT_EQ(state.at("encoder.rnn.weight_ih_l0").shape(), (Shape{3 * 64, 32}));
  EXPECT_EQ(state.at("decoder.attention.w_v.weight").shape(), (Shape{1, 64}));
  const nlohmann::json config = nlohmann::json::parse(read_text(path("model/config.json")));
  EXPECT_EQ(config["format"], "attn-seq2seq");
  EXPECT_EQ(config["tokenizer"], "dates");
  EXPECT_EQ(config["attend_to_eos"], false);
  EXPECT_EQ(config["num_hiddens"], 64);
  EXPECT_EQ(config["training"]["epochs"], 1.0);
  const nlohmann::json vocab = nlohmann::json::parse(read_text(path("model/vocab.json")));
  EXPECT_EQ(vocab["target"][Vocabulary::kBos], "<bos>");
  EXPECT_EQ(vocab["source"][Vocabulary::kEos], "<eos>");
}

// A file in the way of --out is found before training, as train nadaraya-watson and demo find
// it, with the system's reason; not after a run that may take minutes.
TEST_F(CliTest, TrainSeq2SeqChecksItsOutputDirectoryBeforeTraining) {
  std::ofstream(path("occupied")) << "a file, not a directory";
  const std::string arguments =
      "train seq2seq --out occupied --examples 600 --held-out 50 --epochs 1 --batch-size 32";
  expect_error(arguments, "--out: cannot create the directory 'occupied' (Not a directory)");
  const CommandResult result = attn(arguments);
  EXPECT_EQ(result.out.find("epoch   1/1"), std::string::npos) << result.out;
  EXPECT_EQ(result.out.find("trained in"), std::string::npos) << result.out;
  EXPECT_EQ(read_text(path("occupied")), "a file, not a directory");
  // The model's own files too: a folder named config.json failed after the whole run, with
  // model.safetensors and vocab.json written beside no config.json.
  fs::create_directories(path("model/config.json"));
  const CommandResult blocked =
      attn("train seq2seq --out model --examples 600 --held-out 50 --epochs 1 --batch-size 32");
  EXPECT_EQ(blocked.exit_code, 1);
  EXPECT_NE(blocked.err.find("--out model/config.json: is a directory, expected a file name"),
            std::string::npos)
      << blocked.err;
  EXPECT_EQ(blocked.out.find("trained in"), std::string::npos) << blocked.out;
  EXPECT_FALSE(fs::exists(path("model/model.safetensors")));
  // And the held-out samples' heatmaps: a folder named attention_2.png failed after training,
  // with no model saved.
  fs::create_directories(path("samples/attention_2.png"));
  const CommandResult heatmap_blocked = attn(
      "train seq2seq --out samples --examples 600 --held-out 50 --epochs 1 --batch-size 32 "
      "--samples 2");
  EXPECT_EQ(heatmap_blocked.exit_code, 1);
  EXPECT_NE(heatmap_blocked.err.find(
                "--out samples/attention_2.png: is a directory, expected a file name"),
            std::string::npos)
      << heatmap_blocked.err;
  EXPECT_EQ(heatmap_blocked.out.find("trained in"), std::string::npos) << heatmap_blocked.out;
}

// A learning rate that sends the weights off names --lr (the library's clip_grad_norm found the
// gradients not finite, and the message named it alone), and the folder the run made goes.
TEST_F(CliTest, TrainSeq2SeqNamesTheLearningRateWhenTrainingDiverges) {
  expect_error("train seq2seq --out diverged/a/b --examples 200 --held-out 20 --epochs 1 --lr 1e30",
               "--lr: training diverged with learning rate 1e+30 (clip_grad_norm: expected finite "
               "gradients");
  EXPECT_FALSE(fs::exists(path("diverged")));  // every folder it made (a/b alone went)
  // A folder that was there stays.
  fs::create_directories(path("kept"));
  expect_error("train seq2seq --out kept/new --examples 200 --held-out 20 --epochs 1 --lr 1e30",
               "--lr: training diverged");
  EXPECT_TRUE(fs::exists(path("kept")));
  EXPECT_FALSE(fs::exists(path("kept/new")));
}

// --samples 0 prints no translations, so neither their header nor a range of heatmaps.
// config.json records the run's settings as given: the seed whole (12345678901234567891 was
// written as 1.2345678901234567e+19), the learning rate as typed (0.005, not
// 0.004999999888241291) and the counts as integers.
TEST_F(CliTest, TrainSeq2SeqWithoutSamplesPrintsNoSampleHeaders) {
  const CommandResult result = attn(
      "train seq2seq --out model --examples 600 --held-out 50 --epochs 1 --batch-size 32 "
      "--samples 0 --seed 12345678901234567891 --lr 0.005");
  ASSERT_EQ(result.exit_code, 0) << result.err;
  const nlohmann::json training =
      nlohmann::json::parse(read_text(path("model/config.json")))["training"];
  EXPECT_EQ(training["seed"].dump(), "12345678901234567891");
  EXPECT_EQ(training["lr"].dump(), "0.005");
  EXPECT_EQ(training["batch_size"].dump(), "32");
  EXPECT_EQ(training["epochs"].dump(), "1");
  EXPECT_EQ(training["held_out_pairs"].dump(), "50");
  EXPECT_EQ(result.out.find("held-out translations"), std::string::npos) << result.out;
  EXPECT_EQ(result.out.find("attention heatmaps"), std::string::npos) << result.out;
  EXPECT_NE(result.out.find("held-out (50 pairs): BLEU "), std::string::npos) << result.out;
  EXPECT_FALSE(fs::exists(path("model/attention_1.png")));
  EXPECT_TRUE(starts_with_bytes(path("model/loss.png"), kPngSignature));
}

TEST_F(CliTest, TranslatePrintsWhatTheLibraryTranslatesAndDrawsTheHeatmap) {
  ASSERT_EQ(attn(kShortDateRun).exit_code, 0);
  const CommandResult result = attn("translate --model model '3 march 1987' --heatmap h.svg");
  ASSERT_EQ(result.exit_code, 0) << result.err;
  Translator translator = Translator::load(path("model"));
  EXPECT_EQ(result.out, translator.translate("3 march 1987").text + "\n");
  EXPECT_TRUE(read_text(path("h.svg")).find("<svg") != std::string::npos);
  EXPECT_NE(result.err.find("attention heatmap: h.svg"), std::string::npos) << result.err;
}

// A sentence longer than the model reads is cut, as the book's truncate_pad cuts it; translate
// says so on stderr (it translated part of the sentence without a word).
TEST_F(CliTest, TranslateWarnsWhenTheSentenceIsLongerThanTheModelReads) {
  ASSERT_EQ(attn(kShortDateRun + " --num-steps 6").exit_code, 0);
  const std::string sentence = "on wednesday, the 3rd of march, 1987";
  Translator translator = Translator::load(path("model"));
  const int64_t length = translator.translate(sentence).source_length;
  ASSERT_GT(length, 6);
  CommandResult result = attn("translate --model model '" + sentence + "'");
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_NE(result.err.find("attn translate: warning: the sentence has " + std::to_string(length) +
                            " tokens and the model reads 6 (num_steps in its config.json, <eos> "
                            "included): the last " +
                            std::to_string(length - 6) + " tokens are not translated"),
            std::string::npos)
      << result.err;
  EXPECT_EQ(result.out, translator.translate(sentence).text + "\n");
  // One that fits, <eos> and all: no warning.
  ASSERT_LT(translator.translate("3 march").source_length, 6);
  result = attn("translate --model model '3 march'");
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_EQ(result.err, "");
}

TEST_F(CliTest, TrainSeq2SeqReadsATabSeparatedCorpus) {
  std::ofstream(path("pairs.tsv")) << "Go.\tVa !\nGo!\tVa !\nGo.\tMarche.\nGo!\tMarche !\n";
  const CommandResult result = attn("train seq2seq --data pairs.tsv --out corpus --epochs 2");
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_NE(result.out.find("corpus pairs.tsv"), std::string::npos) << result.out;
  EXPECT_NE(result.out.find("epoch   2/2"), std::string::npos) << result.out;
  const nlohmann::json config = nlohmann::json::parse(read_text(path("corpus/config.json")));
  EXPECT_EQ(config["tokenizer"], "book");
  // The book's preprocessing (lower case, a space before punctuation) makes "Go." two tokens, and
  // "go" occurs in each of the 3 training pairs, so min_freq 2 keeps it.
  const nlohmann::json source =
      nlohmann::json::parse(read_text(path("corpus/vocab.json")))["source"];
  EXPECT_NE(std::find(source.begin(), source.end(), "go"), source.end()) << source.dump();
  EXPECT_EQ(std::find(source.begin(), source.end(), "Go."), source.end()) << source.dump();
  const CommandResult translated = attn("translate --model corpus 'Go!'");
  EXPECT_EQ(translated.exit_code, 0) << translated.err;
}

TEST_F(CliTest, Seq2SeqCommandsReportBadInputClearly) {
  std::ofstream(path("bad.tsv")) << "go .\tva !\nhi .\tsalut !\nno tab here\n";
  expect_error("train seq2seq --data bad.tsv --out never",
               "--data: bad.tsv:3: expected \"source<TAB>target\", or a third column of "
               "attribution after another tab (one or two tabs), got 0 tabs");
  expect_error("train seq2seq --data missing.tsv --out never", "missing.tsv");
  EXPECT_FALSE(fs::exists(path("never")));
  expect_error("translate --model nowhere 'march 3'", "--model: nowhere: no such model directory");
  ASSERT_EQ(attn(kShortDateRun).exit_code, 0);
  expect_error("translate --model model '  '",
               "text: expected at least one token to translate, got an empty input");
  std::ofstream(path("model/config.json")) << "{\"format\": \"something else\"}";
  expect_error("translate --model model 'march 3'", "config.json: expected \"format\"");
  expect_error("train seq2seq --out x --epochs 0", "--epochs");
}

}  // namespace
}  // namespace attn
