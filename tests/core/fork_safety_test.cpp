// A process forked after parallel work runs attn on its threads instead of hanging: the child's
// next region of two threads waited forever for the pool GNU OpenMP had kept in the parent (an attn
// call in the child never returned; so did one after another library's parallel region, as
// PyTorch's), until the forking thread's pool was released before the fork.
#include <gtest/gtest.h>
#include <omp.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <csignal>
#include <thread>

#include "attn/core/tensor.hpp"
#include "attn/functional/scaled_dot_product_attention.hpp"

namespace attn {
namespace {

// Forks a child that runs `child_check` (its exit status: 0 when it held) with a 30 s alarm, and
// expects it to end by exiting 0, not by SIGALRM (a hang) or another signal.
template <class Check>
void expect_child_holds(const Check& child_check, const char* failure) {
  const pid_t child = fork();
  if (child == 0) {
    alarm(30);  // a hang ends the child with SIGALRM
    _exit(child_check() ? 0 : 3);
  }
  ASSERT_GT(child, 0);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_FALSE(WIFSIGNALED(status)) << "the child ended by signal " << WTERMSIG(status)
                                    << (WTERMSIG(status) == SIGALRM ? " (SIGALRM: it hung)" : "");
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << failure;
}

TEST(ForkSafety, AChildForkedAfterThreadsRunsAttentionInsteadOfHanging) {
  const int saved_threads = omp_get_max_threads();
  omp_set_num_threads(2);
  const Tensor q = Tensor::full(Shape{4, 8, 256, 64}, 0.5F);
  const AttentionForward parent = scaled_dot_product_attention(q, q, q);
  expect_child_holds(
      [&] {
        const AttentionForward again = scaled_dot_product_attention(q, q, q);
        return again.output.data()[0] == parent.output.data()[0] && omp_get_max_threads() == 2;
      },
      "the child's output differed, or it lost its 2 threads");
  omp_set_num_threads(saved_threads);
}

// Another library's parallel region on the forking thread (PyTorch's operators share GNU OpenMP
// with attn) leaves a pool attn has no mark of: the child hung in attn's first call.
TEST(ForkSafety, AChildForkedAfterAnotherLibrarysParallelWorkRunsAttention) {
  const int saved_threads = omp_get_max_threads();
  omp_set_num_threads(2);
  int members = 0;
#pragma omp parallel reduction(+ : members)
  members += 1;
  ASSERT_EQ(members, 2);
  const Tensor q = Tensor::full(Shape{4, 8, 256, 64}, 0.5F);
  // Every value is 0.5, so the output is too, within the float sums' rounding: where the running
  // maxima are integers in base 2 (AVX2 and below) each P is 2^(S − ⌈S⌉), not 1, and P·V's sums
  // and the rows' totals round in different orders (0.49999878 on Zen 3): 1e-5 relative, the
  // kernels' stated accuracy.
  expect_child_holds(
      [&] {
        return std::fabs(scaled_dot_product_attention(q, q, q).output.data()[0] - 0.5F) <=
               1e-5F * 0.5F;
      },
      "the child's output differed");
  omp_set_num_threads(saved_threads);
}

// A thread that never started a region of more than one thread keeps its count in a child.
TEST(ForkSafety, AChildForkedFromAThreadWithoutThreadsKeepsItsCount) {
  int child_threads = 0;
  std::thread([&] {
    omp_set_num_threads(3);
    const pid_t child = fork();
    if (child == 0) _exit(omp_get_max_threads());
    int status = 0;
    waitpid(child, &status, 0);
    child_threads = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }).join();
  EXPECT_EQ(child_threads, 3);
}

}  // namespace
}  // namespace attn
