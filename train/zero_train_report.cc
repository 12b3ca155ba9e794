#include "train/zero_train_report.h"

#include <algorithm>
#include <cmath>
#include <sstream>

namespace zero::examples {
namespace {

std::string Num(double v) {
  if (!std::isfinite(v)) return "null";
  char buf[40];
  std::snprintf(buf, sizeof(buf), "%.17g", v);  // round-trip exact
  return buf;
}

std::string Fixed(const char* fmt, double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), fmt, v);
  return buf;
}

}  // namespace

std::string FormatBytes(double bytes) {
  static const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024 && u < 4) {
    bytes /= 1024;
    ++u;
  }
  if (u == 0) return Fixed("%.0f B", bytes);
  return Fixed(bytes < 10 ? "%.2f " : bytes < 100 ? "%.1f " : "%.0f ", bytes) + kUnits[u];
}

std::string FormatDuration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "--:--";
  const int64_t s = static_cast<int64_t>(std::llround(seconds));
  char buf[32];
  if (s >= 3600) {
    std::snprintf(buf, sizeof(buf), "%lld:%02lld:%02lld", static_cast<long long>(s / 3600),
                  static_cast<long long>(s / 60 % 60), static_cast<long long>(s % 60));
  } else {
    std::snprintf(buf, sizeof(buf), "%lld:%02lld", static_cast<long long>(s / 60), static_cast<long long>(s % 60));
  }
  return buf;
}

std::string FormatCount(double x) {
  if (x >= 1e9) return Fixed("%.2fG", x / 1e9);
  if (x >= 1e6) return Fixed("%.2fM", x / 1e6);
  if (x >= 1e4) return Fixed("%.1fk", x / 1e3);
  return Fixed("%.0f", x);
}

std::string StepJson(const StepRecord& r) {
  std::ostringstream s;
  s << "{\"step\":" << r.step << ",\"loss\":" << Num(r.loss) << ",\"lr\":" << Num(r.lr)
    << ",\"grad_norm\":" << Num(r.grad_norm) << ",\"applied\":" << (r.applied ? "true" : "false")
    << ",\"step_ms\":" << Num(r.step_seconds * 1e3) << ",\"tokens\":" << r.tokens
    << ",\"tokens_per_s\":" << Num(r.step_seconds > 0 ? r.tokens / r.step_seconds : 0)
    << ",\"elapsed_s\":" << Num(r.elapsed_seconds);
  if (r.fp16) s << ",\"loss_scale\":" << Num(r.loss_scale);
  s << ",\"memory\":{\"model_params\":" << r.memory.model_params << ",\"master_params\":" << r.memory.master_params
    << ",\"optimizer_states\":" << r.memory.optimizer_states << ",\"gradients\":" << r.memory.gradients
    << ",\"device_peak\":" << r.memory.device_peak << "}}";
  return s.str();
}

std::string FormatWindow(const WindowSummary& w) {
  const int digits = static_cast<int>(std::to_string(w.total_steps).size());
  char head[64];
  std::snprintf(head, sizeof(head), "step %*lld/%lld", digits, static_cast<long long>(w.last.step),
                static_cast<long long>(w.total_steps));
  std::ostringstream s;
  s << head << " | loss " << Fixed("%.4f", w.mean_loss) << " | lr " << Fixed("%.3e", w.last.lr) << " | grad norm ";
  if (w.last.grad_norm < 0) {
    s << "-";
  } else if (!std::isfinite(w.last.grad_norm)) {
    s << "inf";
  } else {
    s << Fixed("%.3f", w.last.grad_norm);
  }
  if (w.last.fp16) s << " | loss scale " << Fixed("%.0f", w.last.loss_scale);
  if (w.skipped > 0) s << " (" << w.skipped << " skipped)";
  const double tps = w.seconds > 0 ? w.tokens / w.seconds : 0;
  const double ms = w.steps > 0 ? w.seconds * 1e3 / w.steps : 0;
  s << " | " << FormatCount(tps) << " tok/s | " << Fixed(ms < 10 ? "%.2f" : "%.1f", ms) << " ms/step";
  const EngineMemory& m = w.memory_max;
  s << " | mem/rank: params " << FormatBytes(m.model_params) << ", master " << FormatBytes(m.master_params)
    << ", optim " << FormatBytes(m.optimizer_states) << ", grads " << FormatBytes(m.gradients) << ", peak "
    << FormatBytes(m.device_peak);
  return s.str();
}

ProgressBar::ProgressBar(FILE* out, int64_t total, bool enabled) : out_(out), total_(total), enabled_(enabled) {}

ProgressBar::~ProgressBar() { Finish(); }

std::string ProgressBar::Render() const {
  constexpr int kWidth = 30;
  const double frac = total_ > 0 ? std::min(1.0, static_cast<double>(step_) / total_) : 1.0;
  const int filled = static_cast<int>(frac * kWidth);
  std::string bar(filled, '#');
  bar.resize(kWidth, '.');
  const double eta = step_ > 0 ? elapsed_ / step_ * (total_ - step_) : NAN;
  char buf[160];
  std::snprintf(buf, sizeof(buf), "[%s] %3.0f%% %lld/%lld loss %.4f ETA %s", bar.c_str(), frac * 100,
                static_cast<long long>(step_), static_cast<long long>(total_), loss_, FormatDuration(eta).c_str());
  return buf;
}

void ProgressBar::Update(int64_t step, double loss, double elapsed_seconds, bool force) {
  if (!enabled_) return;
  step_ = step;
  loss_ = loss;
  elapsed_ = elapsed_seconds;
  if (!force && last_draw_ >= 0 && elapsed_seconds - last_draw_ < 0.1 && step != total_) return;
  last_draw_ = elapsed_seconds;
  Draw();
}

void ProgressBar::Clear() {
  if (!enabled_ || !shown_) return;
  std::fputs("\r\033[K", out_);
  std::fflush(out_);
  shown_ = false;
}

void ProgressBar::Draw() {
  if (!enabled_) return;
  std::fputs(("\r\033[K" + Render()).c_str(), out_);
  std::fflush(out_);
  shown_ = true;
}

void ProgressBar::Finish() {
  Clear();
  enabled_ = false;
}

}  // namespace zero::examples
