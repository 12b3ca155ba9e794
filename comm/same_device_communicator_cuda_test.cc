// SameDeviceCommunicator on one real GPU: worlds 2, 4 and 8, every rank its own CudaDevice on
// cuda:0. Every collective and dtype bitwise against the rank-order reference; the CUDA reduction
// kernel bitwise equal to the host loop on special values (signed zeros, Inf, NaN, subnormals);
// stream ordering with nothing synchronizing the host: each rank writes its input on its default
// stream, issues the collectives after it, makes the stream wait for them and overwrites the input
// at once, with inputs large enough that the ranks' kernels overlap. Tagged "gpu": it builds
// wherever CUDA is installed and runs where a GPU is.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "comm/comm_test_util.h"
#include "comm/rank_reduce.h"
#include "comm/same_device_communicator.h"
#include "runtime/cuda_device.h"
#include "runtime/gpu_test_util.h"
#include "testing/status_matchers.h"

namespace zero {
namespace {

using testing::FirstMismatch;
using testing::MakeInput;
using testing::ReferenceReduce;

constexpr DType kDTypes[] = {DType::kF32, DType::kBF16, DType::kF16};
constexpr ReduceOp kOps[] = {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax};

Result<std::unique_ptr<Device>> OnGpu0(int) {
  ZERO_ASSIGN_OR_RETURN(std::unique_ptr<CudaDevice> d, CudaDevice::Create(0));
  return std::unique_ptr<Device>(std::move(d));
}

SameDeviceOptions Options() {
  SameDeviceOptions o;
  o.comm.timeout = std::chrono::milliseconds(60000);
  return o;
}

// Copies `host` to a new device buffer.
Result<DeviceBuffer> Upload(Device* d, const std::vector<uint8_t>& host) {
  ZERO_ASSIGN_OR_RETURN(DeviceBuffer b, d->Allocate(host.size()));
  ZERO_RETURN_IF_ERROR(d->Copy(b.data(), host.data(), host.size(), CopyKind::kHostToDevice, nullptr));
  ZERO_RETURN_IF_ERROR(d->SynchronizeStream(nullptr));
  return b;
}

Result<std::vector<uint8_t>> Download(Device* d, const void* p, size_t bytes) {
  std::vector<uint8_t> host(bytes);
  ZERO_RETURN_IF_ERROR(d->Copy(host.data(), p, bytes, CopyKind::kDeviceToHost, nullptr));
  ZERO_RETURN_IF_ERROR(d->SynchronizeStream(nullptr));
  return host;
}

class SameDeviceCudaTest : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override { ZERO_SKIP_WITHOUT_CUDA_DEVICES(1); }
};

TEST_P(SameDeviceCudaTest, EveryCollectiveMatchesTheReferenceBitwise) {
  const int world = GetParam();
  Status s = RunSameDeviceRanks(
      world,
      [&](int rank, Communicator* comm, Device* d) -> Status {
        RANK_CHECK(comm->backend() == "same_device", comm->backend());
        uint32_t seed = 1;
        for (DType t : kDTypes) {
          const size_t es = SizeOf(t);
          for (ReduceOp op : kOps) {
            for (size_t n : {size_t{1}, size_t{1031}, size_t{300001}}) {
              ++seed;
              const std::string what = std::string(DTypeName(t)) + "/" + ReduceOpName(op) + "/" + std::to_string(n);
              // AllReduce (in place; counts not divisible by the world size).
              ZERO_ASSIGN_OR_RETURN(DeviceBuffer buf, Upload(d, MakeInput(t, n, rank, seed)));
              auto w = comm->AllReduce(buf.data(), n, t, op, d->default_stream());
              RANK_EXPECT_OK(w.status());
              RANK_EXPECT_OK((*w)->StreamWait(d->default_stream()));
              ZERO_ASSIGN_OR_RETURN(std::vector<uint8_t> got, Download(d, buf.data(), n * es));
              std::vector<uint8_t> want(n * es);
              ReferenceReduce(t, 0, n, world, op, seed, want.data());
              long bad = FirstMismatch(got.data(), want.data(), n, t);
              RANK_CHECK(bad < 0, "AllReduce " + what + " at " + std::to_string(bad));
              // ReduceScatter of n per rank.
              ZERO_ASSIGN_OR_RETURN(DeviceBuffer send, Upload(d, MakeInput(t, world * n, rank, seed)));
              ZERO_ASSIGN_OR_RETURN(DeviceBuffer recv, d->Allocate(n * es));
              auto rs = comm->ReduceScatter(send.data(), recv.data(), n, t, op, d->default_stream());
              RANK_EXPECT_OK(rs.status());
              RANK_EXPECT_OK((*rs)->Wait());
              ZERO_ASSIGN_OR_RETURN(got, Download(d, recv.data(), n * es));
              ReferenceReduce(t, rank * n, n, world, op, seed, want.data());
              bad = FirstMismatch(got.data(), want.data(), n, t);
              RANK_CHECK(bad < 0, "ReduceScatter " + what + " at " + std::to_string(bad));
            }
          }
          // AllGather in place and Broadcast from every root.
          const size_t n = 777;
          std::vector<uint8_t> all(world * n * es);
          for (int q = 0; q < world; ++q) {
            std::vector<uint8_t> part = MakeInput(t, n, q, 5);
            std::memcpy(all.data() + q * n * es, part.data(), n * es);
          }
          std::vector<uint8_t> start(world * n * es, 0);
          std::memcpy(start.data() + rank * n * es, all.data() + rank * n * es, n * es);
          ZERO_ASSIGN_OR_RETURN(DeviceBuffer gathered, Upload(d, start));
          auto ag = comm->AllGather(static_cast<char*>(gathered.data()) + rank * n * es, gathered.data(), n, t,
                                    d->default_stream());
          RANK_EXPECT_OK(ag.status());
          RANK_EXPECT_OK((*ag)->Wait());
          ZERO_ASSIGN_OR_RETURN(std::vector<uint8_t> got, Download(d, gathered.data(), all.size()));
          RANK_CHECK(got == all, std::string("AllGather ") + DTypeName(t));
          for (int root = 0; root < world; ++root) {
            ZERO_ASSIGN_OR_RETURN(DeviceBuffer b, Upload(d, MakeInput(t, n, rank, 11)));
            auto bc = comm->Broadcast(b.data(), n, t, root, d->default_stream());
            RANK_EXPECT_OK(bc.status());
            RANK_EXPECT_OK((*bc)->Wait());
            ZERO_ASSIGN_OR_RETURN(got, Download(d, b.data(), n * es));
            RANK_CHECK(got == MakeInput(t, n, root, 11), "Broadcast from " + std::to_string(root));
          }
        }
        double v = rank + 0.5;
        RANK_EXPECT_OK(comm->AllReduceHost(&v, 1, ReduceOp::kSum));
        RANK_CHECK(v == world * world / 2.0, std::to_string(v));
        RANK_EXPECT_OK(comm->Barrier());
        return comm->CheckHealth();
      },
      Options(), OnGpu0);
  EXPECT_OK(s);
}

// Inputs a rank writes on its stream right before the collectives and overwrites right after
// them, with nothing synchronizing the host: the sums are right only if every collective waited
// for every rank's writes and every rank's completion waited for the others' reads. 4M elements
// per rank so that the ranks' kernels and copies overlap on the GPU.
TEST_P(SameDeviceCudaTest, StreamOrderingWithoutHostSynchronization) {
  const int world = GetParam();
  constexpr int kIters = 12;
  constexpr size_t kShare = size_t{1} << 22;
  auto value = [](int iter, int rank) { return static_cast<float>((iter * 7 + rank * 3) % 64 + 1); };
  Status s = RunSameDeviceRanks(
      world,
      [&](int rank, Communicator* comm, Device* d) -> Status {
        Stream* st = d->default_stream();
        ZERO_ASSIGN_OR_RETURN(DeviceBuffer send, d->Allocate(world * kShare * 4));
        ZERO_ASSIGN_OR_RETURN(DeviceBuffer recv, d->Allocate(kShare * 4));
        ZERO_ASSIGN_OR_RETURN(DeviceBuffer inplace, d->Allocate(world * kShare * 4));
        ZERO_ASSIGN_OR_RETURN(DeviceBuffer gathered, d->Allocate(world * kShare * 4));
        ZERO_ASSIGN_OR_RETURN(PinnedBuffer out, d->AllocatePinned(kIters * 3 * 4));
        float* o = out.as<float>();
        // One collective at a time, its input overwritten right after it (a rank whose completion
        // did not wait for the others' reads would overwrite what a rank scheduled later reads).
        auto then_overwrite = [&](Result<std::unique_ptr<Work>> w, const float* result, float* slot, void* input,
                                  size_t input_count) -> Status {
          RANK_EXPECT_OK(w.status());
          RANK_EXPECT_OK((*w)->StreamWait(st));
          RANK_EXPECT_OK(d->Copy(slot, result, 4, CopyKind::kDeviceToHost, st));
          return d->Fill(input, DType::kF32, input_count, -1.0f, st);
        };
        for (int iter = 0; iter < kIters; ++iter) {
          RANK_EXPECT_OK(d->Fill(send.data(), DType::kF32, world * kShare, value(iter, rank), st));
          RANK_EXPECT_OK(
              then_overwrite(comm->ReduceScatter(send.data(), recv.data(), kShare, DType::kF32, ReduceOp::kSum, st),
                             recv.as<float>() + kShare - 1, o + iter * 3, send.data(), world * kShare));
          RANK_EXPECT_OK(d->Fill(send.data(), DType::kF32, world * kShare, value(iter, rank), st));
          RANK_EXPECT_OK(then_overwrite(
              comm->AllGather(send.as<char>() + rank * kShare * 4, gathered.data(), kShare, DType::kF32, st),
              gathered.as<float>() + world * kShare - 1, o + iter * 3 + 1, send.data(), world * kShare));
          RANK_EXPECT_OK(d->Fill(inplace.data(), DType::kF32, world * kShare, 2 * value(iter, rank), st));
          RANK_EXPECT_OK(then_overwrite(
              comm->AllReduce(inplace.data(), world * kShare, DType::kF32, ReduceOp::kSum, st),
              inplace.as<float>() + world * kShare - 1, o + iter * 3 + 2, inplace.data(), world * kShare));
        }
        RANK_EXPECT_OK(d->SynchronizeStream(st));
        for (int iter = 0; iter < kIters; ++iter) {
          float sum = 0;
          for (int q = 0; q < world; ++q) sum += value(iter, q);
          RANK_CHECK(o[iter * 3] == sum, "iteration " + std::to_string(iter) + " reduce-scatter " +
                                             std::to_string(o[iter * 3]) + " vs " + std::to_string(sum));
          RANK_CHECK(o[iter * 3 + 1] == value(iter, world - 1), "iteration " + std::to_string(iter) + " all-gather");
          RANK_CHECK(o[iter * 3 + 2] == 2 * sum,
                     "iteration " + std::to_string(iter) + " all-reduce " + std::to_string(o[iter * 3 + 2]));
        }
        return comm->CheckHealth();
      },
      Options(), OnGpu0);
  EXPECT_OK(s);
}

INSTANTIATE_TEST_SUITE_P(Worlds, SameDeviceCudaTest, ::testing::Values(2, 4, 8),
                         [](const ::testing::TestParamInfo<int>& info) { return "w" + std::to_string(info.param); });

// The kernel and the host loop on the same special values, every dtype and op: the same bits.
TEST(SameDeviceCudaKernelTest, EqualsTheHostLoopOnSpecialValues) {
  ZERO_SKIP_WITHOUT_CUDA_DEVICES(1);
  const uint32_t specials[] = {0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc01234u, 0xffc00001u,
                               0x00000001u, 0x80400000u, 0x3f800000u, 0xbf800000u, 0x477fe000u, 0x33000000u};
  constexpr int kSrcs = 3;
  constexpr size_t kN = 12 * 12 * 12;
  for (DType t : kDTypes) {
    const size_t es = SizeOf(t);
    std::vector<std::vector<uint8_t>> host(kSrcs, std::vector<uint8_t>(kN * es));
    for (size_t i = 0; i < kN; ++i) {
      size_t k = i;
      for (int s = 0; s < kSrcs; ++s, k /= 12) StoreFromFloat(host[s].data(), t, i, BitsToFloat(specials[k % 12]));
    }
    for (RankReduceOp op : {RankReduceOp::kSum, RankReduceOp::kAvg, RankReduceOp::kMax}) {
      RankReduceArgs a;
      a.n_srcs = kSrcs;
      a.count = kN;
      a.dtype = t;
      a.op = op;
      std::vector<uint8_t> want(kN * es);
      for (int s = 0; s < kSrcs; ++s) a.srcs[s] = host[s].data();
      a.out = want.data();
      RankReduceHost(a);
      // The device side: the same reduction through a world-3 group (the ranks' inputs are the
      // three sources), read back from rank 0.
      std::vector<std::vector<uint8_t>> got(kSrcs);
      const ReduceOp rop = op == RankReduceOp::kSum   ? ReduceOp::kSum
                           : op == RankReduceOp::kAvg ? ReduceOp::kAvg
                                                      : ReduceOp::kMax;
      Status s = RunSameDeviceRanks(
          kSrcs,
          [&](int rank, Communicator* comm, Device* d) -> Status {
            ZERO_ASSIGN_OR_RETURN(DeviceBuffer b, Upload(d, host[rank]));
            auto w = comm->AllReduce(b.data(), kN, t, rop, d->default_stream());
            RANK_EXPECT_OK(w.status());
            RANK_EXPECT_OK((*w)->Wait());
            ZERO_ASSIGN_OR_RETURN(got[rank], Download(d, b.data(), kN * es));
            return OkStatus();
          },
          Options(), OnGpu0);
      ASSERT_OK(s);
      for (int r = 0; r < kSrcs; ++r) {
        EXPECT_EQ(FirstMismatch(got[r].data(), want.data(), kN, t), -1)
            << DTypeName(t) << " op " << static_cast<int>(op) << " rank " << r;
      }
    }
  }
}

}  // namespace
}  // namespace zero
