#include "zero/deferred_step.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include "runtime/cpu_device.h"
#include "testing/status_matchers.h"
#include "zero/chunked_optimizer_states.h"
#include "zero/optimizer_states.h"

namespace zero {
namespace {

constexpr int64_t kN = 40;
constexpr float kUnwritten = -7.0f;

AdamWParams Params() {
  AdamWParams h;
  h.lr = 0.01f;
  h.weight_decay = 0.1f;
  h.bias_correction1 = 0.1f;
  h.bias_correction2 = 0.001f;
  h.grad_scale = 0.5f;
  return h;
}

// Chunked states of kN elements in chunks of 4 with two staging sets, on the synchronous CPU
// backend (a queued piece has run when its call returns, so the model copy shows what was queued),
// and the same states on the device to compare against. Parameters: [0, 8), none, [8, 20), [20, 40).
struct Fixture {
  CpuDevice cpu;
  std::unique_ptr<ChunkedOptimizerStates> chunked;
  std::unique_ptr<OptimizerStates> ref;
  std::vector<float> init = std::vector<float>(kN), grads = std::vector<float>(kN);
  std::vector<float> model = std::vector<float>(kN, kUnwritten);

  void SetUp() {
    ChunkedOptimizerStatesOptions o;
    o.chunk_numel = 4;
    o.chunk_buffers = 2;
    o.slab.pin_memory = false;
    auto c = ChunkedOptimizerStates::Create(&cpu, kN, cpu.default_stream(), o);
    ASSERT_OK(c);
    chunked = std::move(c).value();
    auto r = CreateDeviceOptimizerStates(&cpu, kN, nullptr);
    ASSERT_OK(r);
    ref = std::move(r).value();
    for (int64_t i = 0; i < kN; ++i) {
      init[i] = 0.5f - 0.01f * static_cast<float>(i);
      grads[i] = 0.03f * static_cast<float>(i % 7) - 0.1f;
    }
    ASSERT_OK(chunked->Write(OptState::kMaster, 0, kN, init.data()));
    ASSERT_OK(ref->Write(OptState::kMaster, 0, kN, init.data()));
  }
  DeferredStep Make() {
    return DeferredStep(&cpu, cpu.default_stream(), chunked.get(), {{0, 8}, {8, 8}, {8, 20}, {20, 40}}, DType::kF32);
  }
  // Elements of the model copy the step wrote so far.
  int64_t Written() const {
    int64_t n = 0;
    for (float v : model) n += v != kUnwritten ? 1 : 0;
    return n;
  }
};

bool WrittenRange(const std::vector<float>& model, int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; ++i) {
    if (model[i] == kUnwritten) return false;
  }
  return true;
}

// End queues chunk_buffers pieces; Reach queues a parameter's pieces plus chunk_buffers more and
// marks it waited; Flush queues the rest. The result is bitwise the unchunked update.
TEST(DeferredStepTest, QueuesAsTheForwardReachesParameters) {
  Fixture f;
  f.SetUp();
  DeferredStep step(&f.cpu, f.cpu.default_stream(), f.chunked.get(), {{0, 8}, {8, 8}, {8, 20}, {20, 40}}, DType::kF32);
  EXPECT_FALSE(step.in_flight());
  EXPECT_FALSE(step.unfinished());
  ASSERT_OK(step.Begin(Params()));
  step.Defer(0, kN, f.grads.data(), f.model.data());
  ASSERT_OK(step.End());
  EXPECT_TRUE(step.in_flight());
  EXPECT_TRUE(step.unfinished());
  EXPECT_EQ(f.Written(), 8);  // pieces [0, 4) and [4, 8)
  EXPECT_TRUE(WrittenRange(f.model, 0, 8));
  EXPECT_FALSE(step.waited(0));
  EXPECT_TRUE(step.waited(1));  // the step writes none of it
  EXPECT_FALSE(step.waited(2));

  ASSERT_OK(step.Reach({2}));  // [8, 20) and two pieces ahead: [20, 28)
  EXPECT_EQ(f.Written(), 28);
  EXPECT_TRUE(step.waited(2));
  EXPECT_FALSE(step.waited(3));
  ASSERT_OK(step.Reach({0}));  // already queued; two ahead from the first unqueued: [28, 36)
  EXPECT_EQ(f.Written(), 36);
  EXPECT_TRUE(step.waited(0));

  ASSERT_OK(step.Flush());
  EXPECT_FALSE(step.in_flight());
  EXPECT_TRUE(step.unfinished());
  ASSERT_OK(step.WaitForHost());
  EXPECT_FALSE(step.unfinished());

  std::vector<float> want(kN);
  ASSERT_OK(f.ref->Update(0, kN, f.grads.data(), Params(), want.data(), DType::kF32, nullptr));
  EXPECT_EQ(std::memcmp(want.data(), f.model.data(), kN * sizeof(float)), 0);
  std::vector<float> got_master(kN), want_master(kN);
  ASSERT_OK(f.chunked->Read(OptState::kMaster, 0, kN, got_master.data()));
  ASSERT_OK(f.ref->Read(OptState::kMaster, 0, kN, want_master.data()));
  EXPECT_EQ(std::memcmp(want_master.data(), got_master.data(), kN * sizeof(float)), 0);
}

// Null gradients defer casts of the masters; runs given in pieces write where each run says.
TEST(DeferredStepTest, CastsOfTheMastersAndSeveralRuns) {
  Fixture f;
  f.SetUp();
  DeferredStep step = f.Make();
  ASSERT_OK(step.Begin(Params()));
  step.Defer(0, 8, nullptr, f.model.data());
  step.Defer(20, 20, nullptr, f.model.data() + 20);
  ASSERT_OK(step.End());
  EXPECT_TRUE(step.waited(1));
  EXPECT_TRUE(step.waited(2));  // no run covers it
  EXPECT_FALSE(step.waited(3));
  ASSERT_OK(step.Flush());
  for (int64_t i = 0; i < kN; ++i) {
    const bool run = i < 8 || i >= 20;
    EXPECT_EQ(f.model[i], run ? f.init[i] : kUnwritten) << i;
  }
}

// A step with nothing to do is never in flight; Flush is then a no-op.
TEST(DeferredStepTest, EmptyStepIsNotInFlight) {
  Fixture f;
  f.SetUp();
  DeferredStep step = f.Make();
  ASSERT_OK(step.Begin(Params()));
  ASSERT_OK(step.End());
  EXPECT_FALSE(step.in_flight());
  EXPECT_FALSE(step.unfinished());
  ASSERT_OK(step.Flush());
  EXPECT_EQ(f.Written(), 0);
}

}  // namespace
}  // namespace zero
