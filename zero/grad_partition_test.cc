#include "zero/grad_partition.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

#include "offload/thread_pool.h"
#include "runtime/cpu_device.h"
#include "testing/deferred_device.h"
#include "testing/same_bits.h"
#include "testing/status_matchers.h"
#include "zero/host_optimizer_states.h"
#include "zero/optimizer_states.h"
#include "zero/optimizer_states_testing.h"

namespace zero {
namespace {

using ::zero::testing::SameBits;

// Ragged pieces with gaps between them (as the engine's aligned layout has), one empty.
std::vector<GradPiece> Pieces() { return {{0, 37}, {64, 1000}, {1088, 0}, {1088, 5}, {1152, 129}}; }
constexpr int64_t kNumel = 1152 + 129 + 11;

// The gradient of micro step `micro` for piece `i`: values with -0, tiny and large ones.
std::vector<float> Grad(int i, int micro, int64_t n) {
  std::vector<float> g(static_cast<size_t>(n));
  for (int64_t k = 0; k < n; ++k) {
    const int64_t v = (k * 13 + i * 7 + micro * 5) % 31;
    g[k] = v == 0 ? -0.0f : 0.37f * static_cast<float>(v - 15) * (micro % 2 == 0 ? 1.0f : 1e-3f);
  }
  if (n > 3 && micro == 1) g[3] = std::numeric_limits<float>::quiet_NaN();
  return g;
}

struct Fixture {
  CpuDevice device;
  std::unique_ptr<ThreadPool> pool;
  HostGradPartitionOptions options;
  Fixture() {
    pool = std::move(ThreadPool::Create(3)).value();
    options.pool = pool.get();
    options.slab.pin_memory = false;
    options.chunk_numel = 7;  // many chunks per piece: the two slots wrap and the adds block
    options.staging_slots = 2;
  }
};

// A window of three micro steps: each piece's first contribution overwrites (0.0f + g), the later
// ones add; piece 0 only gets one in micro step 0, piece 3 none (zeroed), the others in all three;
// the sources alternate fp32 and bf16. `last` marks the final micro step.
void RunWindow(GradPartition* g, Device* device) {
  std::vector<uint8_t> written(g->num_pieces(), 0);
  for (int micro = 0; micro < 3; ++micro) {
    for (int i = 0; i < g->num_pieces(); ++i) {
      if (i == 3 || (i == 0 && micro > 0)) continue;
      const int64_t n = g->piece(i).n;
      std::vector<float> host = Grad(i, micro, n);
      auto src = device->Allocate(static_cast<size_t>(std::max<int64_t>(n, 1)) * 4);
      ASSERT_OK(src);
      const DType t = micro == 1 ? DType::kBF16 : DType::kF32;
      ASSERT_OK(device->Cast(host.data(), DType::kF32, src->data(), t, static_cast<size_t>(n), nullptr));
      ASSERT_OK(g->Add(i, src->data(), t, !written[i], micro == 2));
      written[i] = 1;
    }
  }
  ASSERT_OK(g->Finish());
  ASSERT_OK(g->Zero(3));
}

std::vector<std::vector<float>> ReadAll(GradPartition* g) {
  std::vector<std::vector<float>> out;
  for (int i = 0; i < g->num_pieces(); ++i) {
    out.emplace_back(static_cast<size_t>(g->piece(i).n));
    EXPECT_OK(g->Read(i, out.back().data()));
  }
  return out;
}

std::vector<double> Norms(GradPartition* g, Device* device) {
  std::vector<int> all;
  for (int i = 0; i < g->num_pieces(); ++i) all.push_back(i);
  auto slots = device->Allocate(all.size() * sizeof(double));
  EXPECT_OK(slots);
  EXPECT_OK(device->Fill(slots->data(), DType::kF32, 2 * all.size(), 0.0f, nullptr));
  EXPECT_OK(g->SumsOfSquares(all, slots->as<double>()));
  std::vector<double> out(all.size());
  std::memcpy(out.data(), slots->data(), all.size() * sizeof(double));
  return out;
}

// The host partition (and GPU accumulation in front of one) hold the device partition's bits:
// the sums, the zeroed piece, the norm partials, and two windows in a row (the second's first
// contribution overwrites the first's values).
TEST(GradPartitionTest, HostAndGpuAccumulationBitwiseEqualToDevice) {
  Fixture f;
  auto dev = CreateDeviceGradPartition(&f.device, nullptr, kNumel, Pieces());
  ASSERT_OK(dev);
  auto host = CreateHostGradPartition(&f.device, nullptr, kNumel, Pieces(), f.options);
  ASSERT_OK(host);
  auto gpu = CreateGpuAccumulatedGradPartition(&f.device, nullptr, kNumel, Pieces(), f.options);
  ASSERT_OK(gpu);
  for (int window = 0; window < 2; ++window) {
    SCOPED_TRACE("window " + std::to_string(window));
    for (auto* g : {dev->get(), host->get(), gpu->get()}) {
      g->NewWindow();
      RunWindow(g, &f.device);
    }
    const auto want = ReadAll(dev->get());
    EXPECT_TRUE(SameBits(ReadAll(host->get()), want)) << "host";
    EXPECT_TRUE(SameBits(ReadAll(gpu->get()), want)) << "gpu accumulation";
    // The first contribution turned -0 into +0 and the NaN is canonical: not a plain copy.
    EXPECT_EQ(want[0][0], 0.0f);
    EXPECT_FALSE(std::signbit(want[0][0])) << "piece 0's only gradient there is -0: 0.0f + g is +0";
    const std::vector<double> n0 = Norms(dev->get(), &f.device);
    // Bits (a NaN gradient makes a NaN partial; NaN != NaN).
    for (auto* g : {host->get(), gpu->get()}) {
      const std::vector<double> n1 = Norms(g, &f.device);
      EXPECT_EQ(0, std::memcmp(n0.data(), n1.data(), n0.size() * sizeof(double)));
    }
    EXPECT_TRUE(std::isnan(n0[1]));
    EXPECT_GT(n0[0], 0.0);
    EXPECT_EQ(n0[3], 0.0);
  }
  EXPECT_EQ((*dev)->bytes().device, static_cast<size_t>(kNumel) * 4);
  EXPECT_EQ((*host)->bytes().device, 0u);
  EXPECT_GE((*host)->bytes().host, static_cast<size_t>(kNumel) * 4);
  EXPECT_EQ((*gpu)->bytes().device, static_cast<size_t>(kNumel) * 4);
  EXPECT_GE((*gpu)->bytes().host, static_cast<size_t>(kNumel) * 4);
}

// Store (stage 1's reduced sums) is a plain copy: -0 stays -0.
TEST(GradPartitionTest, StoreKeepsTheBits) {
  Fixture f;
  auto host = CreateHostGradPartition(&f.device, nullptr, kNumel, Pieces(), f.options);
  ASSERT_OK(host);
  std::vector<float> v = Grad(4, 0, 129);
  v[0] = -0.0f;
  ASSERT_OK((*host)->Store(4, v.data()));
  std::vector<float> got(129);
  ASSERT_OK((*host)->Read(4, got.data()));
  EXPECT_EQ(0, std::memcmp(v.data(), got.data(), 129 * 4));
}

// AdamW from the host partition (UpdateFromHost, in place) equals AdamW from the device partition
// (Update, copied to the host in chunks) on host states: masters, moments and the model copy.
TEST(GradPartitionTest, UpdateFromHostEqualsUpdateFromDevice) {
  Fixture f;
  HostOptimizerStatesOptions so;
  so.slab.pin_memory = false;
  so.cpu_threads = 2;
  so.chunk_numel = 100;
  so.model_dtype = DType::kBF16;
  auto sa = CreateHostOptimizerStates(&f.device, kNumel, nullptr, so);
  auto sb = CreateHostOptimizerStates(&f.device, kNumel, nullptr, so);
  ASSERT_TRUE(sa.ok() && sb.ok());
  ASSERT_TRUE((*sa)->updates_from_host());
  f.options.pool = (*sa)->host_thread_pool();
  ASSERT_NE(f.options.pool, nullptr);
  auto dev = CreateDeviceGradPartition(&f.device, nullptr, kNumel, Pieces());
  auto host = CreateHostGradPartition(&f.device, nullptr, kNumel, Pieces(), f.options);
  ASSERT_TRUE(dev.ok() && host.ok());
  RunWindow(dev->get(), &f.device);
  RunWindow(host->get(), &f.device);
  AdamWParams h;
  h.lr = 0.01f;
  h.weight_decay = 0.1f;
  std::vector<uint16_t> ma(kNumel, 1), mb(kNumel, 2);
  ASSERT_OK((*dev)->Update(sa->get(), 0, 600, h, ma.data(), DType::kBF16));
  ASSERT_OK((*host)->Update(sb->get(), 0, 600, h, mb.data(), DType::kBF16));
  ASSERT_OK((*dev)->Update(sa->get(), 600, kNumel - 600, h, ma.data() + 600, DType::kBF16));
  ASSERT_OK((*host)->Update(sb->get(), 600, kNumel - 600, h, mb.data() + 600, DType::kBF16));
  EXPECT_EQ(ma, mb);
  ASSERT_NO_FATAL_FAILURE(testing::ExpectStatesBitwiseEqual(**sa, **sb, kNumel));
  // Device states cannot read host gradients: a clear error, not a crash.
  auto ds = CreateDeviceOptimizerStates(&f.device, kNumel, nullptr);
  ASSERT_OK(ds);
  Status s = (*host)->Update(ds->get(), 0, 10, h, nullptr, DType::kBF16);
  EXPECT_EQ(s.code(), StatusCode::kUnimplemented) << s.ToString();
  EXPECT_NE(s.message().find("UpdateFromHost"), std::string::npos) << s.ToString();
}

// The host partition's adds copy device->host on their own stream: under a device whose streams
// really are asynchronous (ops of different streams run in random legal orders), a source buffer
// the caller overwrites right after Add (on its stream) and a staging slot reused by a later chunk
// still give the synchronous device partition's bits. A missing wait (the device->host copy not
// waiting for the slot's device copy, or reading the caller's source directly) shows up here.
TEST(GradPartitionTest, HostAddsOverlapTheCallersStreamSafely) {
  Fixture ref;
  auto want_part = CreateDeviceGradPartition(&ref.device, nullptr, kNumel, Pieces());
  ASSERT_OK(want_part);
  RunWindow(want_part->get(), &ref.device);
  const auto want = ReadAll(want_part->get());
  for (uint32_t seed = 1; seed <= 8; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    testing::DeferredDevice device(seed);
    auto stream = device.CreateStream();
    ASSERT_OK(stream);
    Stream* compute = stream->get();
    auto host = CreateHostGradPartition(&device, compute, kNumel, Pieces(), ref.options);
    ASSERT_OK(host);
    EXPECT_GT((*host)->bytes().device_staging, 0u);
    // One source buffer for every contribution, rewritten on the caller's stream after each Add;
    // the host values stay alive until the end (the device reads them later).
    auto src = device.Allocate(2000 * 4);
    ASSERT_OK(src);
    std::vector<std::vector<float>> keep;
    std::vector<uint8_t> written((*host)->num_pieces(), 0);
    for (int micro = 0; micro < 3; ++micro) {
      for (int i = 0; i < (*host)->num_pieces(); ++i) {
        if (i == 3 || (i == 0 && micro > 0)) continue;
        const int64_t n = (*host)->piece(i).n;
        keep.push_back(Grad(i, micro, n));
        const DType t = micro == 1 ? DType::kBF16 : DType::kF32;
        ASSERT_OK(device.Cast(keep.back().data(), DType::kF32, src->data(), t, static_cast<size_t>(n), compute));
        ASSERT_OK((*host)->Add(i, src->data(), t, !written[i], micro == 2));
        written[i] = 1;
      }
    }
    ASSERT_OK((*host)->Zero(3));
    EXPECT_TRUE(SameBits(ReadAll(host->get()), want)) << "host partition under the deferred device";
  }
}

TEST(GradPartitionTest, HostPartitionNeedsAPool) {
  CpuDevice device;
  HostGradPartitionOptions o;
  o.slab.pin_memory = false;
  auto host = CreateHostGradPartition(&device, nullptr, 16, {{0, 16}}, o);
  EXPECT_FALSE(host.ok());
  EXPECT_NE(host.status().message().find("thread pool"), std::string::npos) << host.status().ToString();
}

}  // namespace
}  // namespace zero
