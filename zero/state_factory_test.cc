// The state factory on the CPU backend: each placement builds the storage it names (told apart by
// where its bytes live and by the capabilities the engine reads), the host store's shard-size
// message, the overlapped step's scheduler only with overlap_step, NVMe states tiered by
// host_memory_budget, and the gradient partition's choice.
#include "zero/state_factory.h"

#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "runtime/cpu_device.h"
#include "testing/scratch_dir.h"
#include "testing/status_matchers.h"

namespace zero {
namespace {

constexpr int64_t kNumel = 1000;

HostSlabOptions Pageable() {
  HostSlabOptions slab;
  slab.pin_memory = false;
  return slab;
}

std::vector<ParamShardInfo> TwoShards() { return {{"w", 1200, 0, 600, 0}, {"b", 400, 640, 200, 1}}; }
const std::vector<std::string> kModules = {"m0", "m1"};

TEST(StateFactoryTest, ParamStoreOnTheDeviceIsNone) {
  CpuDevice device;
  ParamStorePlan plan;
  ASSERT_OK_AND_ASSIGN(auto store, CreateParamStore(&device, device.default_stream(), DType::kBF16, kNumel, TwoShards(),
                                                    kModules, plan));
  EXPECT_EQ(store, nullptr);
}

TEST(StateFactoryTest, ParamStoreInHostMemory) {
  CpuDevice device;
  ParamStorePlan plan;
  plan.placement = ParamPlacement::kHost;
  plan.slab = Pageable();
  plan.buffer_numel = 600;
  ASSERT_OK_AND_ASSIGN(auto store, CreateParamStore(&device, device.default_stream(), DType::kBF16, kNumel, TwoShards(),
                                                    kModules, plan));
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(store->numel(), kNumel);
  EXPECT_NE(store->host_address(0), nullptr);  // every shard stays in host memory
  EXPECT_GE(store->host_bytes(), static_cast<size_t>(kNumel) * 2);
}

TEST(StateFactoryTest, HostParamStoreRefusesAShardLargerThanOneUpload) {
  CpuDevice device;
  ParamStorePlan plan;
  plan.placement = ParamPlacement::kHost;
  plan.slab = Pageable();
  plan.world_size = 2;
  plan.buffer_numel = 599;
  auto store = CreateParamStore(&device, device.default_stream(), DType::kBF16, kNumel, TwoShards(), kModules, plan);
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(store.status().message(),
            "parameter 'w' has a shard of 600 elements (1200 over 2 ranks), more than "
            "zero_optimization.offload_param.buffer_size (599); raise zero_optimization.offload_param.buffer_size "
            "to at least 600");
}

TEST(StateFactoryTest, ParamStoreOnNvmeIsModuleByModule) {
  ASSERT_OK_AND_ASSIGN(ScratchDir scratch, ScratchDir::CreateWithDirectIo("state_factory_params"));
  CpuDevice device;
  ParamStorePlan plan;
  plan.placement = ParamPlacement::kNvme;
  plan.slab = Pageable();
  plan.buffer_numel = 1000;
  plan.buffer_count = 2;
  plan.nvme_dir = scratch.File("rank0");
  plan.aio.block_size = 4096;
  ASSERT_OK_AND_ASSIGN(auto store, CreateParamStore(&device, device.default_stream(), DType::kBF16, kNumel, TwoShards(),
                                                    kModules, plan));
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(store->host_address(0), nullptr);
  EXPECT_NE(store->module_store(), nullptr);
  EXPECT_GT(store->nvme_bytes(), 0u);
}

TEST(StateFactoryTest, OptimizerStatesOnTheDevice) {
  CpuDevice device;
  OptimizerStatesPlan plan;
  ASSERT_OK_AND_ASSIGN(OptimizerStorage built, CreateOptimizerStates(&device, device.default_stream(), kNumel, plan));
  ASSERT_NE(built.states, nullptr);
  EXPECT_EQ(built.deferred_step, nullptr);
  EXPECT_EQ(built.states->bytes().device, static_cast<size_t>(kNumel) * 12);
  EXPECT_EQ(built.states->bytes().host, 0u);
  EXPECT_FALSE(built.states->updates_from_host());
}

TEST(StateFactoryTest, OptimizerStatesOnTheHostWithTheCpuAdam) {
  CpuDevice device;
  OptimizerStatesPlan plan;
  plan.placement = OptimizerPlacement::kHost;
  plan.slab = Pageable();
  plan.cpu_threads = 2;
  ASSERT_OK_AND_ASSIGN(OptimizerStorage built, CreateOptimizerStates(&device, device.default_stream(), kNumel, plan));
  EXPECT_TRUE(built.states->updates_from_host());
  EXPECT_NE(built.states->host_thread_pool(), nullptr);
  EXPECT_GE(built.states->bytes().host, static_cast<size_t>(kNumel) * 12);
  EXPECT_EQ(built.deferred_step, nullptr);
}

TEST(StateFactoryTest, ChunkedStatesGetTheOverlappedStepOnlyWithOverlapStep) {
  CpuDevice device;
  OptimizerStatesPlan plan;
  plan.placement = OptimizerPlacement::kHostChunked;
  plan.slab = Pageable();
  plan.chunk_numel = 256;
  plan.chunk_buffers = 2;
  plan.model_dtype = DType::kBF16;
  plan.param_ranges = {{0, 600}, {640, 840}};
  for (bool overlap : {false, true}) {
    plan.overlap_step = overlap;
    ASSERT_OK_AND_ASSIGN(OptimizerStorage built, CreateOptimizerStates(&device, device.default_stream(), kNumel, plan));
    EXPECT_FALSE(built.states->updates_from_host());  // AdamW runs on the device
    EXPECT_GE(built.states->bytes().host, static_cast<size_t>(kNumel) * 12);
    EXPECT_EQ(built.deferred_step != nullptr, overlap);
  }
}

TEST(StateFactoryTest, NvmeStatesTieredByHostMemoryBudget) {
  ASSERT_OK_AND_ASSIGN(ScratchDir scratch, ScratchDir::CreateWithDirectIo("state_factory_states"));
  CpuDevice device;
  OptimizerStatesPlan plan;
  plan.placement = OptimizerPlacement::kNvme;
  plan.slab = Pageable();
  plan.cpu_threads = 2;
  plan.nvme_dir = scratch.File("rank0");
  plan.nvme_group_numel = 300;
  plan.nvme_buffer_count = 2;
  plan.aio.block_size = 4096;
  {
    ASSERT_OK_AND_ASSIGN(OptimizerStorage all_on_nvme,
                         CreateOptimizerStates(&device, device.default_stream(), kNumel, plan));
    EXPECT_GE(all_on_nvme.states->bytes().nvme, static_cast<size_t>(kNumel) * 12);
  }
  plan.host_memory_budget = 400 * 12 + 11;  // 400 elements on the host
  ASSERT_OK_AND_ASSIGN(OptimizerStorage tiered, CreateOptimizerStates(&device, device.default_stream(), kNumel, plan));
  const OptimizerStateBytes bytes = tiered.states->bytes();
  EXPECT_EQ(tiered.states->numel(), kNumel);
  EXPECT_GE(bytes.host, size_t{400} * 12);
  EXPECT_GE(bytes.nvme, size_t{600} * 12);
  EXPECT_LT(bytes.nvme, static_cast<size_t>(kNumel) * 12);
}

// offload_optimizer.ratio: the first numel - floor(numel * ratio) elements on the device, the rest
// offloaded; the host placement keeps the host gradient partition (the offloaded part decides),
// and NVMe becomes three tiers (device, host_memory_budget's host share, NVMe).
TEST(StateFactoryTest, OffloadRatioKeepsTheFirstElementsOnTheDevice) {
  EXPECT_EQ(OnDeviceElements(1000, 1.0), 0);
  EXPECT_EQ(OnDeviceElements(1000, 0.5), 500);
  EXPECT_EQ(OnDeviceElements(1000, 0.3333), 667);  // floor(333.3) offloaded
  EXPECT_EQ(OnDeviceElements(1000, 1e-9), 1000);
  EXPECT_EQ(OnDeviceElements(0, 0.5), 0);
  CpuDevice device;
  OptimizerStatesPlan plan;
  plan.placement = OptimizerPlacement::kHost;
  plan.slab = Pageable();
  plan.cpu_threads = 2;
  plan.offload_ratio = 0.25;
  ASSERT_OK_AND_ASSIGN(OptimizerStorage host, CreateOptimizerStates(&device, device.default_stream(), kNumel, plan));
  EXPECT_EQ(host.states->numel(), kNumel);
  EXPECT_EQ(host.states->bytes().device, size_t{750} * 12);
  EXPECT_GE(host.states->bytes().host, size_t{250} * 12);
  EXPECT_TRUE(host.states->updates_from_host());
  EXPECT_EQ(ChooseGradPartition(GradPartitionPlan(), host.states.get()), GradPartitionPlacement::kHost);

  ASSERT_OK_AND_ASSIGN(ScratchDir scratch, ScratchDir::CreateWithDirectIo("state_factory_ratio"));
  plan.placement = OptimizerPlacement::kNvme;
  plan.nvme_dir = scratch.File("rank0");
  plan.nvme_group_numel = 300;
  plan.nvme_buffer_count = 2;
  plan.aio.block_size = 4096;
  plan.offload_ratio = 0.6;                 // 400 on the device, 600 offloaded
  plan.host_memory_budget = 200 * 12 + 11;  // of which 200 on the host
  ASSERT_OK_AND_ASSIGN(OptimizerStorage nvme, CreateOptimizerStates(&device, device.default_stream(), kNumel, plan));
  const OptimizerStateBytes bytes = nvme.states->bytes();
  EXPECT_EQ(nvme.states->numel(), kNumel);
  EXPECT_EQ(bytes.device, size_t{400} * 12);
  EXPECT_GE(bytes.host, size_t{200} * 12);
  EXPECT_GE(bytes.nvme, size_t{400} * 12);
  EXPECT_LT(bytes.nvme, static_cast<size_t>(kNumel) * 12);  // block-rounded, less than all of them
}

TEST(StateFactoryTest, GradPartitionChoice) {
  CpuDevice device;
  Stream* stream = device.default_stream();
  ASSERT_OK_AND_ASSIGN(auto device_states, CreateDeviceOptimizerStates(&device, kNumel, stream));
  OptimizerStatesPlan host_plan;
  host_plan.placement = OptimizerPlacement::kHost;
  host_plan.slab = Pageable();
  host_plan.cpu_threads = 2;
  ASSERT_OK_AND_ASSIGN(OptimizerStorage host, CreateOptimizerStates(&device, stream, kNumel, host_plan));
  OptimizerStates* host_states = host.states.get();
  std::vector<float> accumulators(kNumel, 0.0f);
  const std::vector<GradPiece> pieces = {{0, 600}, {640, 200}};

  GradPartitionPlan view;
  view.view_accumulators = true;
  view.accumulators = accumulators.data();
  EXPECT_EQ(ChooseGradPartition(view, device_states.get()), GradPartitionPlacement::kAccumulatorView);
  ASSERT_OK_AND_ASSIGN(auto v, CreateGradPartition(&device, stream, kNumel, pieces, device_states.get(), view));
  EXPECT_EQ(v->bytes().device, 0u);  // the caller's buffer
  EXPECT_EQ(v->device_piece(1), accumulators.data() + 640);

  GradPartitionPlan none;
  none.update_in_backward = true;
  EXPECT_EQ(ChooseGradPartition(none, device_states.get()), GradPartitionPlacement::kNone);
  ASSERT_OK_AND_ASSIGN(auto n, CreateGradPartition(&device, stream, kNumel, pieces, device_states.get(), none));
  EXPECT_EQ(n, nullptr);

  GradPartitionPlan plain;
  plain.slab = Pageable();
  EXPECT_EQ(ChooseGradPartition(plain, device_states.get()), GradPartitionPlacement::kDevice);
  ASSERT_OK_AND_ASSIGN(auto d, CreateGradPartition(&device, stream, kNumel, pieces, device_states.get(), plain));
  EXPECT_EQ(d->bytes().device, static_cast<size_t>(kNumel) * 4);
  EXPECT_EQ(d->bytes().host, 0u);

  EXPECT_EQ(ChooseGradPartition(plain, host_states), GradPartitionPlacement::kHost);
  ASSERT_OK_AND_ASSIGN(auto h, CreateGradPartition(&device, stream, kNumel, pieces, host_states, plain));
  EXPECT_EQ(h->bytes().device, 0u);
  EXPECT_GE(h->bytes().host, static_cast<size_t>(kNumel) * 4);

  GradPartitionPlan summed = plain;
  summed.accumulate_on_device = true;
  EXPECT_EQ(ChooseGradPartition(summed, host_states), GradPartitionPlacement::kGpuAccumulated);
  ASSERT_OK_AND_ASSIGN(auto g, CreateGradPartition(&device, stream, kNumel, pieces, host_states, summed));
  EXPECT_EQ(g->bytes().device, static_cast<size_t>(kNumel) * 4);
  EXPECT_GE(g->bytes().host, static_cast<size_t>(kNumel) * 4);
  // The device-summed choice applies to host partitions only.
  EXPECT_EQ(ChooseGradPartition(summed, device_states.get()), GradPartitionPlacement::kDevice);
}

}  // namespace
}  // namespace zero
