// gtest helpers shared by the equivalence tests: a cell's config parsed strictly (a failure names
// the cell and shows its JSON), and every rank's trace compared with the reference (a failure lists
// the first 40 differences of each rank).
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "engine/config/config.h"
#include "tests/equivalence/harness.h"

namespace zero::equivalence {

inline Config ParseCell(const CellSpec& cell) {
  ParseOptions o;
  o.world_size = cell.world;
  o.strict = true;
  o.source = cell.Name();
  Result<Config> c = ParseConfig(CellConfigJson(cell), o);
  if (!c.ok()) {
    ADD_FAILURE() << "config of " << cell.Name() << ": " << c.status().ToString() << "\n" << CellConfigJson(cell);
    return Config();
  }
  return *c;
}

inline void ExpectMatches(const RefTrace& ref, const std::vector<RankTrace>& traces, const Tolerance& tol) {
  for (size_t r = 0; r < traces.size(); ++r) {
    std::vector<std::string> lines;
    int bad = CompareRankTrace(ref, static_cast<int>(r), traces[r], tol, &lines);
    std::string all;
    for (size_t i = 0; i < lines.size() && i < 40; ++i) all += "  " + lines[i] + "\n";
    EXPECT_EQ(bad, 0) << "rank " << r << " differs from the reference:\n" << all;
  }
}

}  // namespace zero::equivalence
