// The Trainer: one rank of a training job from rendezvous to the final barrier, the same for
// zero_llm (the transformer) and zero_train (the byte model). It owns the rank's device,
// communicator and Engine, the optimizer steps (each micro step's forward and backward through the
// job's ModelRunner, Engine::Backward, then Engine::Step), the loss averaged over micro steps and
// ranks, checkpoints (--save, --resume), the periodic log line with the ranks' largest memory, the
// JSON line per step, the progress bar, the loop's timing and trace, and the loss plot. What
// differs between the jobs is the job's, through a TrainJob: config and data, the model and its
// initial weights, the header, the texts of the lines, the checks of a step, and what follows
// training (evaluation, export, sampling). Not thread-safe: one Trainer per rank, on its main
// thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm/rendezvous.h"
#include "engine/config/config.h"
#include "engine/engine.h"
#include "models/model_api.h"
#include "runtime/device.h"
#include "runtime/status.h"
#include "train/model_runner.h"
#include "train/trainer_launch.h"
#include "train/trainer_timing.h"
#include "train/zero_train_report.h"

namespace zero::train {

// How a step's loss is averaged over its micro steps and the ranks.
enum class LossAverage {
  // Each micro step's loss weighted by its counted targets, over all targets of the step
  // (zero_llm: micro steps may count different targets).
  kPerTarget,
  // The mean of each rank's micro-step losses, then the mean over ranks (zero_train).
  kPerMicroStep,
};

struct TrainerOptions {
  std::string device = "cpu";  // "cpu": the CPU device and gloo; "cuda": one GPU per local rank and NCCL
  double timeout_s = 0;        // the communicator's timeout; 0: ZERO_COMM_TIMEOUT_MS, else default_timeout
  std::chrono::milliseconds default_timeout = std::chrono::seconds(120);
  int64_t steps = 0;           // training ends after optimizer step `steps` (a resumed run continues to it)
  int64_t print_every = 0;     // the log line every this many steps and after the last; 0: steps_per_print
  int64_t tokens_per_row = 1;  // predicted tokens per row: a step's tokens are train_batch_size times this
  LossAverage loss_average = LossAverage::kPerMicroStep;
  // With managed_gradient_accumulation false (the loop, not the engine, divides by the micro steps):
  // true scales the loss by loss_scale / GAS (zero_llm); false by Engine::gradient_scale(), which is
  // then loss_scale, so the micro steps' gradients add up (zero_train's behaviour, kept as it was).
  bool unmanaged_divides_by_gas = true;

  // Checkpoints: --save DIR after every save_every-th step (0: none) and after the last one (also
  // when the run resumed at `steps`), with TrainJob::CheckpointClientState; --resume DIR first.
  std::string save_dir;
  int64_t save_every = 0;
  std::string resume_dir;
  // A checkpoint past `steps` is an error (it trained further than this run is asked to); one at
  // `steps` trains nothing, which rank 0 says.
  bool announce_checkpoints = false;  // rank 0 prints "  checkpoint saved: DIR/global_step<N>"

  // Outputs, on rank 0 (the trace on every rank).
  std::string log_json;         // a JSON line per step (TrainJob::StepJson); "": none
  std::string plot;             // the loss curve's SVG (WriteLossPlot); "": none
  std::string trace;            // Chrome trace of steps 2-4 (trainer_timing.h); "": none
  bool loop_breakdown = false;  // the loop's timers when the config says wall_clock_breakdown
  bool progress_bar = false;    // the terminal progress bar (drawn only when stdout is a TTY)

  // Rank 0, once the ranks are connected and before the engine is created: the job's check of the
  // outputs it writes after training (zero_llm's --export-hf), so that a bad path fails at the start
  // rather than after the run. An error ends every rank there. Empty: none.
  std::function<Status()> check_lead_outputs;
};

// --save DIR can take a checkpoint: a directory, or missing and creatable, in which a file can be
// created (engine/checkpoint/io.h's CheckWritableDirectory; it creates DIR); an existing file or
// other non-directory is refused. Errors start "--save DIR: ". For the launching process; the
// Trainer checks it again on every rank (each writes its partition there) before the engine starts.
Status CheckSaveDirectory(const std::string& dir);

// A graceful stop (docs/reliability.md): while a Trainer trains, the first SIGINT or SIGTERM this
// process gets asks it to stop. The ranks agree on it at the next step boundary (a one-value
// all-reduce after each step, so a signal that reached one rank stops all of them at the same step);
// each then saves the checkpoint of that step (with --save, atomically as every save) and Run
// returns UNAVAILABLE "stopped by SIGTERM after step N of M ...", so the process exits non-zero
// without the job's AfterTraining. A signal at least kStopSignalDebounceSeconds after the first
// ends the process at once (the signal's default action); one sooner counts as the same request
// (Ctrl-C reaches the ranks from the terminal and again from the launcher, which forwards it).
inline constexpr double kStopSignalDebounceSeconds = 1.0;

// The TrainerOptions both jobs' flags give alike: --device, --timeout, --steps, --save,
// --save-every, --resume, --log-json and --plot (the fields of those names in `flags`); the rest
// keeps its defaults.
template <typename Flags>
TrainerOptions TrainerOptionsFromFlags(const Flags& flags) {
  TrainerOptions t;
  t.device = flags.device;
  t.timeout_s = flags.timeout_s;
  t.steps = flags.steps;
  t.save_dir = flags.save_dir;
  t.save_every = flags.save_every;
  t.resume_dir = flags.resume_dir;
  t.log_json = flags.log_json;
  t.plot = flags.plot;
  return t;
}

class Trainer;

// One thing every rank of a run must have alike (Trainer::CheckRanksAgree): a flag that shapes the
// run, the data's or the initial weights' identity. `name` says what it is in messages ("--seq",
// "the data (--data)"); `value` is compared (a number, "given", a size and hash, or text such as
// the resolved config, of which a message shows the first differing line); `where` is shown beside
// the value but not compared (the path, which may differ between machines that hold the same file).
struct RankAgreementItem {
  std::string name, value, where;
};

// A content hash for RankAgreementItem::value: XXH64 of `bytes` as 16 hex digits.
std::string HexHash(const void* data, size_t bytes);

// What a job gives the Trainer. The Trainer calls the set-up hooks once, in the order listed, on
// every rank; hooks marked collective must run on every rank in the same order.
class TrainJob {
 public:
  virtual ~TrainJob() = default;

  // With the rank and world size known, before any device or connection: the config the run trains
  // with; loads and checks the job's data. An error ends the rank.
  virtual Result<Config> Prepare(int rank, int world_size) = 0;
  // After Prepare: what must be alike on every rank besides the resolved config (which the Trainer
  // adds): the job's flags that shape the run and its data's and initial weights' identity. The
  // Trainer compares them across ranks before the engine is created; any difference ends every
  // rank with a message naming the first one.
  virtual std::vector<RankAgreementItem> RankAgreement() { return {}; }
  // Registers the model's parameters with `engine` and gives them their initial values
  // (collective). Returns their specs in registration order (ParamProvider's indices).
  virtual Result<std::vector<examples::ModelParamSpec>> InitializeParameters(Engine* engine) = 0;
  // The model on the rank's device; the engine's compute stream is the device's default stream.
  virtual Result<std::unique_ptr<ModelRunner>> CreateRunner(Device* device) = 0;
  // Rank 0, once set up: the run's header lines.
  virtual void PrintHeader(const Trainer& trainer) = 0;
  // After the header: true when the run is done without training (an evaluation-only run); the
  // Trainer then goes to the final barrier. Collective.
  virtual Result<bool> RunWithoutTraining(Trainer& trainer) { return false; }

  // Every rank, before 1-based optimizer step `step`.
  virtual void BeforeStep(int rank, int64_t step) {}
  // Every rank, after the step (the record's loss is the same on every rank): an error ends the
  // run there.
  virtual Status CheckStep(const examples::StepRecord& step) = 0;
  // Rank 0: the step's line of --log-json, without the newline.
  virtual std::string StepJson(const examples::StepRecord& step) = 0;
  // Rank 0: the log line over the steps since the last one.
  virtual std::string WindowLine(const examples::WindowSummary& window) = 0;
  // The client state saved with the checkpoint after `step` steps ("": none).
  virtual std::string CheckpointClientState(int64_t step) { return ""; }
  // Every rank, after --resume loaded a checkpoint: `client_state` is what CheckpointClientState
  // saved ("{}" when nothing). An error ends the run before any step (e.g. another tokenizer).
  virtual Status CheckResumedClientState(const std::string& client_state) { return OkStatus(); }

  // After the loop and its last checkpoint: evaluation, export, the closing lines. Collective.
  virtual Status AfterTraining(Trainer& trainer) = 0;
};

class Trainer {
 public:
  // `job` must outlive the Trainer.
  Trainer(TrainerOptions options, TrainJob* job);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // Runs this rank: rendezvous (RendezvousFromEnv), the job's Prepare, device, communicator,
  // engine, the job's parameters and runner, its header, resume, training, the last checkpoint, the
  // job's AfterTraining, then the final barrier. Sets *where once the rank is known. Errors carry
  // what failed (the flag, the step and micro step).
  Status Run(RankContext* where);

  // For the job's hooks: valid from the hook that needs them on (the config from Prepare, the
  // rest from PrintHeader).
  const TrainerOptions& options() const { return options_; }
  const Config& config() const { return config_; }
  int rank() const { return rank_; }
  int world_size() const { return world_; }
  bool lead() const { return rank_ == 0; }
  Device* device() const { return device_.get(); }
  Communicator* comm() const { return comm_.get(); }
  Engine* engine() const { return engine_.get(); }
  ModelRunner* runner() const { return runner_.get(); }
  examples::ParamProvider& params() const { return *params_; }
  const std::vector<examples::ModelParamSpec>& specs() const { return specs_; }
  int64_t print_every() const { return print_every_; }
  int64_t tokens_per_step() const { return tokens_per_step_; }

  // After training (AfterTraining): the first step this run trained (0, or the resumed step), the
  // mean loss of each step it trained, the first of them that was not NaN (NaN: none), and the
  // loop's wall time.
  int64_t start_step() const { return start_step_; }
  const std::vector<double>& losses() const { return plot_losses_; }
  double first_loss() const { return first_loss_; }
  double train_seconds() const { return train_seconds_; }

  // Rank 0: writes --plot (this run's losses, titled `title`) and prints "loss curve: PATH";
  // nothing without --plot.
  Status WriteLossPlot(const std::string& title) const;

 private:
  Status Connect(RendezvousOptions ro);
  // Collective: the job's RankAgreement items and the Trainer's own (the resolved config, the log
  // period) compared with rank 0's; a difference is an error on every rank naming the first item,
  // the first rank that differs, its value and rank 0's.
  Status CheckRanksAgree();
  // Collective: --save on every rank, options_.check_lead_outputs on rank 0; one rank's error ends
  // every rank.
  Status CheckOutputs();
  // Collective, at a step boundary: the stop signal any rank got (0: none).
  Result<int> AgreeToStop();
  Status Train();
  Status RunStep(int64_t step, LoopTiming* timing, examples::WindowSummary* window, examples::ProgressBar* bar);
  Status PrintWindow(examples::WindowSummary* window, examples::ProgressBar* bar);
  Status SaveCheckpoint(int64_t step);

  using Clock = std::chrono::steady_clock;
  TrainerOptions options_;
  TrainJob* job_;
  Clock::time_point t_start_, t_train_;
  int rank_ = 0, world_ = 1;
  Config config_;
  int64_t print_every_ = 1, tokens_per_step_ = 0;
  std::unique_ptr<Device> device_;
  std::unique_ptr<Communicator> comm_;
  std::unique_ptr<Engine> engine_;
  std::vector<examples::ModelParamSpec> specs_;
  std::unique_ptr<ModelRunner> runner_;
  std::unique_ptr<examples::ParamProvider> params_;
  std::unique_ptr<examples::GradSink> grads_;
  FILE* log_json_ = nullptr;  // rank 0 with --log-json; closed by the destructor
  int64_t start_step_ = 0;
  std::vector<double> plot_steps_, plot_losses_;
  double first_loss_ = std::numeric_limits<double>::quiet_NaN();
  double train_seconds_ = 0;
};

}  // namespace zero::train
