#include "train/trainer.h"

#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <mutex>
#include <utility>

#include "engine/checkpoint/io.h"
#include "models/engine_adapters.h"
#include "runtime/device.h"
#include "runtime/hash.h"
#include "train/loss_plot.h"

namespace zero::train {
namespace {

using Clock = std::chrono::steady_clock;
double Since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// This process's peak resident set (getrusage), bytes.
double HostPeakBytes() {
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_maxrss) * 1024.0;
}

// RankAgreementItem lists as bytes: each field as its decimal length, ':', then its bytes.
void AppendField(const std::string& f, std::string* out) {
  *out += std::to_string(f.size());
  *out += ':';
  *out += f;
}
std::string SerializeItems(const std::vector<RankAgreementItem>& items) {
  std::string out;
  for (const RankAgreementItem& it : items) {
    AppendField(it.name, &out);
    AppendField(it.value, &out);
    AppendField(it.where, &out);
  }
  return out;
}
// The inverse of SerializeItems (a malformed tail ends the list).
std::vector<RankAgreementItem> ParseItems(const std::string& s) {
  std::vector<RankAgreementItem> items;
  size_t at = 0;
  auto field = [&](std::string* f) {
    const size_t colon = s.find(':', at);
    if (colon == std::string::npos) return false;
    const size_t n = std::strtoull(s.c_str() + at, nullptr, 10);
    if (colon + 1 + n > s.size()) return false;
    *f = s.substr(colon + 1, n);
    at = colon + 1 + n;
    return true;
  };
  while (at < s.size()) {
    RankAgreementItem it;
    if (!field(&it.name) || !field(&it.value) || !field(&it.where)) break;
    items.push_back(std::move(it));
  }
  return items;
}

// `bytes` from `root` to every rank (its size first).
Status BroadcastString(Communicator* comm, std::string* bytes, int root) {
  uint64_t n = bytes->size();
  ZERO_RETURN_IF_ERROR(comm->BroadcastHost(&n, sizeof(n), root));
  bytes->resize(static_cast<size_t>(n));
  if (n == 0) return OkStatus();
  return comm->BroadcastHost(bytes->data(), static_cast<size_t>(n), root);
}

// A value for a message: a one-line value as it is (cut at 200 characters); of a multi-line one
// (the config) the first line that differs from `other`'s, with its number.
std::string ShownValue(const std::string& value, const std::string& other) {
  std::string v = value;
  if (value.find('\n') != std::string::npos) {
    size_t line = 1, at = 0;
    while (true) {
      const size_t end = std::min(value.find('\n', at), value.size());
      const size_t other_end = std::min(other.find('\n', at), other.size());
      const std::string mine = value.substr(at, end - at);
      if (at >= other.size() || mine != other.substr(at, other_end - at) || end >= value.size()) {
        size_t b = mine.find_first_not_of(' ');
        v = "line " + std::to_string(line) + " '" + (b == std::string::npos ? mine : mine.substr(b)) + "'";
        break;
      }
      at = end + 1;
      ++line;
    }
  }
  if (v.size() > 200) v = v.substr(0, 200) + "...";
  return v;
}

// "40 s", "12 min", "3.5 h", "9 days".
std::string Duration(double s) {
  char b[32];
  if (s < 120) {
    std::snprintf(b, sizeof(b), "%.0f s", s);
  } else if (s < 7200) {
    std::snprintf(b, sizeof(b), "%.0f min", s / 60);
  } else if (s < 172800) {
    std::snprintf(b, sizeof(b), "%.1f h", s / 3600);
  } else {
    std::snprintf(b, sizeof(b), "%.0f days", s / 86400);
  }
  return b;
}

// A step expected to take longer than this is announced after its first micro step, and a step
// still running says how far it is every kStepNoteSeconds (a huge gradient_accumulation_steps
// printed nothing for minutes).
constexpr double kLongStepSeconds = 10;
constexpr double kStepNoteSeconds = 30;

// --- the graceful stop (trainer.h) ---

volatile sig_atomic_t g_stop_signal = 0;  // the first SIGINT/SIGTERM while training; 0: none
volatile sig_atomic_t g_stop_at_s = 0;    // CLOCK_MONOTONIC seconds when it came

void OnStopSignal(int sig) {
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  if (g_stop_signal != 0) {
    if (now.tv_sec - g_stop_at_s < static_cast<time_t>(kStopSignalDebounceSeconds)) return;  // the same request
    signal(sig, SIG_DFL);
    raise(sig);
    return;
  }
  g_stop_signal = sig;
  g_stop_at_s = static_cast<sig_atomic_t>(now.tv_sec);
  const char msg[] =
      "\nstop requested: finishing this step, saving a checkpoint (with --save) and exiting non-zero; "
      "a second signal stops at once\n";
  ssize_t ignored = write(STDERR_FILENO, msg, sizeof(msg) - 1);
  (void)ignored;
}

// Installs OnStopSignal for SIGINT and SIGTERM while one exists (counted: thread ranks in tests
// share it); the last one restores the previous handlers.
class StopSignals {
 public:
  StopSignals() {
    std::lock_guard<std::mutex> lock(mu_);
    if (users_++ > 0) return;
    g_stop_signal = 0;
    struct sigaction sa {};
    sa.sa_handler = OnStopSignal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGINT, &sa, &old_int_);
    sigaction(SIGTERM, &sa, &old_term_);
  }
  ~StopSignals() {
    std::lock_guard<std::mutex> lock(mu_);
    if (--users_ > 0) return;
    sigaction(SIGINT, &old_int_, nullptr);
    sigaction(SIGTERM, &old_term_, nullptr);
  }
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

 private:
  static inline std::mutex mu_;
  static inline int users_ = 0;
  static inline struct sigaction old_int_ { }, old_term_{}; };

}  // namespace

Status CheckSaveDirectory(const std::string& dir) {
  if (dir.empty()) return OkStatus();
  struct stat st;
  if (::stat(dir.c_str(), &st) == 0 && !S_ISDIR(st.st_mode)) {
    return FailedPreconditionError("--save " + dir + ": exists and is not a directory (" +
                                   (S_ISREG(st.st_mode) ? "a file" : "not a regular file either") +
                                   "); pass a checkpoint directory (created when missing)");
  }
  return CheckWritableDirectory(dir).WithContext("--save " + dir);
}

Status Trainer::CheckOutputs() {
  Status mine = CheckSaveDirectory(options_.save_dir);
  if (mine.ok() && lead() && options_.check_lead_outputs) mine = options_.check_lead_outputs();
  // The first rank that failed, as the maximum of -rank (-world: none did).
  double first = mine.ok() ? -world_ : -rank_;
  if (world_ > 1) {
    ZERO_RETURN_IF_ERROR(comm_->AllReduceHost(&first, 1, ReduceOp::kMax).WithContext("checking the output paths"));
  }
  if (!mine.ok()) return mine;
  if (first > -world_) {
    return FailedPreconditionError("rank " + std::to_string(static_cast<int>(-first)) +
                                   " cannot write its outputs (its error above names the flag and path)");
  }
  return OkStatus();
}

Result<int> Trainer::AgreeToStop() {
  double sig = g_stop_signal;
  if (world_ > 1) {
    ZERO_RETURN_IF_ERROR(comm_->AllReduceHost(&sig, 1, ReduceOp::kMax).WithContext("agreeing whether to stop"));
  }
  return static_cast<int>(sig);
}

std::string HexHash(const void* data, size_t bytes) {
  char out[17];
  std::snprintf(out, sizeof(out), "%016llx", static_cast<unsigned long long>(XxHash64(data, bytes)));
  return out;
}

Trainer::Trainer(TrainerOptions options, TrainJob* job) : options_(std::move(options)), job_(job) {}

Trainer::~Trainer() {
  if (log_json_ != nullptr) std::fclose(log_json_);
}

Status Trainer::Run(RankContext* where) {
  t_start_ = Clock::now();
  ZERO_ASSIGN_OR_RETURN(RendezvousOptions ro, RendezvousFromEnv());
  rank_ = where->rank = ro.rank;
  world_ = where->world = ro.world_size;
  if (options_.timeout_s > 0) {
    ro.comm.timeout = std::chrono::milliseconds(static_cast<int64_t>(options_.timeout_s * 1000));
  } else if (std::getenv("ZERO_COMM_TIMEOUT_MS") == nullptr) {
    ro.comm.timeout = options_.default_timeout;
  }
  ZERO_ASSIGN_OR_RETURN(config_, job_->Prepare(rank_, world_));
  print_every_ = options_.print_every > 0 ? options_.print_every : std::max<int64_t>(1, config_.steps_per_print);
  tokens_per_step_ = config_.train_batch_size * options_.tokens_per_row;
  ZERO_RETURN_IF_ERROR(Connect(std::move(ro)));
  ZERO_RETURN_IF_ERROR(CheckRanksAgree());
  ZERO_RETURN_IF_ERROR(CheckOutputs());

  // The engine's own breakdown line (its view: GatherModule to GradReady, waits on collectives and
  // offload) under the loop's, marked so the two are told apart.
  EngineEnv env;
  env.log_sink = [](const std::string& line) { std::printf("engine %s\n", line.c_str()); };
  auto engine_or = Engine::Create(config_, device_.get(), comm_.get(), env);
  if (!engine_or.ok()) return engine_or.status().WithContext("creating the engine");
  engine_ = std::move(engine_or).value();
  ZERO_ASSIGN_OR_RETURN(specs_, job_->InitializeParameters(engine_.get()));
  ZERO_ASSIGN_OR_RETURN(runner_, job_->CreateRunner(device_.get()));
  params_ = std::make_unique<examples::EngineParams>(engine_.get(), specs_);
  grads_ = std::make_unique<examples::EngineGrads>(engine_.get());

  if (lead()) job_->PrintHeader(*this);
  ZERO_ASSIGN_OR_RETURN(const bool done, job_->RunWithoutTraining(*this));
  if (!done) {
    ZERO_RETURN_IF_ERROR(Train());
    ZERO_RETURN_IF_ERROR(job_->AfterTraining(*this));
  }
  // Everyone leaves together, so no rank tears its connections down under a peer still working.
  return comm_->Barrier().WithContext("final barrier");
}

// Device and communicator: one GPU per rank, picked by the local rank. A launcher that gives each
// rank one visible GPU (CUDA_VISIBLE_DEVICES per task) leaves only cuda:0 whatever the local rank.
Status Trainer::Connect(RendezvousOptions ro) {
  const std::string& dev = options_.device;
  const int ordinal = dev == "cuda" && VisibleGpus() == 1 ? 0 : ro.local_rank;
  const std::string device_name = dev == "cpu" ? "cpu" : "cuda:" + std::to_string(ordinal);
  auto device_or = CreateDevice(device_name);
  if (!device_or.ok()) {
    return device_or.status().WithContext("--device " + dev + " (device " + device_name + " for local rank " +
                                          std::to_string(ro.local_rank) + ")");
  }
  device_ = std::move(device_or).value();
  auto comm_or = CreateCommunicator(dev == "cpu" ? "gloo" : "nccl", device_.get(), ro);
  if (!comm_or.ok()) {
    return comm_or.status().WithContext("rendezvous of " + std::to_string(ro.world_size) + " ranks at " +
                                        ro.master_addr + ":" + std::to_string(ro.master_port));
  }
  comm_ = std::move(comm_or).value();
  return OkStatus();
}

Status Trainer::CheckRanksAgree() {
  std::vector<RankAgreementItem> items = job_->RankAgreement();
  items.push_back(
      {"the log line's period in steps (--print-every or steps_per_print)", std::to_string(print_every_), ""});
  items.push_back({"the resolved engine config", ConfigToJson(config_), ""});
  if (world_ == 1) return OkStatus();
  std::string lead_bytes = SerializeItems(items);
  ZERO_RETURN_IF_ERROR(BroadcastString(comm_.get(), &lead_bytes, 0).WithContext("comparing the ranks' flags"));
  const std::vector<RankAgreementItem> lead_items = ParseItems(lead_bytes);
  // The first item that differs from rank 0's, as item * world + rank so that the minimum over the
  // ranks is the first item and, of the ranks that differ there, the first rank.
  double first = std::numeric_limits<double>::max();
  for (size_t i = 0; i < std::max(items.size(), lead_items.size()); ++i) {
    if (i >= items.size() || i >= lead_items.size() || items[i].name != lead_items[i].name ||
        items[i].value != lead_items[i].value) {
      first = static_cast<double>(i) * world_ + rank_;
      break;
    }
  }
  first = -first;  // the minimum as the maximum of the negations
  ZERO_RETURN_IF_ERROR(comm_->AllReduceHost(&first, 1, ReduceOp::kMax).WithContext("comparing the ranks' flags"));
  first = -first;
  if (first == std::numeric_limits<double>::max()) return OkStatus();
  const size_t index = static_cast<size_t>(first) / world_;
  const int other = static_cast<int>(static_cast<int64_t>(first) % world_);
  std::string other_bytes = rank_ == other && index < items.size() ? SerializeItems({items[index]}) : "";
  ZERO_RETURN_IF_ERROR(BroadcastString(comm_.get(), &other_bytes, other).WithContext("comparing the ranks' flags"));
  const std::vector<RankAgreementItem> got = ParseItems(other_bytes);
  const RankAgreementItem none{"", "(nothing: a different program or version)", ""};
  const RankAgreementItem& theirs = got.empty() ? none : got[0];
  const RankAgreementItem& lead = index < lead_items.size() ? lead_items[index] : none;
  auto shown = [](const RankAgreementItem& it, const RankAgreementItem& vs) {
    return ShownValue(it.value, vs.value) + (it.where.empty() ? "" : " (" + it.where + ")");
  };
  std::string what = lead.name.empty() ? theirs.name : lead.name;
  if (!theirs.name.empty() && !lead.name.empty() && theirs.name != lead.name) what = theirs.name + " / " + lead.name;
  return InvalidArgumentError("the ranks were started differently: " + what + ": rank " + std::to_string(other) +
                              " has " + shown(theirs, lead) + ", rank 0 has " + shown(lead, theirs) +
                              "; start every rank with the same flags, config and data");
}

// --resume, --log-json, then the steps from the resumed one to options_.steps, then the last
// checkpoint.
Status Trainer::Train() {
  const TrainerOptions& o = options_;
  if (!o.resume_dir.empty()) {
    Result<std::string> client_state = engine_->LoadCheckpoint(o.resume_dir);
    ZERO_RETURN_IF_ERROR(client_state.status().WithContext("--resume " + o.resume_dir));
    ZERO_RETURN_IF_ERROR(job_->CheckResumedClientState(*client_state).WithContext("--resume " + o.resume_dir));
    start_step_ = engine_->counters().global_steps;
    if (lead()) {
      std::printf("  resumed from %s at step %lld\n", o.resume_dir.c_str(), static_cast<long long>(start_step_));
    }
    // --steps 0 trains nothing on purpose: the checkpoint's weights go to what follows training
    // (zero_llm's "--steps 0 --resume DIR --export-hf OUT").
    if (o.steps == 0) {
      if (lead())
        std::printf("  nothing to train: --steps 0 (the checkpoint is at step %lld)\n",
                    static_cast<long long>(start_step_));
    } else if (start_step_ > o.steps) {
      return InvalidArgumentError("--resume " + o.resume_dir + ": the checkpoint is at step " +
                                  std::to_string(start_step_) + ", past --steps " + std::to_string(o.steps) +
                                  ": give --steps " + std::to_string(start_step_) +
                                  " or more (the step the run ends at, not the steps to add)");
    }
    if (o.steps > 0 && start_step_ == o.steps && lead()) {
      std::printf("  nothing to train: the checkpoint is at step %lld = --steps\n",
                  static_cast<long long>(start_step_));
    }
  }
  if (lead() && !o.log_json.empty()) {
    log_json_ = std::fopen(o.log_json.c_str(), "w");
    if (log_json_ == nullptr) return ErrnoError("--log-json: open", o.log_json, errno);
  }
  examples::ProgressBar bar(stdout, o.steps, lead() && o.progress_bar && isatty(STDOUT_FILENO));
  examples::WindowSummary window;
  window.total_steps = o.steps;
  ZERO_ASSIGN_OR_RETURN(std::unique_ptr<LoopTiming> timing,
                        LoopTiming::Create(o.loop_breakdown && config_.wall_clock_breakdown, o.trace, o.steps,
                                           device_.get(), rank_, start_step_));
  t_train_ = Clock::now();
  if (lead()) std::printf("  set-up %.2f s; training\n", Since(t_start_));
  StopSignals stop_signals;
  for (int64_t step = start_step_; step < o.steps; ++step) {
    ZERO_RETURN_IF_ERROR(RunStep(step, timing.get(), &window, &bar));
    ZERO_ASSIGN_OR_RETURN(const int sig, AgreeToStop());
    if (sig == 0) continue;
    // A graceful stop: every rank is here after the same step.
    bar.Finish();
    const int64_t done = step + 1;
    std::string saved = "no checkpoint (no --save)";
    if (!o.save_dir.empty()) {
      if (!(o.save_every > 0 && done % o.save_every == 0)) ZERO_RETURN_IF_ERROR(SaveCheckpoint(done));
      saved = "the checkpoint of step " + std::to_string(done) + " is saved in " + o.save_dir +
              " (resume with --resume " + o.save_dir + ")";
    }
    return UnavailableError(std::string("stopped by ") +
                            (sig == SIGINT    ? "SIGINT"
                             : sig == SIGTERM ? "SIGTERM"
                                              : "a signal") +
                            " after step " + std::to_string(done) + " of " + std::to_string(o.steps) + "; " + saved);
  }
  bar.Finish();
  train_seconds_ = Since(t_train_);
  // The last step's periodic checkpoint is the last one.
  if (!o.save_dir.empty() && !(o.save_every > 0 && o.steps % o.save_every == 0)) {
    ZERO_RETURN_IF_ERROR(SaveCheckpoint(o.steps));
  }
  return OkStatus();
}

// Optimizer step `step` (0-based): GAS micro steps of forward, backward and Engine::Backward, then
// Engine::Step, the mean loss over micro steps and ranks, its record, the log line when due, and
// the periodic checkpoint.
Status Trainer::RunStep(int64_t step, LoopTiming* timing, examples::WindowSummary* window, examples::ProgressBar* bar) {
  const TrainerOptions& o = options_;
  const int micro = static_cast<int>(config_.train_micro_batch_size_per_gpu);
  const int64_t gas = config_.gradient_accumulation_steps;
  job_->BeforeStep(rank_, step + 1);
  const Clock::time_point t0 = Clock::now();
  timing->BeginStep(step + 1);
  const float loss_scale = engine_->loss_scale();
  // Managed accumulation: the engine's loss scale / GAS. Unmanaged (every Step() is a boundary and
  // the user divides by the micro steps): loss_scale / GAS is the factor the managed engine applies.
  const float grad_scale = config_.managed_gradient_accumulation || !o.unmanaged_divides_by_gas
                               ? engine_->gradient_scale()
                               : loss_scale / static_cast<float>(gas);
  double sums[2] = {0, 0};  // kPerTarget: loss * targets, targets; kPerMicroStep: loss
  double next_note = kStepNoteSeconds;
  for (int64_t m = 0; m < gas; ++m) {
    const MicroStep at{
        .step = step, .micro = m, .index = step * gas + m, .rows = micro, .rank = rank_, .world_size = world_};
    const std::string where = "step " + std::to_string(step + 1) + " micro step " + std::to_string(m);
    // forward: the model's; backward: the model's and Engine::Backward (gradient reduction), as
    // DeepSpeed's "backward" includes its all-reduce.
    ZERO_ASSIGN_OR_RETURN(LoopTiming::Phase fwd, timing->BeginPhase("forward"));
    ZERO_ASSIGN_OR_RETURN(Timeline::DeviceSpan fwd_dev, timing->BeginCompute("forward", m));
    ZERO_RETURN_IF_ERROR(runner_->Forward(*params_, at).WithContext(where + " forward"));
    ZERO_RETURN_IF_ERROR(timing->EndCompute(std::move(fwd_dev)));
    ZERO_RETURN_IF_ERROR(timing->EndPhase(std::move(fwd), m));
    ZERO_ASSIGN_OR_RETURN(LoopTiming::Phase bwd, timing->BeginPhase("backward"));
    ZERO_ASSIGN_OR_RETURN(Timeline::DeviceSpan bwd_dev, timing->BeginCompute("backward", m));
    ZERO_RETURN_IF_ERROR(runner_->Backward(*params_, grad_scale, *grads_).WithContext(where + " backward"));
    ZERO_RETURN_IF_ERROR(timing->EndCompute(std::move(bwd_dev)));
    ZERO_ASSIGN_OR_RETURN(LoopTiming::Phase reduce, timing->BeginPhase("Engine::Backward"));
    ZERO_RETURN_IF_ERROR(engine_->Backward().WithContext(where));
    ZERO_RETURN_IF_ERROR(timing->EndPhase(std::move(reduce), m));
    ZERO_RETURN_IF_ERROR(timing->EndPhase(std::move(bwd), m));
    auto loss = runner_->Loss();
    if (!loss.ok()) return loss.status().WithContext(where);
    if (o.loss_average == LossAverage::kPerTarget) {
      const int64_t n = runner_->CountedTargets();
      sums[0] += *loss * static_cast<double>(n);
      sums[1] += static_cast<double>(n);
    } else {
      sums[0] += *loss;
    }
    if (lead()) {
      const double so_far = Since(t0);
      if (m == 0 && step == start_step_ && gas > 1 && so_far * static_cast<double>(gas) > kLongStepSeconds) {
        std::printf(
            "  step %lld: %lld micro steps (gradient_accumulation_steps) of about %.3g s each: about %s per step; the "
            "log line comes every %lld steps\n",
            static_cast<long long>(step + 1), static_cast<long long>(gas), so_far,
            Duration(so_far * static_cast<double>(gas)).c_str(), static_cast<long long>(print_every_));
        std::fflush(stdout);
      } else if (so_far >= next_note) {
        std::printf("  step %lld: micro step %lld of %lld, %s so far\n", static_cast<long long>(step + 1),
                    static_cast<long long>(m + 1), static_cast<long long>(gas), Duration(so_far).c_str());
        std::fflush(stdout);
        next_note = so_far + kStepNoteSeconds;
      }
    }
  }
  const double lr = engine_->lr();
  ZERO_ASSIGN_OR_RETURN(LoopTiming::Phase step_phase, timing->BeginPhase("step"));
  ZERO_RETURN_IF_ERROR(engine_->Step().WithContext("step " + std::to_string(step + 1)));
  ZERO_RETURN_IF_ERROR(timing->EndPhase(std::move(step_phase), -1));
  double mean_loss = 0;
  if (o.loss_average == LossAverage::kPerTarget) {
    ZERO_RETURN_IF_ERROR(comm_->AllReduceHost(sums, 2, ReduceOp::kSum).WithContext("averaging the loss"));
    mean_loss = sums[1] > 0 ? sums[0] / sums[1] : 0.0;
  } else {
    mean_loss = sums[0] / static_cast<double>(gas);
    ZERO_RETURN_IF_ERROR(comm_->AllReduceHost(&mean_loss, 1, ReduceOp::kSum).WithContext("averaging the loss"));
    mean_loss /= world_;
  }

  examples::StepRecord rec;
  rec.step = step + 1;
  rec.loss = mean_loss;
  rec.lr = lr;
  rec.grad_norm = engine_->global_grad_norm();
  rec.loss_scale = loss_scale;
  rec.fp16 = config_.fp16.enabled;
  rec.applied = engine_->was_step_applied();
  // Every rank holds the same mean, so every rank stops at the same step.
  ZERO_RETURN_IF_ERROR(job_->CheckStep(rec));
  rec.step_seconds = Since(t0);
  rec.tokens = tokens_per_step_;
  rec.elapsed_seconds = Since(t_train_);
  rec.memory = engine_->memory();
  if (std::isnan(first_loss_)) first_loss_ = mean_loss;
  plot_steps_.push_back(static_cast<double>(rec.step));
  plot_losses_.push_back(mean_loss);
  if (log_json_ != nullptr) {
    std::fprintf(log_json_, "%s\n", job_->StepJson(rec).c_str());
    std::fflush(log_json_);
  }

  window->last = rec;
  window->mean_loss += mean_loss;
  window->seconds += rec.step_seconds;
  window->steps += 1;
  window->tokens += tokens_per_step_;
  const bool print_now = rec.step % print_every_ == 0 || rec.step == o.steps;
  if (print_now) ZERO_RETURN_IF_ERROR(PrintWindow(window, bar));
  ZERO_RETURN_IF_ERROR(timing->EndStep(rec.step, print_now, lead()));
  if (lead()) bar->Update(rec.step, mean_loss, rec.elapsed_seconds);
  if (!o.save_dir.empty() && o.save_every > 0 && rec.step % o.save_every == 0) {
    ZERO_RETURN_IF_ERROR(SaveCheckpoint(rec.step));
  }
  return OkStatus();
}

// Collective on every rank at the same steps: the largest memory of any rank; rank 0 prints the
// job's line. Starts the next window.
Status Trainer::PrintWindow(examples::WindowSummary* window, examples::ProgressBar* bar) {
  const EngineMemory mine = engine_->memory();
  double mem[6] = {double(mine.model_params), double(mine.master_params), double(mine.optimizer_states),
                   double(mine.gradients),    double(mine.device_peak),   HostPeakBytes()};
  ZERO_RETURN_IF_ERROR(comm_->AllReduceHost(mem, 6, ReduceOp::kMax).WithContext("gathering memory use"));
  if (lead()) {
    window->mean_loss /= static_cast<double>(window->steps);
    window->skipped = engine_->counters().skipped_steps;
    // By name: EngineMemory's fifth field is gradient_accumulators, not device_peak.
    window->memory_max = EngineMemory{.model_params = size_t(mem[0]),
                                      .master_params = size_t(mem[1]),
                                      .optimizer_states = size_t(mem[2]),
                                      .gradients = size_t(mem[3]),
                                      .device_peak = size_t(mem[4])};
    window->host_peak_max = mem[5];
    bar->Clear();
    std::printf("%s\n", job_->WindowLine(*window).c_str());
    std::fflush(stdout);
  }
  *window = examples::WindowSummary{};
  window->total_steps = options_.steps;
  return OkStatus();
}

Status Trainer::SaveCheckpoint(int64_t step) {
  const std::string& dir = options_.save_dir;
  Status st = engine_->SaveCheckpoint(dir, "", job_->CheckpointClientState(step));
  if (!st.ok()) return st.WithContext("--save " + dir + " at step " + std::to_string(step));
  if (lead() && options_.announce_checkpoints) {
    std::printf("  checkpoint saved: %s/global_step%lld\n", dir.c_str(), static_cast<long long>(step));
  }
  return OkStatus();
}

Status Trainer::WriteLossPlot(const std::string& title) const {
  if (!lead() || options_.plot.empty()) return OkStatus();
  LossPlotOptions po;
  po.title = title;
  po.smooth_window = static_cast<int>(std::clamp<int64_t>(options_.steps / 30, 1, 50));
  ZERO_RETURN_IF_ERROR(WriteLossSvg(options_.plot, plot_steps_, plot_losses_, po).WithContext("--plot"));
  std::printf("loss curve: %s\n", options_.plot.c_str());
  return OkStatus();
}

}  // namespace zero::train
