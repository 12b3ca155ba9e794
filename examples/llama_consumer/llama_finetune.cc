// llama_finetune: fine-tunes a Hugging Face Llama / Qwen3 directory with ZeRO stage 3, outside the
// zero source tree, through the installed package only (<zero/zero_models.h>, zero.pc or
// find_package(zero)). The model is the library's CPU transformer (zero::llm::LlmCpu) behind the
// model seam (zero::examples::EngineParams / EngineGrads); 2 ranks run as threads of this process.
//
//   llama_finetune --init PRESET DIR        writes DIR: a Hugging Face directory (config.json,
//                                           model.safetensors) of a preset's shape ("tiny", ...)
//                                           with the library's deterministic initial values
//   llama_finetune IN_DIR OUT_DIR [--steps N]
//                                           loads IN_DIR (each rank reads only its partition),
//                                           trains N steps (default 30) on a toy corpus, exports the
//                                           trained model to OUT_DIR and reads it back
//
// Exit 1 unless the loss falls below half its start, every tensor moved, and OUT_DIR holds
// exactly the trained weights (bit for bit: it is written in fp32) and IN_DIR's config.
#include <zero/zero_models.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <set>
#include <string>
#include <vector>

namespace {

using zero::Status;
using zero::examples::ModelParamSpec;
using zero::llm::HfWeights;
using zero::llm::LlmConfig;

constexpr int kRanks = 2;
constexpr int kRows = 4;  // per rank and step: train_micro_batch_size_per_gpu
constexpr int kSeq = 32;

const char* kConfig = R"({
  "train_micro_batch_size_per_gpu": 4,
  "gradient_accumulation_steps": 1,
  "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.0}},
  "zero_optimization": {"stage": 3}
})";

// The toy corpus: a cycle of 24 token ids; each row starts somewhere else in it.
zero::llm::LlmBatch MakeBatch(int64_t vocab, int step, int rank) {
  constexpr int kCycle = 24;
  zero::llm::LlmBatch b;
  b.batch = kRows;
  b.seq = kSeq;
  for (int r = 0; r < kRows; ++r) {
    const int start = 5 * step + 7 * (rank * kRows + r);
    for (int j = 0; j < kSeq; ++j) {
      b.inputs.push_back(static_cast<int32_t>((37 * ((start + j) % kCycle) + 5) % vocab));
      b.targets.push_back(static_cast<int32_t>((37 * ((start + j + 1) % kCycle) + 5) % vocab));
    }
  }
  return b;
}

// The tensors a directory may hold beyond the parameter list: a tied model's lm_head.
std::set<std::string> Ignorable(const LlmConfig& c) {
  return c.tie_word_embeddings ? std::set<std::string>{"lm_head.weight"} : std::set<std::string>{};
}

Status WriteInitial(const std::string& preset, const std::string& dir) {
  ZERO_ASSIGN_OR_RETURN(LlmConfig config, zero::llm::Preset(preset));
  config.torch_dtype = "float32";
  const std::vector<ModelParamSpec> specs = zero::llm::LlmParamSpecs(config);
  ZERO_RETURN_IF_ERROR(
      zero::llm::ExportHf(dir, zero::llm::ToHfConfigJson(config), specs, zero::DType::kF32, [&](int i, float* out) {
        zero::examples::InitParamSlice(specs[i], /*seed=*/1, 0, specs[i].numel(), out);
        return zero::OkStatus();
      }));
  std::printf("wrote %s: %s\n", dir.c_str(), config.ToString().c_str());
  return zero::OkStatus();
}

// Rank 0, after the export: OUT_DIR must hold the trained values and the input's config.
Status CheckExport(const std::string& in_dir, const std::string& out_dir, const LlmConfig& config,
                   const std::vector<ModelParamSpec>& specs, const std::vector<std::vector<float>>& trained) {
  ZERO_ASSIGN_OR_RETURN(LlmConfig read_config, zero::llm::LoadHfConfig(out_dir));
  if (!(read_config == config)) return zero::InternalError(out_dir + "/config.json: " + read_config.ToString());
  ZERO_ASSIGN_OR_RETURN(HfWeights in, HfWeights::Open(in_dir));
  ZERO_ASSIGN_OR_RETURN(HfWeights out, HfWeights::Open(out_dir));
  ZERO_RETURN_IF_ERROR(out.Check(specs, Ignorable(config)));
  std::vector<float> got, initial;
  for (size_t i = 0; i < specs.size(); ++i) {
    got.resize(trained[i].size());
    initial.resize(trained[i].size());
    ZERO_RETURN_IF_ERROR(out.ReadSlice(specs[i].name, 0, specs[i].numel(), got.data()));
    ZERO_RETURN_IF_ERROR(in.ReadSlice(specs[i].name, 0, specs[i].numel(), initial.data()));
    if (std::memcmp(got.data(), trained[i].data(), got.size() * sizeof(float)) != 0) {
      return zero::InternalError(out_dir + ": " + specs[i].name + " differs from the trained weights");
    }
    if (initial == got) return zero::InternalError(specs[i].name + " did not change in training");
  }
  std::printf("%s holds the trained weights (%zu tensors, bit for bit)\n", out_dir.c_str(), specs.size());
  return zero::OkStatus();
}

// One rank's whole job.
Status Train(zero::Communicator* comm, zero::Device* device, const std::string& in_dir, const std::string& out_dir,
             int steps) {
  const bool lead = comm->rank() == 0;
  ZERO_ASSIGN_OR_RETURN(LlmConfig model_config, zero::llm::LoadHfConfig(in_dir));
  const std::vector<ModelParamSpec> specs = zero::llm::LlmParamSpecs(model_config);
  ZERO_ASSIGN_OR_RETURN(HfWeights weights, HfWeights::Open(in_dir));
  ZERO_RETURN_IF_ERROR(weights.Check(specs, Ignorable(model_config)));

  ZERO_ASSIGN_OR_RETURN(zero::Config config,
                        zero::ParseConfig(kConfig, {.world_size = comm->world_size(), .source = "llama_finetune"}));
  ZERO_ASSIGN_OR_RETURN(std::unique_ptr<zero::Engine> engine, zero::Engine::Create(config, device, comm));
  for (const ModelParamSpec& s : specs) {
    ZERO_RETURN_IF_ERROR(engine->RegisterParameter({s.name, s.shape, s.module}).status());
  }
  // Stage 3: each rank is asked for (and reads) only its partition of every tensor.
  ZERO_RETURN_IF_ERROR(engine->InitializeFromSlices([&](int i, int64_t begin, int64_t count, float* values) {
    return weights.ReadSlice(specs[i].name, begin, count, values);
  }));

  zero::llm::LlmCpu model(model_config);
  zero::llm::LlmActivations acts;
  zero::examples::EngineParams params(engine.get(), specs);  // Acquire = GatherModule
  zero::examples::EngineGrads grads(engine.get());           // GradReady = Engine::GradReady
  double first_loss = 0.0, loss = 0.0;
  for (int step = 0; step < steps; ++step) {
    const zero::llm::LlmBatch batch = MakeBatch(model_config.vocab_size, step, comm->rank());
    ZERO_ASSIGN_OR_RETURN(loss, model.Forward(params, batch, &acts));
    ZERO_RETURN_IF_ERROR(model.Backward(params, &acts, engine->gradient_scale(), grads));
    ZERO_RETURN_IF_ERROR(engine->Backward());
    ZERO_RETURN_IF_ERROR(engine->Step());
    ZERO_RETURN_IF_ERROR(comm->AllReduceHost(&loss, 1, zero::ReduceOp::kAvg));
    if (step == 0) first_loss = loss;
    if (lead && (step % 10 == 0 || step == steps - 1)) std::printf("step %3d  loss %.4f\n", step, loss);
  }
  if (!(loss < 0.5 * first_loss)) {
    return zero::InternalError("loss did not fall: " + std::to_string(first_loss) + " at step 0, " +
                               std::to_string(loss) + " at the end (expected below half)");
  }

  // Export: every rank takes part in the gathers, rank 0 writes. fp32, so the files hold the
  // trained values exactly (the input's torch_dtype otherwise, e.g. bfloat16, would round them).
  ZERO_ASSIGN_OR_RETURN(std::vector<std::vector<float>> trained, zero::examples::GatherFullParams(engine.get()));
  if (!lead) return zero::OkStatus();
  LlmConfig exported = model_config;
  exported.torch_dtype = "float32";
  ZERO_RETURN_IF_ERROR(zero::llm::ExportHf(out_dir, zero::llm::ToHfConfigJson(exported), specs, zero::DType::kF32,
                                           [&](int i, float* out) {
                                             std::copy(trained[i].begin(), trained[i].end(), out);
                                             return zero::OkStatus();
                                           }));
  return CheckExport(in_dir, out_dir, exported, specs, trained);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  Status st;
  if (args.size() == 3 && args[0] == "--init") {
    st = WriteInitial(args[1], args[2]);
  } else if (args.size() == 2 || (args.size() == 4 && args[2] == "--steps")) {
    const int steps = args.size() == 4 ? std::atoi(args[3].c_str()) : 30;
    std::printf("zero %s: ZeRO stage 3, %d CPU ranks, %d steps\n", ZERO_VERSION, kRanks, steps);
    st = zero::RunThreadRanks(kRanks, [&](int, zero::Communicator* comm, zero::Device* device) {
      return Train(comm, device, args[0], args[1], steps);
    });
  } else {
    std::fprintf(stderr, "usage: %s --init PRESET DIR | %s IN_DIR OUT_DIR [--steps N]\n", argv[0], argv[0]);
    return 2;
  }
  if (!st.ok()) {
    std::fprintf(stderr, "llama_finetune: %s\n", st.ToString().c_str());
    return 1;
  }
  std::printf("ok\n");
  return 0;
}
