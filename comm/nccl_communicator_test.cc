// NcclCommunicator on real GPUs. World size 1 on GPU 0: every operation and dtype against the
// expected values, stream ordering through `after` and StreamWait. With two or more GPUs, the
// multi-process variant (one comm_worker process per GPU, LOCAL_RANK picks it) runs the same mix
// of collectives as the Gloo multi-process test and the killed-rank case; otherwise it skips.
// Tagged "gpu": it builds everywhere CUDA and NCCL are installed, runs only where a GPU is.
#include "comm/nccl_communicator.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <cstring>
#include <string>
#include <vector>

#include "comm/comm_test_util.h"
#include "comm/worker_launcher.h"
#include "runtime/cuda_device.h"
#include "runtime/gpu_test_util.h"

namespace zero {
namespace {

int GpuCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n;
}

class NcclSingleGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ZERO_SKIP_WITHOUT_CUDA_DEVICES(1);
    auto dev = CudaDevice::Create(0);
    ASSERT_TRUE(dev.ok()) << dev.status().ToString();
    dev_ = std::move(dev).value();
    NcclOptions o;
    o.comm.timeout = std::chrono::milliseconds(30000);
    auto comm = NcclCommunicator::Create(0, 1, nullptr, dev_.get(), o);
    ASSERT_TRUE(comm.ok()) << comm.status().ToString();
    comm_ = std::move(comm).value();
  }

  std::vector<uint8_t> RoundTrip(const std::vector<uint8_t>& host, size_t out_bytes,
                                 const std::function<Status(void* dev_in)>& op) {
    auto buf = dev_->Allocate(std::max(host.size(), out_bytes));
    EXPECT_TRUE(buf.ok());
    EXPECT_TRUE(dev_->Copy(buf->data(), host.data(), host.size(), CopyKind::kHostToDevice, nullptr).ok());
    EXPECT_TRUE(dev_->Synchronize().ok());
    Status s = op(buf->data());
    EXPECT_TRUE(s.ok()) << s.ToString();
    std::vector<uint8_t> out(out_bytes);
    EXPECT_TRUE(dev_->Copy(out.data(), buf->data(), out_bytes, CopyKind::kDeviceToHost, nullptr).ok());
    EXPECT_TRUE(dev_->Synchronize().ok());
    return out;
  }

  std::unique_ptr<CudaDevice> dev_;
  std::unique_ptr<NcclCommunicator> comm_;
};

TEST_F(NcclSingleGpuTest, EveryOpEveryDType) {
  EXPECT_EQ(comm_->backend(), "nccl");
  uint32_t seed = 1;
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (size_t n : {size_t{1}, size_t{7}, size_t{1000003}}) {
      const size_t es = SizeOf(t);
      ++seed;
      auto in = testing::MakeInput(t, n, 0, seed);
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax}) {
        // One rank: every reduction is the identity.
        auto out = RoundTrip(in, in.size(), [&](void* d) -> Status {
          ZERO_ASSIGN_OR_RETURN(auto w, comm_->AllReduce(d, n, t, op));
          return w->Wait();
        });
        EXPECT_EQ(out, in) << "AllReduce " << DTypeName(t) << " " << ReduceOpName(op) << " n=" << n;
        auto rs = RoundTrip(in, in.size(), [&](void* d) -> Status {
          ZERO_ASSIGN_OR_RETURN(auto recv, dev_->Allocate(n * es));
          // A sentinel, so stale memory cannot pass for a result; `after` orders the fill.
          ZERO_RETURN_IF_ERROR(dev_->Fill(recv.data(), t, n, -77.0f, dev_->default_stream()));
          ZERO_ASSIGN_OR_RETURN(
              auto w, comm_->ReduceScatter(d, recv.data(), n, t, op, dev_->default_stream()));
          ZERO_RETURN_IF_ERROR(w->Wait());
          return dev_->Copy(d, recv.data(), n * es, CopyKind::kDeviceToDevice, nullptr);
        });
        EXPECT_EQ(rs, in) << "ReduceScatter " << DTypeName(t) << " " << ReduceOpName(op);
      }
      auto ag = RoundTrip(in, in.size(), [&](void* d) -> Status {
        ZERO_ASSIGN_OR_RETURN(auto w, comm_->AllGather(d, d, n, t));  // in place
        return w->Wait();
      });
      EXPECT_EQ(ag, in) << "AllGather " << DTypeName(t);
      auto ag2 = RoundTrip(in, in.size(), [&](void* d) -> Status {  // out of place
        ZERO_ASSIGN_OR_RETURN(auto recv, dev_->Allocate(n * es));
        ZERO_RETURN_IF_ERROR(dev_->Fill(recv.data(), t, n, -77.0f, dev_->default_stream()));
        ZERO_ASSIGN_OR_RETURN(auto w, comm_->AllGather(d, recv.data(), n, t, dev_->default_stream()));
        ZERO_RETURN_IF_ERROR(w->Wait());
        return dev_->Copy(d, recv.data(), n * es, CopyKind::kDeviceToDevice, nullptr);
      });
      EXPECT_EQ(ag2, in) << "AllGather out of place " << DTypeName(t);
      auto bc = RoundTrip(in, in.size(), [&](void* d) -> Status {
        ZERO_ASSIGN_OR_RETURN(auto w, comm_->Broadcast(d, n, t, 0));
        return w->Wait();
      });
      EXPECT_EQ(bc, in) << "Broadcast " << DTypeName(t);
    }
  }
  EXPECT_TRUE(comm_->Barrier().ok());
  double v[3] = {1.5, -2.0, 1e300};
  EXPECT_TRUE(comm_->AllReduceHost(v, 3, ReduceOp::kSum).ok());
  EXPECT_EQ(v[0], 1.5);
  EXPECT_EQ(v[2], 1e300);
  char msg[8] = "abcdefg";
  EXPECT_TRUE(comm_->BroadcastHost(msg, sizeof(msg), 0).ok());
  EXPECT_STREQ(msg, "abcdefg");
  auto bad = comm_->Broadcast(nullptr, 1, DType::kF32, 1);
  EXPECT_FALSE(bad.ok());
}

// `after` orders the collective behind work on a compute stream; StreamWait orders a consumer
// stream behind the collective; no host synchronization in between.
TEST_F(NcclSingleGpuTest, StreamOrdering) {
  const size_t n = 1 << 22;
  auto compute = dev_->CreateStream();
  auto consumer = dev_->CreateStream();
  ASSERT_TRUE(compute.ok() && consumer.ok());
  auto buf = dev_->Allocate(n * sizeof(float));
  ASSERT_TRUE(buf.ok());
  for (int iter = 0; iter < 5; ++iter) {
    float value = 1.0f + iter;
    ASSERT_TRUE(dev_->Fill(buf->data(), DType::kF32, n, value, compute->get()).ok());
    auto w = comm_->AllReduce(buf->data(), n, DType::kF32, ReduceOp::kSum, compute->get());
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    ASSERT_TRUE((*w)->StreamWait(consumer->get()).ok());
    ASSERT_TRUE(dev_->Scale(buf->data(), DType::kF32, n, 2.0f, consumer->get()).ok());
    std::vector<float> host(n);
    ASSERT_TRUE(dev_->Copy(host.data(), buf->data(), n * sizeof(float), CopyKind::kDeviceToHost,
                           consumer->get()).ok());
    ASSERT_TRUE(dev_->SynchronizeStream(consumer->get()).ok());
    EXPECT_EQ(host[0], 2 * value);
    EXPECT_EQ(host[n - 1], 2 * value);
    EXPECT_TRUE((*w)->Wait().ok());
    EXPECT_TRUE((*w)->IsCompleted());
  }
}

// One process per GPU (up to 4), as a launcher would start them.
TEST(NcclMultiProcessTest, MixOfCollectivesOnePerGpu) {
  const int gpus = GpuCount();
  ZERO_SKIP_WITHOUT_CUDA_DEVICES(2);
  const int n = std::min(gpus, 4);
  auto results = testing::RunWorld(n, testing::AllRanks(n), {"--backend=nccl", "--scenario=mix"},
                                   60000, std::chrono::seconds(240));
  for (const auto& r : results) {
    EXPECT_EQ(r.exit_code, 0) << "rank " << r.rank << ":\n" << r.output;
  }
}

TEST(NcclMultiProcessTest, KilledRankTimesOut) {
  const int gpus = GpuCount();
  ZERO_SKIP_WITHOUT_CUDA_DEVICES(2);
  const int n = std::min(gpus, 3);
  auto results = testing::RunWorld(n, testing::AllRanks(n),
                                   {"--backend=nccl", "--scenario=die=" + std::to_string(n - 1)},
                                   5000, std::chrono::seconds(120));
  for (const auto& r : results) {
    if (r.rank == n - 1) {
      EXPECT_EQ(r.exit_code, 128 + SIGKILL) << r.output;
    } else {
      EXPECT_EQ(r.exit_code, 0) << "rank " << r.rank << ":\n" << r.output;
    }
  }
}

}  // namespace
}  // namespace zero
