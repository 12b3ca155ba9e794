#include "data/byte_data.h"

#include <sys/stat.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "data/data_file.h"
#include "gtest/gtest.h"
#include "testing/scratch_dir.h"
#include "testing/status_matchers.h"

namespace zero::examples {
namespace {

std::string Alphabet(int n) {
  std::string s;
  for (int i = 0; i < n; ++i) s.push_back(static_cast<char>(i % 251));
  return s;
}

ByteDataset Make(int n) { return *ByteDataset::FromText(Alphabet(n)); }

TEST(ByteDatasetTest, RowsAreWindowsOfTheText) {
  ByteDataset ds = Make(1000);
  BatchSpec spec{.seed = 3, .step = 5, .rank = 0, .world_size = 1, .batch = 50, .context = 8};
  auto batch = ds.Batch(spec);
  ASSERT_OK(batch);
  ASSERT_EQ(batch->size(), 50u * 9);
  for (int i = 0; i < 50; ++i) {
    const std::string row(reinterpret_cast<const char*>(batch->data()) + i * 9, 9);
    EXPECT_NE(ds.bytes().find(row), std::string::npos) << "row " << i;
  }
}

TEST(ByteDatasetTest, DeterministicAndDependsOnEveryInput) {
  ByteDataset ds = Make(5000);
  BatchSpec spec{.seed = 1, .step = 2, .rank = 1, .world_size = 4, .batch = 16, .context = 8};
  auto a = *ds.Batch(spec);
  EXPECT_EQ(*ds.Batch(spec), a);
  BatchSpec other = spec;
  other.seed = 2;
  EXPECT_NE(*ds.Batch(other), a);
  other = spec;
  other.step = 3;
  EXPECT_NE(*ds.Batch(other), a);
  other = spec;
  other.rank = 2;
  EXPECT_NE(*ds.Batch(other), a);
}

// W ranks with B rows see exactly the rows of one rank with W*B rows, and gradient accumulation
// (sampler step = step * G + micro) sees the same rows as a G times larger batch.
TEST(ByteDatasetTest, GlobalBatchIndependentOfHowItIsSplit) {
  ByteDataset ds = Make(10000);
  const int context = 6, step = 7;
  BatchSpec whole{.seed = 9, .step = step, .rank = 0, .world_size = 1, .batch = 24, .context = context};
  const auto all = *ds.Batch(whole);
  std::vector<uint8_t> by_ranks;
  for (int r = 0; r < 3; ++r) {
    BatchSpec part{.seed = 9, .step = step, .rank = r, .world_size = 3, .batch = 8, .context = context};
    auto b = *ds.Batch(part);
    by_ranks.insert(by_ranks.end(), b.begin(), b.end());
  }
  EXPECT_EQ(by_ranks, all);
  std::vector<uint8_t> by_micro;
  for (int m = 0; m < 4; ++m) {
    for (int r = 0; r < 2; ++r) {
      // Micro step m of step `step`, G = 4: each micro batch is 3 rows per rank; the global batch
      // of the step is 4 micro steps x 2 ranks x 3 rows = 24 rows, in (micro, rank, row) order.
      BatchSpec part{.seed = 9, .step = step * 4 + m, .rank = r, .world_size = 2, .batch = 3, .context = context};
      auto b = *ds.Batch(part);
      by_micro.insert(by_micro.end(), b.begin(), b.end());
    }
  }
  EXPECT_EQ(by_micro, all);
}

TEST(ByteDatasetTest, CoversTheTextRoughlyUniformly) {
  ByteDataset ds = Make(200);
  std::vector<int> hits(256, 0);
  for (int step = 0; step < 200; ++step) {
    BatchSpec spec{.seed = 4, .step = step, .rank = 0, .world_size = 1, .batch = 10, .context = 1};
    auto b = *ds.Batch(spec);
    for (int i = 0; i < 10; ++i) ++hits[b[i * 2]];
  }
  // 2000 draws over 199 start positions: each about 10 times.
  for (int v = 0; v < 199; ++v) {
    EXPECT_GT(hits[v], 0) << v;
    EXPECT_LT(hits[v], 30) << v;
  }
  EXPECT_EQ(hits[199], 0);  // the last byte only ever ends a window
}

TEST(ByteDatasetTest, RejectsBadSpecsAndShortTexts) {
  ByteDataset ds = Make(8);
  EXPECT_EQ(ds.Batch({.batch = 1, .context = 8}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_OK(ds.Batch({.batch = 1, .context = 7}));
  EXPECT_FALSE(ds.Batch({.rank = 2, .world_size = 2, .batch = 1, .context = 2}).ok());
  EXPECT_FALSE(ds.Batch({.batch = 0, .context = 2}).ok());
  EXPECT_FALSE(ds.Batch({.step = -1, .batch = 1, .context = 2}).ok());
}

TEST(ByteDatasetTest, SplitAndSequentialBatches) {
  ByteDataset ds = Make(1000);
  auto [train, holdout] = ds.Split(0.1);
  EXPECT_EQ(train.size(), 900u);
  EXPECT_EQ(holdout.size(), 100u);
  EXPECT_EQ(train.bytes() + holdout.bytes(), ds.bytes());
  auto seq = holdout.SequentialBatch(95, 3, 4);
  ASSERT_OK(seq);
  // 96 windows of 5 bytes: starts 95, 0, 1.
  EXPECT_EQ(std::string(seq->begin(), seq->begin() + 5), holdout.bytes().substr(95, 5));
  EXPECT_EQ(std::string(seq->begin() + 5, seq->begin() + 10), holdout.bytes().substr(0, 5));
}

TEST(ByteDatasetTest, FromFileReadsBytesAndNamesMissingFiles) {
  ASSERT_OK_AND_ASSIGN(ScratchDir dir, ScratchDir::Create("data_test"));
  const std::string path = dir.File("data_test.txt");
  {
    std::ofstream out(path, std::ios::binary);
    out << std::string("ab\0cd", 5);
  }
  auto ds = ByteDataset::FromFile(path);
  ASSERT_OK(ds);
  EXPECT_EQ(ds->bytes(), std::string("ab\0cd", 5));
  auto missing = ByteDataset::FromFile(path + ".missing");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find(".missing"), std::string::npos);
}

// A data path that is not a regular file is refused at once, naming what it is: a named pipe
// (the read blocked forever), /dev/zero (read until memory ran out: 1 GiB in the probe), a
// directory (read as 0 bytes: "too short").
TEST(ByteDatasetTest, FromFileRefusesWhatIsNotARegularFileAtOnce) {
  ASSERT_OK_AND_ASSIGN(ScratchDir dir, ScratchDir::Create("data_test"));
  const std::string fifo = dir.File("fifo");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const auto t0 = std::chrono::steady_clock::now();
  struct Case {
    std::string path, what;
  };
  for (const Case& c : {Case{fifo, "(it is a named pipe)"}, Case{"/dev/zero", "(it is a character device)"},
                        Case{dir.path(), "(it is a directory)"}}) {
    auto ds = ByteDataset::FromFile(c.path);
    ASSERT_FALSE(ds.ok()) << c.path;
    EXPECT_NE(ds.status().message().find(c.path + ": not a regular file " + c.what), std::string::npos)
        << ds.status().message();
    const Status check = data::CheckDataFile("--data", c.path, "a text file");
    EXPECT_NE(check.message().find("--data " + c.path + ": not a regular file " + c.what + "; expected a text file"),
              std::string::npos)
        << check.message();
  }
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 5.0);
  EXPECT_NE(data::CheckDataFile("--data", dir.File("none"), "a text file").message().find("no such file"),
            std::string::npos);
}

}  // namespace
}  // namespace zero::examples
