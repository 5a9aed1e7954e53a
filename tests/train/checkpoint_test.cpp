// Checkpoints: parameters and optimizer state survive a save/load round trip; bad files change
// nothing.
#include "attn/train/checkpoint.hpp"

#include <gtest/gtest.h>

#include <filesystem>

#include "attn/core/error.hpp"
#include "attn/io/safetensors.hpp"
#include "attn/nn/additive_attention.hpp"
#include "attn/train/adam.hpp"
#include "test_support.hpp"

namespace attn {
namespace {

class Checkpoint : public ::testing::Test {
 protected:
  void SetUp() override {
    directory_ =
        std::filesystem::temp_directory_path() /
        ("attn_checkpoint_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) +
         "_" + ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(directory_);
  }
  void TearDown() override { std::filesystem::remove_all(directory_); }
  std::filesystem::path directory_;
};

TEST_F(Checkpoint, RoundTripsParametersAndAdamState) {
  Rng rng(1);
  const Tensor q = testing::random_tensor(Shape{1, 2, 3}, rng),
               k = testing::random_tensor(Shape{1, 4, 2}, rng);
  const Tensor v = testing::random_tensor(Shape{1, 4, 2}, rng),
               g = testing::random_tensor(Shape{1, 2, 2}, rng);
  AdditiveAttention trained(2, 3, 4, 0.0F, 1);
  Adam optimizer(trained.parameters());
  trained(q, k, v);
  trained.backward(g);
  optimizer.step();
  save_checkpoint(directory_ / "model.safetensors", trained.parameters(), &optimizer);

  AdditiveAttention restored(2, 3, 4, 0.0F, 2);
  Adam restored_optimizer(restored.parameters());
  load_checkpoint(directory_ / "model.safetensors", restored.parameters(), &restored_optimizer);
  for (const auto& [name, tensor] : trained.state_dict())
    EXPECT_EQ(restored.state_dict().at(name).values(), tensor.values());
  EXPECT_EQ(restored_optimizer.steps(), 1);

  // Without an optimizer the parameters alone load; the optimizer's entries are ignored.
  AdditiveAttention parameters_only(2, 3, 4, 0.0F, 3);
  load_checkpoint(directory_ / "model.safetensors", parameters_only.parameters());
  EXPECT_EQ(parameters_only.state_dict().at("w_v.weight").values(),
            trained.state_dict().at("w_v.weight").values());
}

TEST_F(Checkpoint, WrongLayerChangesNothing) {
  AdditiveAttention source(2, 3, 4, 0.0F, 1);
  save_checkpoint(directory_ / "small.safetensors", source.parameters());
  AdditiveAttention other(2, 3, 5, 0.0F, 2);
  const StateDict before = other.state_dict();
  Adam optimizer(other.parameters());
  EXPECT_THROW_MESSAGE(
      load_checkpoint(directory_ / "small.safetensors", other.parameters(), &optimizer), ShapeError,
      "expected shape (5, 2), got shape (4, 2)");
  for (const auto& [name, tensor] : other.state_dict())
    EXPECT_EQ(tensor.values(), before.at(name).values()) << name;
  EXPECT_THROW(load_checkpoint(directory_ / "missing.safetensors", other.parameters()), FileError);
}

}  // namespace
}  // namespace attn
