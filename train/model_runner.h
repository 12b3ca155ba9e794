// The model as the Trainer (train/trainer.h) drives it: one micro step's forward on this rank's
// rows, its backward into the engine's gradient buffers, and its loss. Each job implements it for
// its model on each backend (zero_train: the byte model's CPU and CUDA runners; zero_llm: the
// transformer's), drawing a micro step's rows from its own data; the Trainer owns the engine, the
// order of the calls and what is done with the loss. A runner is used by one thread, on the
// engine's compute stream (the device's default stream): it may queue work there and return
// before it is done.
#pragma once

#include <cstdint>

#include "models/model_api.h"
#include "runtime/status.h"

namespace zero::train {

// Which rows a micro step trains on: micro step `micro` (0 .. GAS-1) of optimizer step `step`
// (0-based, counted from the start of training, so a resumed run continues the sequence).
struct MicroStep {
  int64_t step = 0;
  int64_t micro = 0;
  int64_t index = 0;  // step * GAS + micro: the micro step's place in the whole run
  int rows = 0;       // this rank's rows (train_micro_batch_size_per_gpu)
  int rank = 0;
  int world_size = 1;
};

class ModelRunner {
 public:
  virtual ~ModelRunner() = default;
  // Forward of this rank's rows of `at` against `params`. The loss may be left for Backward to
  // finish: read it with Loss() after Backward.
  virtual Status Forward(examples::ParamProvider& params, const MicroStep& at) = 0;
  // Backward of the last Forward with the loss multiplied by `loss_scale`, into `grads`.
  virtual Status Backward(examples::ParamProvider& params, float loss_scale, examples::GradSink& grads) = 0;
  // The last micro step's mean loss over its counted targets (may wait for the device).
  virtual Result<double> Loss() = 0;
  // How many targets the last Forward counted: its loss's weight where the Trainer averages per
  // target (LossAverage::kPerTarget).
  virtual int64_t CountedTargets() = 0;
};

}  // namespace zero::train
