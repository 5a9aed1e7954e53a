// Writes the fuzz targets' seed corpora (fuzz/corpus/<target>/) with attn's own writers: small
// valid files of each kind, so that fuzzing starts from inputs that reach deep into each reader.
// The committed seeds came from `make_fuzz_seeds fuzz/corpus`; NumPy-written fixtures are copied
// from tests/fixtures/io by scripts/fuzz.sh's --seeds step.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "attn/core/random.hpp"
#include "attn/io/npy.hpp"
#include "attn/io/safetensors.hpp"
#include "attn/nn/additive_attention.hpp"
#include "attn/nn/general_attention.hpp"
#include "attn/nn/multi_head_attention.hpp"
#include "attn/seq2seq/translator.hpp"

namespace fs = std::filesystem;

namespace {

void write(const fs::path& path, const std::vector<std::byte>& bytes) {
  std::ofstream file(path, std::ios::binary);
  file.write(reinterpret_cast<const char*>(bytes.data()),
             static_cast<std::streamsize>(bytes.size()));
}

std::vector<std::byte> read(const fs::path& path) {
  std::ifstream file(path, std::ios::binary);
  const std::string text((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  const auto* begin = reinterpret_cast<const std::byte*>(text.data());
  return {begin, begin + text.size()};
}

attn::Tensor random(const attn::Shape& shape, uint64_t seed) {
  attn::Rng rng(seed);
  attn::Tensor tensor(shape);
  for (float& value : tensor.span()) value = rng.uniform(-1.0F, 1.0F);
  return tensor;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_fuzz_seeds <corpus directory>\n");
    return 2;
  }
  const fs::path root = argv[1];
  for (const char* target : {"npy", "safetensors", "state_dict", "seq2seq_model"}) {
    fs::create_directories(root / target);
  }

  write(root / "npy" / "float32_2x3.npy", attn::serialize_npy(random(attn::Shape{2, 3}, 1)));
  write(root / "npy" / "float32_empty.npy", attn::serialize_npy(attn::Tensor(attn::Shape{0, 4})));
  write(root / "npy" / "int64_lens.npy",
        attn::serialize_npy(std::vector<int64_t>{3, 1}, attn::Shape{2}));
  write(root / "npy" / "bool_mask.npy",
        attn::serialize_npy_bool(std::vector<uint8_t>{1, 0, 1, 1, 0, 1}, attn::Shape{1, 2, 3}));

  attn::StateDict tensors;
  tensors.emplace("weight", random(attn::Shape{2, 2}, 2));
  tensors.emplace("scalar", random(attn::Shape{}, 3));
  tensors.emplace("empty", attn::Tensor(attn::Shape{0, 2}));
  write(root / "safetensors" / "tensors_metadata.safetensors",
        attn::serialize_safetensors(tensors, {{"format", "pt"}, {"layer", "Linear"}}));
  write(root / "safetensors" / "empty.safetensors", attn::serialize_safetensors({}));

  attn::MultiHeadAttention multi_head(3, 2, 4, 4, 2, 0.0F, /*bias=*/true, 5);
  write(root / "state_dict" / "multi_head_bias.safetensors",
        attn::serialize_safetensors(multi_head.state_dict(), {{"layer", "MultiHeadAttention"}}));
  attn::MultiHeadAttention plain(2, 2, 2, 2, 1, 0.0F, false, 6);
  write(root / "state_dict" / "multi_head.safetensors",
        attn::serialize_safetensors(plain.state_dict()));
  attn::AdditiveAttention additive(2, 3, 4, 0.0F, 7);
  write(root / "state_dict" / "additive.safetensors",
        attn::serialize_safetensors(additive.state_dict(), {{"layer", "AdditiveAttention"}}));
  attn::GeneralAttention general(3, 2, 0.0F, 8);
  write(root / "state_dict" / "general.safetensors",
        attn::serialize_safetensors(general.state_dict()));

  // The smallest model directory Translator::load accepts, joined as seq2seq_model_fuzzer splits
  // it: config.json, vocab.json, model.safetensors.
  attn::Seq2SeqConfig config;
  config.source_vocab_size = 6;
  config.target_vocab_size = 5;
  config.embed_size = 2;
  config.num_hiddens = 2;
  attn::Translator translator(
      attn::Seq2Seq(config, 9),
      attn::Vocabulary::from_tokens({"<pad>", "<bos>", "<eos>", "<unk>", "march", "1987"}),
      attn::Vocabulary::from_tokens({"<pad>", "<bos>", "<eos>", "<unk>", "1987-03-03"}),
      attn::TokenizerKind::kDates, 4);
  const fs::path model = fs::temp_directory_path() / "attn_fuzz_seed_model";
  translator.save(model);
  const std::string separator = "\n#attn-fuzz#\n";
  std::vector<std::byte> joined;
  for (const char* file : {"config.json", "vocab.json", "model.safetensors"}) {
    if (!joined.empty()) {
      for (const char c : separator) joined.push_back(static_cast<std::byte>(c));
    }
    const std::vector<std::byte> bytes = read(model / file);
    joined.insert(joined.end(), bytes.begin(), bytes.end());
  }
  fs::remove_all(model);
  write(root / "seq2seq_model" / "tiny_model", joined);
  return 0;
}
