// zero_models.h: the umbrella header of the models in the installed library
// (PREFIX/include/zero/zero_models.h). It includes zero.h (the engine) and adds:
//   the seam between a model and the engine (namespace zero::examples): ModelParamSpec, the
//     deterministic initializer, ParamProvider / GradSink, and EngineParams / EngineGrads, which put
//     an Engine behind them (models/model_api.h, models/engine_adapters.h);
//   the Llama / Qwen3 decoder on the CPU (namespace zero::llm): LlmConfig with config.json in and
//     out and the presets, the parameter list, LlmBatch, LlmCpu (models/llama/);
//   Hugging Face directories: HfWeights reading one (element ranges, so a ZeRO stage 3 rank reads
//     only its partition), ExportHf writing one, safetensors files (hf/model_dir.h, hf/safetensors.h).
// A separate header from zero.h so that a trainer of its own model on the engine alone keeps the
// engine's smaller include graph; the library is one (libzero), whichever header is included.
// tools/install.sh installs the headers listed here and those they include, as for zero.h. The CUDA
// model (models/llama/cuda_model.h) is not in the package (docs/library.md says why). Needs C++20
// and no third-party header.
#pragma once

#include <zero/zero.h>

#include <zero/hf/model_dir.h>
#include <zero/hf/safetensors.h>
#include <zero/models/engine_adapters.h>
#include <zero/models/llama/batch.h>
#include <zero/models/llama/config.h>
#include <zero/models/llama/cpu_model.h>
#include <zero/models/llama/params.h>
#include <zero/models/model_api.h>
