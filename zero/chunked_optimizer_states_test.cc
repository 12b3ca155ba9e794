#include "zero/chunked_optimizer_states.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "runtime/cpu_device.h"
#include "testing/deferred_device.h"
#include "testing/status_matchers.h"
#include "zero/optimizer_states.h"
#include "zero/optimizer_states_testing.h"

namespace zero {
namespace {

using testing::DeferredDevice;

ChunkedOptimizerStatesOptions Options(int64_t chunk, int buffers) {
  ChunkedOptimizerStatesOptions o;
  o.chunk_numel = chunk;
  o.chunk_buffers = buffers;
  o.slab.pin_memory = false;
  return o;
}

AdamWParams Params(int step) {
  AdamWParams h;
  h.lr = 0.01f;
  h.weight_decay = 0.1f;
  h.bias_correction1 = static_cast<float>(1.0 - std::pow(0.9, step));
  h.bias_correction2 = static_cast<float>(1.0 - std::pow(0.999, step));
  h.grad_scale = 0.5f;
  return h;
}

std::vector<uint16_t> Bf16(const std::vector<float>& x) {
  std::vector<uint16_t> out(x.size());
  CpuDevice d;
  EXPECT_OK(d.Cast(x.data(), DType::kF32, out.data(), DType::kBF16, x.size(), nullptr));
  return out;
}

// Chunked states with a bf16 host model copy (three staging sets) on a deferred device, and
// DeviceOptimizerStates on the synchronous CPU backend to compare against. `ch` is declared after
// `dd`, so it is destroyed first.
struct CopyPair {
  explicit CopyPair(uint32_t seed) : dd(seed) {}
  DeferredDevice dd;
  CpuDevice cpu;
  std::unique_ptr<ChunkedOptimizerStates> ch;
  std::unique_ptr<OptimizerStates> ref;
};

void MakeCopyPair(int64_t n, int64_t chunk, CopyPair* p) {
  ChunkedOptimizerStatesOptions o = Options(chunk, 3);
  o.model_dtype = DType::kBF16;
  auto created = ChunkedOptimizerStates::Create(&p->dd, n, p->dd.default_stream(), o);
  ASSERT_OK(created);
  p->ch = std::move(created).value();
  auto dev = CreateDeviceOptimizerStates(&p->cpu, n, nullptr);
  ASSERT_OK(dev);
  p->ref = std::move(dev).value();
}

// The chunked states on a device with real asynchrony against DeviceOptimizerStates on the
// synchronous CPU backend: the same bits in every output, for chunk sizes 1 (every element a
// chunk), 7 and 100 (ragged: no range is a multiple of them) and one chunk for all, with two and
// three staging sets and several schedules. Per step the calls overlap each other's ranges with
// no blocking call in between (Update over two ranges, the update in backward over a sub-range
// with 16-bit gradients and over one with none, a cast of the masters), so the host-range
// hazards between chunks of different calls are exercised; the caller's stream is synchronized
// only where the contract says results are ready, and the gradients are clobbered right after.
TEST(ChunkedOptimizerStatesTest, BitwiseEqualToDeviceStatesForAnyChunking) {
  constexpr int64_t kN = 1031;
  for (int64_t chunk : {int64_t{1}, int64_t{7}, int64_t{100}, int64_t{1} << 20}) {
    for (int buffers : {2, 3}) {
      for (uint32_t seed : {1u, 2u, 3u}) {
        SCOPED_TRACE("chunk " + std::to_string(chunk) + ", buffers " + std::to_string(buffers) + ", seed " +
                     std::to_string(seed));
        DeferredDevice dd(seed);
        CpuDevice cpu;
        Stream* s = dd.default_stream();
        auto created = ChunkedOptimizerStates::Create(&dd, kN, s, Options(chunk, buffers));
        ASSERT_OK(created);
        ChunkedOptimizerStates& ch = **created;
        auto dev = CreateDeviceOptimizerStates(&cpu, kN, nullptr);
        ASSERT_OK(dev);
        OptimizerStates& ref = **dev;
        const int64_t staged = std::min<int64_t>(chunk, kN);
        EXPECT_EQ(ch.bytes().device, static_cast<size_t>(buffers) * 3 * staged * 4);
        EXPECT_GE(ch.bytes().host, 3u * kN * 4);

        std::vector<float> init(kN), m0(kN);
        for (int64_t i = 0; i < kN; ++i) {
          init[i] = 0.5f - 0.001f * static_cast<float>(i % 113);
          m0[i] = 0.0001f * static_cast<float>(i % 17);
        }
        for (OptimizerStates* st : {static_cast<OptimizerStates*>(&ch), &ref}) {
          ASSERT_OK(st->Write(OptState::kMaster, 0, kN, init.data()));
          ASSERT_OK(st->Write(OptState::kExpAvg, 0, kN, m0.data()));
        }
        for (int step = 1; step <= 3; ++step) {
          const AdamWParams h = Params(step);
          std::vector<float> g(kN);
          for (int64_t i = 0; i < kN; ++i) g[i] = 0.01f * static_cast<float>((i * 7 + step) % 29) - 0.1f;
          const std::vector<uint16_t> g16 = Bf16(g);
          std::vector<uint16_t> a(kN, 1), b(kN, 1), ca(kN, 2), cb(kN, 2);
          std::vector<float> ga = g;
          std::vector<uint16_t> g16a = g16;
          ASSERT_OK(ch.Update(0, 600, ga.data(), h, a.data(), DType::kBF16, s));
          ASSERT_OK(ch.Update(600, kN - 600, ga.data() + 600, h, nullptr, DType::kBF16, s));
          ASSERT_OK(ch.UpdateFromGradient(100, 300, g16a.data() + 100, DType::kBF16, h, s));
          ASSERT_OK(ch.UpdateFromGradient(590, 20, nullptr, DType::kBF16, h, s));
          ASSERT_OK(ch.CastMaster(5, kN - 5, ca.data() + 5, DType::kBF16, s));
          // The caller's stream passing these calls is what makes the outputs valid and the
          // gradients reusable: clobber the gradients then, before anything else synchronizes.
          ASSERT_OK(dd.SynchronizeStream(s));
          std::fill(ga.begin(), ga.end(), 1e30f);
          std::fill(g16a.begin(), g16a.end(), uint16_t{0x7f80});

          ASSERT_OK(ref.Update(0, 600, g.data(), h, b.data(), DType::kBF16, nullptr));
          ASSERT_OK(ref.Update(600, kN - 600, g.data() + 600, h, nullptr, DType::kBF16, nullptr));
          ASSERT_OK(ref.UpdateFromGradient(100, 300, g16.data() + 100, DType::kBF16, h, nullptr));
          ASSERT_OK(ref.UpdateFromGradient(590, 20, nullptr, DType::kBF16, h, nullptr));
          ASSERT_OK(ref.CastMaster(5, kN - 5, cb.data() + 5, DType::kBF16, nullptr));
          EXPECT_EQ(a, b) << "step " << step << ": the model copy written by Update";
          EXPECT_EQ(ca, cb) << "step " << step << ": CastMaster";
        }
        ASSERT_NO_FATAL_FAILURE(testing::ExpectStatesBitwiseEqual(ch, ref, kN));
        EXPECT_GT(ch.bytes().device, static_cast<size_t>(buffers) * 3 * staged * 4)
            << "the update in backward's gradient chunk is counted once allocated";
        EXPECT_GT(dd.ops_run(), 0);
      }
    }
  }
}

// With a 16-bit model dtype the update in backward keeps a host model copy, and CastMaster over a
// range where the copy is current uploads it instead of casting the masters: the same bits as
// DeviceOptimizerStates' cast, under a device with real asynchrony. The copy is current from
// creation and after UpdateFromGradient (two adjacent ranges make one), stale where Write or
// Update changed the masters since; CastMaster there casts the masters (copy_published counts
// the elements that came from the copy, so each path is known to have been taken).
TEST(ChunkedOptimizerStatesTest, HostModelCopyPublishesTheSameBits) {
  constexpr int64_t kN = 1031;
  for (int64_t chunk : {int64_t{7}, int64_t{100}}) {
    for (uint32_t seed : {1u, 2u, 3u}) {
      SCOPED_TRACE("chunk " + std::to_string(chunk) + ", seed " + std::to_string(seed));
      CopyPair pair(seed);
      ASSERT_NO_FATAL_FAILURE(MakeCopyPair(kN, chunk, &pair));
      DeferredDevice& dd = pair.dd;
      Stream* s = dd.default_stream();
      ChunkedOptimizerStates& ch = *pair.ch;
      OptimizerStates& ref = *pair.ref;
      EXPECT_EQ(ch.bytes().device, 3u * (3 * chunk * 4 + chunk * 2));
      EXPECT_GE(ch.bytes().host, 3u * kN * 4 + kN * 2);

      auto expect_cast = [&](int64_t off, int64_t n, bool from_copy, const char* what) {
        std::vector<uint16_t> a(kN, 3), b(kN, 3);
        const int64_t before = ch.copy_published();
        ASSERT_OK(ch.CastMaster(off, n, a.data() + off, DType::kBF16, s));
        ASSERT_OK(dd.SynchronizeStream(s));
        ASSERT_OK(ref.CastMaster(off, n, b.data() + off, DType::kBF16, nullptr));
        EXPECT_EQ(a, b) << what;
        EXPECT_EQ(ch.copy_published() - before, from_copy ? n : 0) << what;
      };
      // Zero masters, zero copy: current at creation.
      expect_cast(0, kN, true, "at creation");
      std::vector<float> init(kN);
      for (int64_t i = 0; i < kN; ++i) init[i] = 0.5f - 0.001f * static_cast<float>(i % 113);
      ASSERT_OK(ch.Write(OptState::kMaster, 0, kN, init.data()));
      ASSERT_OK(ref.Write(OptState::kMaster, 0, kN, init.data()));
      expect_cast(0, kN, false, "after Write: the masters are cast");
      for (int step = 1; step <= 3; ++step) {
        SCOPED_TRACE("step " + std::to_string(step));
        const AdamWParams h = Params(step);
        std::vector<float> g(kN);
        for (int64_t i = 0; i < kN; ++i) g[i] = 0.01f * static_cast<float>((i * 7 + step) % 29) - 0.1f;
        std::vector<uint16_t> g16 = Bf16(g);
        const std::vector<uint16_t> keep = g16;
        ASSERT_OK(ch.UpdateFromGradient(0, 500, g16.data(), DType::kBF16, h, s));
        ASSERT_OK(ch.UpdateFromGradient(500, kN - 500, g16.data() + 500, DType::kBF16, h, s));
        ASSERT_OK(dd.SynchronizeStream(s));
        std::fill(g16.begin(), g16.end(), uint16_t{0x7f80});  // the gradients may be reused now
        ASSERT_OK(ref.UpdateFromGradient(0, 500, keep.data(), DType::kBF16, h, nullptr));
        ASSERT_OK(ref.UpdateFromGradient(500, kN - 500, keep.data() + 500, DType::kBF16, h, nullptr));
        expect_cast(0, kN, true, "after the update in backward");
      }
      // Masters changed by Write over [200, 300) and Update over [0, 100): stale there only.
      std::vector<float> w(100, 0.25f), g(100, 0.125f);
      ASSERT_OK(ch.Write(OptState::kMaster, 200, 100, w.data()));
      ASSERT_OK(ref.Write(OptState::kMaster, 200, 100, w.data()));
      ASSERT_OK(ch.Update(0, 100, g.data(), Params(4), nullptr, DType::kBF16, s));
      ASSERT_OK(dd.SynchronizeStream(s));
      ASSERT_OK(ref.Update(0, 100, g.data(), Params(4), nullptr, DType::kBF16, nullptr));
      expect_cast(0, kN, false, "a range with stale parts");
      expect_cast(150, 50, true, "a current range between stale ones");
      expect_cast(300, kN - 300, true, "the current tail");
      expect_cast(250, 100, false, "straddling a stale range");
      ASSERT_NO_FATAL_FAILURE(testing::ExpectStatesBitwiseEqual(ch, ref, kN));
    }
  }
}

// The overlapped step's publication from the host model copy (CastMasterAfter) and the next
// step's update in backward are queued back to back, with no blocking call in between: the next
// downloads rewrite the copy the publication reads, so they must run after it (the upload
// stream's order does it: the publication, then the next chunk's upload, its update, its
// download; a publication moved to a stream of its own without a wait for it failed here on the
// deferred device). The update in backward runs the upper half first, as backward reports the
// last parameters first. Every step's weights and the final states are bitwise the device states'.
TEST(ChunkedOptimizerStatesTest, PublicationsFromTheCopyOrderTheNextStepsDownloads) {
  constexpr int64_t kN = 1031;
  constexpr int kSteps = 3;
  for (int64_t chunk : {int64_t{7}, int64_t{100}}) {
    for (uint32_t seed : {1u, 2u, 3u, 4u, 5u, 6u}) {
      SCOPED_TRACE("chunk " + std::to_string(chunk) + ", seed " + std::to_string(seed));
      CopyPair pair(seed);
      ASSERT_NO_FATAL_FAILURE(MakeCopyPair(kN, chunk, &pair));
      DeferredDevice& dd = pair.dd;
      Stream* s = dd.default_stream();
      ChunkedOptimizerStates& ch = *pair.ch;
      OptimizerStates& ref = *pair.ref;
      std::vector<float> init(kN);
      for (int64_t i = 0; i < kN; ++i) init[i] = 0.5f - 0.001f * static_cast<float>(i % 113);
      ASSERT_OK(ch.Write(OptState::kMaster, 0, kN, init.data()));
      ASSERT_OK(ref.Write(OptState::kMaster, 0, kN, init.data()));
      std::vector<std::vector<uint16_t>> grads(kSteps), got(kSteps, std::vector<uint16_t>(kN, 3)),
          want(kSteps, std::vector<uint16_t>(kN, 3));
      std::vector<std::unique_ptr<Event>> marks;
      for (int step = 1; step <= kSteps; ++step) {
        const AdamWParams h = Params(step);
        std::vector<float> g(kN);
        for (int64_t i = 0; i < kN; ++i) g[i] = 0.01f * static_cast<float>((i * 5 + step) % 31) - 0.12f;
        std::vector<uint16_t>& g16 = grads[step - 1];
        g16 = Bf16(g);
        ASSERT_OK(ch.UpdateFromGradient(500, kN - 500, g16.data() + 500, DType::kBF16, h, s));
        ASSERT_OK(ch.UpdateFromGradient(0, 500, g16.data(), DType::kBF16, h, s));
        auto mark = dd.CreateEvent();
        ASSERT_OK(mark);
        ASSERT_OK(dd.RecordEvent(mark->get(), s));
        ASSERT_OK(ch.CastMasterAfter(0, kN, got[step - 1].data(), DType::kBF16, mark->get()));
        marks.push_back(std::move(mark).value());
        ASSERT_OK(ref.UpdateFromGradient(500, kN - 500, g16.data() + 500, DType::kBF16, h, nullptr));
        ASSERT_OK(ref.UpdateFromGradient(0, 500, g16.data(), DType::kBF16, h, nullptr));
        ASSERT_OK(ref.CastMaster(0, kN, want[step - 1].data(), DType::kBF16, nullptr));
      }
      EXPECT_EQ(ch.copy_published(), kSteps * kN) << "every publication came from the host copy";
      ASSERT_OK(ch.WaitForUpdates(s));
      ASSERT_OK(dd.SynchronizeStream(s));
      for (int k = 0; k < kSteps; ++k) EXPECT_EQ(got[k], want[k]) << "step " << k + 1 << "'s weights";
      ASSERT_NO_FATAL_FAILURE(testing::ExpectStatesBitwiseEqual(ch, ref, kN));
    }
  }
}

// Copies to and from the device and the blocking Read/Write move exactly the elements asked for,
// after every queued chunk (an Update in flight when they are called); out-of-range calls are
// OutOfRange errors that name the range.
TEST(ChunkedOptimizerStatesTest, CopiesWaitForQueuedChunksAndAreExact) {
  constexpr int64_t kN = 50;
  DeferredDevice dd(7);
  Stream* s = dd.default_stream();
  auto created = ChunkedOptimizerStates::Create(&dd, kN, s, Options(8, 2));
  ASSERT_OK(created);
  ChunkedOptimizerStates& ch = **created;
  std::vector<float> ones(kN, 1.0f), got(kN);
  ASSERT_OK(ch.Write(OptState::kExpAvg, 0, kN, ones.data()));
  // In flight: the zero-gradient update of [0, kN), which decays exp_avg by beta1.
  AdamWParams h = Params(1);
  std::vector<float> zeros(kN, 0.0f);
  ASSERT_OK(ch.Update(0, kN, zeros.data(), h, nullptr, DType::kF32, s));
  std::vector<float> dev(5, -1.0f);
  ASSERT_OK(ch.CopyToDevice(OptState::kExpAvg, 10, 3, dev.data() + 1, s));
  EXPECT_EQ(dev[0], -1.0f);
  EXPECT_EQ(dev[1], h.beta1 * 1.0f) << "CopyToDevice waited for the queued update";
  EXPECT_EQ(dev[3], h.beta1 * 1.0f);
  EXPECT_EQ(dev[4], -1.0f);
  const float in[2] = {7.0f, 8.0f};
  ASSERT_OK(ch.CopyFromDevice(OptState::kExpAvgSq, kN - 2, 2, in, s));
  ASSERT_OK(ch.Read(OptState::kExpAvgSq, kN - 3, 3, got.data()));
  EXPECT_EQ(got[0], 0.0f);
  EXPECT_EQ(got[1], 7.0f);
  EXPECT_EQ(got[2], 8.0f);
  ASSERT_OK(ch.Update(0, kN, zeros.data(), h, nullptr, DType::kF32, s));
  ASSERT_OK(ch.Read(OptState::kExpAvg, 0, kN, got.data()));
  EXPECT_EQ(got[kN - 1], h.beta1 * (h.beta1 * 1.0f)) << "Read waited for the queued update";

  Status bad = ch.Read(OptState::kMaster, kN - 1, 2, got.data());
  EXPECT_EQ(bad.code(), StatusCode::kOutOfRange) << bad.ToString();
  EXPECT_NE(bad.message().find("[49, 51) outside [0, 50)"), std::string::npos) << bad.ToString();
  EXPECT_EQ(ch.Update(-1, 2, zeros.data(), h, nullptr, DType::kF32, s).code(), StatusCode::kOutOfRange);
  EXPECT_EQ(ch.CastMaster(0, kN + 1, got.data(), DType::kF32, s).code(), StatusCode::kOutOfRange);
  EXPECT_EQ(ch.UpdateFromGradient(kN, 1, nullptr, DType::kF32, h, s).code(), StatusCode::kOutOfRange);
}

// Chunk(e) names the chunk of the latest call over e; waiting on its `updated` event is enough to
// read e's new weight (the other chunks may not have run yet); WaitForUpdates makes a stream wait
// for everything; a blocking call retires every chunk.
TEST(ChunkedOptimizerStatesTest, ChunkEventsAndWaitForUpdates) {
  constexpr int64_t kN = 1000;
  DeferredDevice dd(11);
  Stream* s = dd.default_stream();
  auto other = dd.CreateStream();
  ASSERT_OK(other);
  auto created = ChunkedOptimizerStates::Create(&dd, kN, s, Options(100, 3));
  ASSERT_OK(created);
  ChunkedOptimizerStates& ch = **created;
  EXPECT_EQ(ch.chunk_numel(), 100);
  EXPECT_EQ(ch.chunk_buffers(), 3);
  EXPECT_FALSE(ch.Chunk(0).has_value());
  CpuDevice cpu;
  auto ref = CreateDeviceOptimizerStates(&cpu, kN, nullptr);
  ASSERT_OK(ref);
  std::vector<float> init(kN);
  for (int64_t i = 0; i < kN; ++i) init[i] = 0.25f + 0.001f * static_cast<float>(i % 37);
  ASSERT_OK(ch.Write(OptState::kMaster, 0, kN, init.data()));
  ASSERT_OK((*ref)->Write(OptState::kMaster, 0, kN, init.data()));
  std::vector<float> g(kN, 0.125f);
  const AdamWParams h = Params(1);
  std::vector<float> want(kN), got(kN, -5.0f);
  ASSERT_OK((*ref)->Update(0, kN, g.data(), h, want.data(), DType::kF32, nullptr));

  // Offset 50: chunks [50, 150), [150, 250), ..., [950, 1000).
  ASSERT_OK(ch.Update(50, kN - 50, g.data() + 50, h, got.data() + 50, DType::kF32, s));
  EXPECT_FALSE(ch.Chunk(49).has_value());
  auto c = ch.Chunk(260);
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->begin, 250);
  EXPECT_EQ(c->end, 350);
  ASSERT_NE(c->updated, nullptr);
  ASSERT_NE(c->stored, nullptr);
  auto last = ch.Chunk(999);
  ASSERT_TRUE(last.has_value());
  EXPECT_EQ(last->begin, 950);
  EXPECT_EQ(last->end, 1000);
  ASSERT_OK(dd.SynchronizeEvent(c->updated));
  EXPECT_EQ(std::memcmp(got.data() + 250, want.data() + 250, 100 * 4), 0);
  // A later call over part of a chunk replaces it there only.
  ASSERT_OK(ch.CastMaster(300, 10, got.data() + 300, DType::kF32, s));
  auto cast = ch.Chunk(305);
  ASSERT_TRUE(cast.has_value());
  EXPECT_EQ(cast->begin, 300);
  EXPECT_EQ(cast->end, 310);
  auto left = ch.Chunk(299), right = ch.Chunk(310);
  ASSERT_TRUE(left.has_value() && right.has_value());
  EXPECT_EQ(left->begin, 250);
  EXPECT_EQ(left->end, 300);
  EXPECT_EQ(right->begin, 310);
  EXPECT_EQ(right->end, 350);
  EXPECT_EQ(left->updated, right->updated);

  ASSERT_OK(ch.WaitForUpdates(other->get()));
  ASSERT_OK(dd.SynchronizeStream(other->get()));
  EXPECT_EQ(std::memcmp(got.data() + 50, want.data() + 50, (kN - 50) * 4), 0);
  EXPECT_EQ(got[49], -5.0f);
  std::vector<float> master(kN), want_master(kN);
  ASSERT_OK(ch.Read(OptState::kMaster, 0, kN, master.data()));
  EXPECT_FALSE(ch.Chunk(500).has_value()) << "a blocking call retires every chunk";
  ASSERT_OK((*ref)->Read(OptState::kMaster, 0, kN, want_master.data()));
  EXPECT_EQ(std::memcmp(master.data() + 50, want_master.data() + 50, (kN - 50) * 4), 0);
  EXPECT_EQ(master[0], init[0]) << "elements outside the updated range are untouched";
}

// UpdateAfter / CastMasterAfter (overlap_step): one call per chunk, ordered after an event rather
// than a stream, no stream made to wait. Waiting on one chunk's `updated` event is enough to read
// its weights while later calls are still being queued; the calls keep their order over the
// states with UpdateFromGradient before them; the result is bitwise the device states'. The
// "compute" stream never waits on anything but the events named, so the deferred device runs the
// chunks in many orders against it.
TEST(ChunkedOptimizerStatesTest, UpdateAfterOrdersOnTheEventOnly) {
  constexpr int64_t kN = 230;  // chunks of 50: the last one ragged
  for (uint32_t seed : {1u, 2u, 3u, 4u, 5u}) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    DeferredDevice dd(seed);
    Stream* s = dd.default_stream();
    auto created = ChunkedOptimizerStates::Create(&dd, kN, s, Options(50, 2));
    ASSERT_OK(created);
    ChunkedOptimizerStates& ch = **created;
    CpuDevice cpu;
    auto ref = CreateDeviceOptimizerStates(&cpu, kN, nullptr);
    ASSERT_OK(ref);
    std::vector<float> init(kN), g(kN);
    for (int64_t i = 0; i < kN; ++i) {
      init[i] = 0.5f - 0.003f * static_cast<float>(i % 41);
      g[i] = 0.01f * static_cast<float>((i * 7) % 13) - 0.05f;
    }
    ASSERT_OK(ch.Write(OptState::kMaster, 0, kN, init.data()));
    ASSERT_OK((*ref)->Write(OptState::kMaster, 0, kN, init.data()));
    auto mark = dd.CreateEvent();
    ASSERT_OK(mark);
    std::vector<float> want(kN), got(kN, -7.0f), want_cast(kN), got_cast(kN, -7.0f);
    for (int step = 1; step <= 2; ++step) {
      const AdamWParams h = Params(step);
      // The gradients are written on the stream (as the engine's boundary reads them).
      std::vector<float> dev_g(kN, 0.0f);
      ASSERT_OK(dd.Copy(dev_g.data(), g.data(), kN * 4, CopyKind::kHostToDevice, s));
      ASSERT_OK(dd.RecordEvent(mark->get(), s));
      ASSERT_OK((*ref)->Update(0, kN, g.data(), h, want.data(), DType::kF32, nullptr));
      for (int64_t b = 0; b < kN; b += 50) {
        const int64_t n = std::min<int64_t>(50, kN - b);
        ASSERT_OK(ch.UpdateAfter(b, n, dev_g.data() + b, h, got.data() + b, DType::kF32, mark->get()));
        if (b == 100) {
          // Read the chunk just queued: its event alone orders the read.
          auto c = ch.Chunk(b + 3);
          ASSERT_TRUE(c.has_value());
          EXPECT_EQ(c->begin, b);
          EXPECT_EQ(c->end, b + n);
          std::vector<float> seen(n, -1.0f);
          ASSERT_OK(dd.StreamWaitEvent(s, c->updated));
          ASSERT_OK(dd.Copy(seen.data(), got.data() + b, n * 4, CopyKind::kDeviceToHost, s));
          ASSERT_OK(dd.SynchronizeStream(s));
          EXPECT_EQ(std::memcmp(seen.data(), want.data() + b, n * 4), 0) << "step " << step;
        }
      }
      // The stream waits for every chunk (device-side) before the gradients are clobbered.
      ASSERT_OK(ch.WaitForUpdates(s));
      ASSERT_OK(dd.Fill(dev_g.data(), DType::kF32, kN, 1e30f, s));
      ASSERT_OK(dd.SynchronizeStream(s));
      EXPECT_EQ(std::memcmp(got.data(), want.data(), kN * 4), 0) << "step " << step;
    }
    // The cast after the updates, chunk by chunk after a fresh mark.
    ASSERT_OK(dd.RecordEvent(mark->get(), s));
    for (int64_t b = 0; b < kN; b += 50) {
      ASSERT_OK(ch.CastMasterAfter(b, std::min<int64_t>(50, kN - b), got_cast.data() + b, DType::kF32, mark->get()));
    }
    ASSERT_OK(ch.WaitForUpdates(s));
    ASSERT_OK(dd.SynchronizeStream(s));
    ASSERT_OK((*ref)->CastMaster(0, kN, want_cast.data(), DType::kF32, nullptr));
    EXPECT_EQ(std::memcmp(got_cast.data(), want_cast.data(), kN * 4), 0);
    for (OptState which : {OptState::kMaster, OptState::kExpAvg, OptState::kExpAvgSq}) {
      std::vector<float> a(kN), b(kN);
      ASSERT_OK(ch.Read(which, 0, kN, a.data()));
      ASSERT_OK((*ref)->Read(which, 0, kN, b.data()));
      EXPECT_EQ(std::memcmp(a.data(), b.data(), kN * 4), 0) << OptStateName(which);
    }
  }
}

// Bad options are InvalidArgument errors naming the config key; an empty state is valid.
TEST(ChunkedOptimizerStatesTest, OptionErrorsAndEmptyStates) {
  CpuDevice cpu;
  auto zero_chunk = ChunkedOptimizerStates::Create(&cpu, 10, nullptr, Options(0, 3));
  ASSERT_FALSE(zero_chunk.ok());
  EXPECT_EQ(zero_chunk.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(zero_chunk.status().message().find("offload_optimizer.chunk_size"), std::string::npos)
      << zero_chunk.status().ToString();
  auto one_set = ChunkedOptimizerStates::Create(&cpu, 10, nullptr, Options(4, 1));
  ASSERT_FALSE(one_set.ok());
  EXPECT_NE(one_set.status().message().find("offload_optimizer.chunk_buffers must be >= 2"), std::string::npos)
      << one_set.status().ToString();
  auto empty = ChunkedOptimizerStates::Create(&cpu, 0, nullptr, Options(4, 2));
  ASSERT_OK(empty);
  EXPECT_EQ((*empty)->numel(), 0);
  EXPECT_OK((*empty)->Update(0, 0, nullptr, AdamWParams(), nullptr, DType::kF32, nullptr));
  EXPECT_OK((*empty)->Read(OptState::kMaster, 0, 0, nullptr));
}

}  // namespace
}  // namespace zero
