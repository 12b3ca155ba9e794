// linear_regression: a trainer outside the zero source tree, built against the installed library
// only (<zero/zero.h>, zero.pc or find_package(zero)). It fits y = w*x + b (two scalar
// parameters) to points on y = 2x + 0.5, each rank holding its own 8 points, with ZeRO stage 3
// across 2 ranks on the CPU, and fails (exit 1) unless the loss falls below 1% of its start.
//
//   linear_regression [--steps N]    2 ranks as threads of this process (RunThreadRanks)
//   RANK=r WORLD_SIZE=2 MASTER_PORT=p linear_regression
//                                    one rank per process (RendezvousFromEnv, torchrun's variables)
#include <zero/zero.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

namespace {

constexpr int kLocalBatch = 8;

const char* kConfig = R"({
  "train_micro_batch_size_per_gpu": 8,
  "gradient_accumulation_steps": 1,
  "optimizer": {"type": "Adam", "params": {"lr": 0.05}},
  "zero_optimization": {"stage": 3}
})";

// Reads one fp32 scalar parameter from device memory (stage 3: it must be gathered).
zero::Result<float> ReadScalar(zero::Engine* engine, zero::Device* device, int index) {
  ZERO_ASSIGN_OR_RETURN(const void* p, engine->param(index));
  float value = 0.0f;
  ZERO_RETURN_IF_ERROR(device->Copy(&value, p, sizeof(float), zero::CopyKind::kDeviceToHost, device->default_stream()));
  ZERO_RETURN_IF_ERROR(device->SynchronizeStream(device->default_stream()));
  return value;
}

zero::Status WriteGrad(zero::Engine* engine, zero::Device* device, int index, float g) {
  ZERO_ASSIGN_OR_RETURN(void* buf, engine->grad_buffer(index));
  ZERO_RETURN_IF_ERROR(device->Copy(buf, &g, sizeof(float), zero::CopyKind::kHostToDevice, device->default_stream()));
  ZERO_RETURN_IF_ERROR(device->SynchronizeStream(device->default_stream()));
  return engine->GradReady(index);
}

// One rank's whole training run.
zero::Status Train(zero::Communicator* comm, zero::Device* device, int steps) {
  const int rank = comm->rank();
  ZERO_ASSIGN_OR_RETURN(zero::Config config, zero::ParseConfig(kConfig, {.world_size = comm->world_size(),
                                                                         .source = "linear_regression config"}));
  ZERO_ASSIGN_OR_RETURN(std::unique_ptr<zero::Engine> engine, zero::Engine::Create(config, device, comm));
  ZERO_ASSIGN_OR_RETURN(const int w, engine->RegisterParameter({"linear.weight", {}, "linear"}));
  ZERO_ASSIGN_OR_RETURN(const int b, engine->RegisterParameter({"linear.bias", {}, "linear"}));
  ZERO_RETURN_IF_ERROR(engine->Initialize([](int, float* values) { values[0] = 0.0f; }));

  std::vector<float> xs(kLocalBatch), ys(kLocalBatch);
  for (int k = 0; k < kLocalBatch; ++k) {
    xs[k] = static_cast<float>(k + kLocalBatch * rank) / (2 * kLocalBatch) - 0.5f;
    ys[k] = 2.0f * xs[k] + 0.5f;
  }

  double first_loss = 0.0, loss = 0.0;
  for (int step = 0; step < steps; ++step) {
    // Forward (and the hand-written backward) while the module is gathered.
    float gw = 0.0f, gb = 0.0f;
    double local_loss = 0.0;
    {
      ZERO_ASSIGN_OR_RETURN(zero::ModuleHandle h, engine->GatherModule("linear"));
      ZERO_ASSIGN_OR_RETURN(const float wv, ReadScalar(engine.get(), device, w));
      ZERO_ASSIGN_OR_RETURN(const float bv, ReadScalar(engine.get(), device, b));
      for (int k = 0; k < kLocalBatch; ++k) {
        const float err = wv * xs[k] + bv - ys[k];
        local_loss += static_cast<double>(err) * err / kLocalBatch;
        gw += 2.0f * err * xs[k] / kLocalBatch;
        gb += 2.0f * err / kLocalBatch;
      }
      ZERO_RETURN_IF_ERROR(WriteGrad(engine.get(), device, b, gb));
      ZERO_RETURN_IF_ERROR(WriteGrad(engine.get(), device, w, gw));
    }
    ZERO_RETURN_IF_ERROR(engine->Backward());  // the engine averages the gradients over ranks
    ZERO_RETURN_IF_ERROR(engine->Step());
    loss = local_loss;
    ZERO_RETURN_IF_ERROR(comm->AllReduceHost(&loss, 1, zero::ReduceOp::kAvg));
    if (step == 0) first_loss = loss;
    if (rank == 0 && (step % 20 == 0 || step == steps - 1)) {
      std::printf("step %3d  loss %.6f  grad_norm %.4f\n", step, loss, engine->global_grad_norm());
    }
  }
  if (!(loss < 0.01 * first_loss)) {
    // The loss is the mean over ranks, the same on every rank (RunThreadRanks names the rank).
    return zero::InternalError("loss did not fall: " + std::to_string(first_loss) + " at step 0, " +
                               std::to_string(loss) + " at step " + std::to_string(steps - 1) +
                               " (expected below 1% of the start)");
  }
  return zero::OkStatus();
}

// One rank per process: the launcher's variables say who we are and where rank 0 listens.
zero::Status RunProcessRank(int steps) {
  ZERO_ASSIGN_OR_RETURN(zero::RendezvousOptions opts, zero::RendezvousFromEnv());
  ZERO_ASSIGN_OR_RETURN(std::unique_ptr<zero::Device> device, zero::CreateDevice("cpu"));
  ZERO_ASSIGN_OR_RETURN(std::unique_ptr<zero::Communicator> comm, zero::CreateCommunicator("gloo", device.get(), opts));
  return Train(comm.get(), device.get(), steps);
}

}  // namespace

int main(int argc, char** argv) {
  int steps = 200;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--steps") == 0 && i + 1 < argc) {
      steps = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: %s [--steps N]\n", argv[0]);
      return 2;
    }
  }
  std::printf("zero %s\n", ZERO_VERSION);
  const zero::Status st = std::getenv("WORLD_SIZE") != nullptr
                              ? RunProcessRank(steps)
                              : zero::RunThreadRanks(2, [&](int, zero::Communicator* comm, zero::Device* device) {
                                  return Train(comm, device, steps);
                                });
  if (!st.ok()) {
    std::fprintf(stderr, "linear_regression: %s\n", st.ToString().c_str());
    return 1;
  }
  std::printf("ok\n");
  return 0;
}
