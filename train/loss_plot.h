// Loss-curve plot: writes a self-contained SVG (axes, ticks, labels, the training loss per step and an
// optional smoothed line) that any browser or image viewer shows. Owns nothing; pure function of its
// inputs plus one atomic file write.
#pragma once

#include <string>
#include <vector>

#include "runtime/status.h"

namespace zero {

struct LossPlotOptions {
  std::string title = "zero_train: training loss";
  int width = 800;
  int height = 480;
  int smooth_window = 20;  // moving average drawn over the raw curve (0: none)
};

// steps[i], losses[i]: one point per optimizer step. Renders the SVG text.
std::string RenderLossSvg(const std::vector<double>& steps, const std::vector<double>& losses,
                          const LossPlotOptions& options);
// Renders and writes to `path` (temp file + rename).
Status WriteLossSvg(const std::string& path, const std::vector<double>& steps, const std::vector<double>& losses,
                    const LossPlotOptions& options);

}  // namespace zero
