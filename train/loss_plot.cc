#include "train/loss_plot.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <sstream>

namespace zero {
namespace {

// A "nice" tick step (1, 2, 5 x 10^k) giving about `target` ticks over span.
double NiceStep(double span, int target) {
  if (!(span > 0)) return 1;
  double raw = span / target;
  double mag = std::pow(10.0, std::floor(std::log10(raw)));
  double r = raw / mag;
  double nice = r < 1.5 ? 1 : r < 3 ? 2 : r < 7 ? 5 : 10;
  return nice * mag;
}

std::string Fmt(double v) {
  char buf[32];
  if (std::fabs(v) >= 1000 || (std::fabs(v) < 0.01 && v != 0)) {
    std::snprintf(buf, sizeof(buf), "%.3g", v);
  } else {
    std::snprintf(buf, sizeof(buf), "%.4g", v);
  }
  return buf;
}

}  // namespace

std::string RenderLossSvg(const std::vector<double>& steps, const std::vector<double>& losses,
                          const LossPlotOptions& o) {
  const double left = 70, right = 20, top = 40, bottom = 50;
  const double pw = o.width - left - right, ph = o.height - top - bottom;
  std::vector<std::pair<double, double>> pts;
  for (size_t i = 0; i < std::min(steps.size(), losses.size()); ++i) {
    if (std::isfinite(losses[i])) pts.push_back({steps[i], losses[i]});
  }
  double x0 = 0, x1 = 1, y0 = 0, y1 = 1;
  if (!pts.empty()) {
    x0 = x1 = pts[0].first;
    y0 = y1 = pts[0].second;
    for (auto& p : pts) {
      x0 = std::min(x0, p.first);
      x1 = std::max(x1, p.first);
      y0 = std::min(y0, p.second);
      y1 = std::max(y1, p.second);
    }
  }
  if (x1 <= x0) x1 = x0 + 1;
  if (y1 <= y0) y1 = y0 + 1;
  double ys = NiceStep(y1 - y0, 6);
  y0 = std::floor(y0 / ys) * ys;
  y1 = std::ceil(y1 / ys) * ys;
  double xs = NiceStep(x1 - x0, 8);
  auto X = [&](double x) { return left + (x - x0) / (x1 - x0) * pw; };
  auto Y = [&](double y) { return top + (1 - (y - y0) / (y1 - y0)) * ph; };

  std::ostringstream s;
  s << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << o.width << "\" height=\"" << o.height
    << "\" font-family=\"sans-serif\" font-size=\"12\">\n";
  s << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  s << "<text x=\"" << o.width / 2 << "\" y=\"22\" text-anchor=\"middle\" font-size=\"15\">" << o.title << "</text>\n";
  for (double y = y0; y <= y1 + ys * 1e-9; y += ys) {
    s << "<line x1=\"" << left << "\" x2=\"" << left + pw << "\" y1=\"" << Y(y) << "\" y2=\"" << Y(y)
      << "\" stroke=\"#e4e4e4\"/>\n";
    s << "<text x=\"" << left - 6 << "\" y=\"" << Y(y) + 4 << "\" text-anchor=\"end\">" << Fmt(y) << "</text>\n";
  }
  for (double x = std::ceil(x0 / xs) * xs; x <= x1 + xs * 1e-9; x += xs) {
    s << "<line x1=\"" << X(x) << "\" x2=\"" << X(x) << "\" y1=\"" << top << "\" y2=\"" << top + ph
      << "\" stroke=\"#f0f0f0\"/>\n";
    s << "<text x=\"" << X(x) << "\" y=\"" << top + ph + 18 << "\" text-anchor=\"middle\">" << Fmt(x) << "</text>\n";
  }
  s << "<rect x=\"" << left << "\" y=\"" << top << "\" width=\"" << pw << "\" height=\"" << ph
    << "\" fill=\"none\" stroke=\"#444\"/>\n";
  s << "<text x=\"" << left + pw / 2 << "\" y=\"" << o.height - 10 << "\" text-anchor=\"middle\">step</text>\n";
  s << "<text transform=\"translate(18," << top + ph / 2 << ") rotate(-90)\" text-anchor=\"middle\">loss</text>\n";
  auto polyline = [&](const std::vector<std::pair<double, double>>& p, const char* color, double w) {
    if (p.empty()) return;
    s << "<polyline fill=\"none\" stroke=\"" << color << "\" stroke-width=\"" << w << "\" points=\"";
    for (auto& q : p) s << X(q.first) << "," << Y(q.second) << " ";
    s << "\"/>\n";
  };
  polyline(pts, "#9ab8e0", 1.0);
  if (o.smooth_window > 1 && pts.size() > 2) {
    std::vector<std::pair<double, double>> sm;
    double acc = 0;
    for (size_t i = 0; i < pts.size(); ++i) {
      acc += pts[i].second;
      if (i >= static_cast<size_t>(o.smooth_window)) acc -= pts[i - o.smooth_window].second;
      size_t n = std::min(i + 1, static_cast<size_t>(o.smooth_window));
      sm.push_back({pts[i].first, acc / n});
    }
    polyline(sm, "#1f4e9a", 2.0);
  }
  s << "</svg>\n";
  return s.str();
}

Status WriteLossSvg(const std::string& path, const std::vector<double>& steps, const std::vector<double>& losses,
                    const LossPlotOptions& options) {
  std::string svg = RenderLossSvg(steps, losses, options);
  std::string tmp = path + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) return ErrnoError("open", tmp, errno);
  size_t n = std::fwrite(svg.data(), 1, svg.size(), f);
  int close_rc = std::fclose(f);
  if (n != svg.size() || close_rc != 0) return ErrnoError("write", tmp, errno);
  if (std::rename(tmp.c_str(), path.c_str()) != 0) return ErrnoError("rename", path, errno);
  return OkStatus();
}

}  // namespace zero
