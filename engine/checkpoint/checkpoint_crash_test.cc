// Kills a real saving process at every phase of SaveCheckpoint (engine/checkpoint/checkpoint.h) and checks
// that `latest` then names the last good checkpoint, bit for bit, for a new tag, for the tag
// `latest` already names (the default tag right after a load), and for another existing tag; at
// world sizes 1 and 2 (Gloo thread ranks). Each save runs in a fork()ed child on a FaultyFileSystem
// (runtime/faulty_file_system.h) that _exits at the named crash point; the parent stays
// single-threaded and reads the files the child left.
#include <sys/wait.h>
#include <unistd.h>

#include <string>
#include <tuple>
#include <vector>

#include "comm/thread_ranks.h"
#include "engine/checkpoint/checkpoint.h"
#include "engine/checkpoint/io.h"
#include "engine/checkpoint/test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/faulty_file_system.h"
#include "testing/status_matchers.h"

namespace zero {
namespace {

using ::testing::HasSubstr;
using zero::testing::SameBits;
using zero::testing::ScratchDir;
using zero::testing::SyntheticModel;
using zero::testing::SyntheticState;

constexpr int kCrashExit = 42;

// The synthetic state, made distinct per `version` (every value and counter differs).
FullState StateV(int version, int world) {
  FullState full = SyntheticState(SyntheticModel(), world);
  full.meta.global_steps = 100 + version;
  for (FullParam& p : full.params) {
    for (float& v : p.master) v += 100000.0f * static_cast<float>(version);
    for (float& v : p.exp_avg) v -= 100000.0f * static_cast<float>(version);
    for (float& v : p.exp_avg_sq) v += 50000.0f * static_cast<float>(version);
  }
  return full;
}

CheckpointMeta MetaFor(const FullState& full, int world) {
  CheckpointMeta meta = full.meta;
  meta.dp_world_size = world;
  meta.params.clear();
  for (const FullParam& p : full.params) {
    meta.params.push_back(MakeCheckpointParam(p.name, p.shape, p.module, world));
  }
  return meta;
}

// Runs `body` in a child process and returns its exit status (or 128 + signal).
template <typename Body>
int InChild(Body body) {
  fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) ::_exit(body());
  int status = 0;
  EXPECT_EQ(::waitpid(pid, &status, 0), pid);
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

// Whether the child's file system can exchange two paths (false: the save's two-rename fallback).
enum class Exchange { kSupported, kOff };

// A collective save of `full` at `world` thread ranks in a child; crashes at `point` on `rank`
// when point is set. Returns the child's exit status: 0 saved, kCrashExit crashed there.
int SaveInChild(const std::string& dir, const std::string& tag, const FullState& full, int world,
                const char* point = nullptr, int rank = 0, Exchange exchange = Exchange::kSupported) {
  return InChild([&]() -> int {
    FaultyFileSystem fs;
    if (point != nullptr) fs.ExitAtCrashPoint(point, rank, kCrashExit);
    fs.SetExchangeSupported(exchange == Exchange::kSupported);
    Status st = RunThreadRanks(world, [&](int r, Communicator* comm, Device*) {
      return SaveCheckpoint(comm, dir, tag, MetaFor(full, world), ShardFor(full, r, world), &fs);
    });
    if (!st.ok()) std::fprintf(stderr, "save in child: %s\n", st.ToString().c_str());
    return st.ok() ? 0 : 1;
  });
}

// The collective load of `latest` at `world` ranks in a child, compared bitwise with `want`'s
// shards: 0 equal, 1 load failed, 2 different.
int LoadLatestInChild(const std::string& dir, const FullState& want, int world) {
  return InChild([&]() -> int {
    int differ = 0;
    Status st = RunThreadRanks(world, [&](int r, Communicator* comm, Device*) -> Status {
      ZERO_ASSIGN_OR_RETURN(LoadedCheckpoint got, LoadCheckpoint(comm, dir, "", SyntheticModel(), true));
      std::vector<ParamShard> expect = ShardFor(want, r, world);
      bool same = got.meta.global_steps == want.meta.global_steps && got.shards.size() == expect.size();
      for (size_t i = 0; same && i < expect.size(); ++i) {
        same = got.shards[i].begin == expect[i].begin && SameBits(got.shards[i].master, expect[i].master) &&
               SameBits(got.shards[i].exp_avg, expect[i].exp_avg) &&
               SameBits(got.shards[i].exp_avg_sq, expect[i].exp_avg_sq);
      }
      if (!same) differ = 1;
      return OkStatus();
    });
    if (!st.ok()) std::fprintf(stderr, "load in child: %s\n", st.ToString().c_str());
    return !st.ok() ? 1 : differ ? 2 : 0;
  });
}

// Bitwise equality of the full state at dir/tag with `want` (the parent's own read, no threads).
void ExpectTagHolds(const std::string& dir, const std::string& tag, const FullState& want) {
  SCOPED_TRACE("tag " + tag);
  auto got = LoadFullState(dir, tag);
  ASSERT_OK(got);
  EXPECT_EQ(got->meta.global_steps, want.meta.global_steps);
  ASSERT_EQ(got->params.size(), want.params.size());
  for (size_t i = 0; i < want.params.size(); ++i) {
    EXPECT_TRUE(SameBits(got->params[i].master, want.params[i].master)) << want.params[i].name;
    EXPECT_TRUE(SameBits(got->params[i].exp_avg, want.params[i].exp_avg)) << want.params[i].name;
    EXPECT_TRUE(SameBits(got->params[i].exp_avg_sq, want.params[i].exp_avg_sq)) << want.params[i].name;
  }
}

std::vector<std::string> StagingDirs(const std::string& dir) {
  std::vector<std::string> out;
  auto names = ListDirectory(dir);
  EXPECT_OK(names);
  if (!names.ok()) return out;
  for (const std::string& n : *names) {
    if (n.rfind(kStagingPrefix, 0) == 0) out.push_back(n);
  }
  return out;
}

// --- every phase, every kind of tag, world 1 and 2 ------------------------------------------------

enum class TagKind { kNew, kOverwriteLatest, kOverwriteOther };

struct Phase {
  const char* point;
  int rank;      // -1: the last rank
  bool swapped;  // the new copy is in <dir>/<tag> after a crash here
  bool latest;   // `latest` names the new tag after a crash here
};

constexpr Phase kPhases[] = {
    {"writing_rank_file", 0, false, false},
    {"writing_rank_file", -1, false, false},
    {"rank_files_written", 0, false, false},
    {"metadata_written", 0, false, false},
    {"swapped", 0, true, false},
    {"latest_written", 0, true, true},
};

class CrashAtEveryPhaseTest : public ::testing::TestWithParam<std::tuple<int, TagKind, int>> {};

TEST_P(CrashAtEveryPhaseTest, LatestNamesTheLastGoodCheckpoint) {
  const auto [world, kind, phase_index] = GetParam();
  const Phase& phase = kPhases[phase_index];
  const int crash_rank = phase.rank < 0 ? world - 1 : phase.rank;
  const std::string dir = ScratchDir("crash");
  const FullState old_state = StateV(1, world), other = StateV(2, world), new_state = StateV(3, world);

  // Before: "t" holds old_state; for kOverwriteOther, "other" is newer and `latest` names it.
  ASSERT_EQ(SaveInChild(dir, "t", old_state, world), 0);
  if (kind == TagKind::kOverwriteOther) {
    ASSERT_EQ(SaveInChild(dir, "other", other, world), 0);
  }
  const std::string latest_before = kind == TagKind::kOverwriteOther ? "other" : "t";
  const FullState& latest_state_before = kind == TagKind::kOverwriteOther ? other : old_state;
  const std::string tag = kind == TagKind::kNew ? "t_new" : "t";

  ASSERT_EQ(SaveInChild(dir, tag, new_state, world, phase.point, crash_rank), kCrashExit)
      << "the save did not reach crash point " << phase.point << " on rank " << crash_rank;

  // `latest` names a complete checkpoint: the last good one.
  auto latest = ReadLatest(dir);
  ASSERT_OK(latest);
  const bool switched = phase.latest || (phase.swapped && kind == TagKind::kOverwriteLatest);
  EXPECT_EQ(*latest, phase.latest ? tag : latest_before);
  const FullState& want = switched ? new_state : latest_state_before;
  ExpectTagHolds(dir, *latest, want);
  EXPECT_EQ(LoadLatestInChild(dir, want, world), 0) << "collective load of latest";
  // The old copy of an overwritten tag is intact until the swap, the new one complete after it.
  if (kind != TagKind::kNew) {
    ExpectTagHolds(dir, "t", phase.swapped ? new_state : old_state);
  }
  if (kind == TagKind::kOverwriteOther) ExpectTagHolds(dir, "other", other);
  if (kind == TagKind::kNew) {
    if (phase.swapped) {
      ExpectTagHolds(dir, "t_new", new_state);
    } else {
      EXPECT_FALSE(PathExists(dir + "/t_new"));
    }
  }
  // The crash left its staging directory; load ignored it; the next save removes it.
  EXPECT_EQ(StagingDirs(dir).size(), 1u);
  const FullState next = StateV(4, world);
  ASSERT_EQ(SaveInChild(dir, "t_next", next, world), 0);
  EXPECT_THAT(StagingDirs(dir), ::testing::IsEmpty());
  EXPECT_EQ(*ReadLatest(dir), "t_next");
  ExpectTagHolds(dir, "t_next", next);
  ExpectTagHolds(dir, "t", (kind != TagKind::kNew && phase.swapped) ? new_state : old_state);
}

std::string PhaseName(const ::testing::TestParamInfo<std::tuple<int, TagKind, int>>& info) {
  const auto [world, kind, phase_index] = info.param;
  const Phase& p = kPhases[phase_index];
  const char* k = kind == TagKind::kNew               ? "NewTag"
                  : kind == TagKind::kOverwriteLatest ? "OverwriteLatestTag"
                                                      : "OverwriteOtherTag";
  std::string point;
  for (const char* c = p.point; *c; ++c) point += *c == '_' ? "" : std::string(1, *c);
  return "World" + std::to_string(world) + "_" + k + "_" + point + (p.rank < 0 ? "LastRank" : "Rank0");
}

INSTANTIATE_TEST_SUITE_P(AllPhases, CrashAtEveryPhaseTest,
                         ::testing::Combine(::testing::Values(1, 2),
                                            ::testing::Values(TagKind::kNew, TagKind::kOverwriteLatest,
                                                              TagKind::kOverwriteOther),
                                            ::testing::Range(0, 6)),
                         PhaseName);

// --- the two-rename fallback (filesystems without RENAME_EXCHANGE) ------------------------------

class FallbackSwapTest : public ::testing::TestWithParam<int> {
 protected:
  // A save on a file system without RENAME_EXCHANGE.
  static int Save(const std::string& dir, const std::string& tag, const FullState& full, int world,
                  const char* point = nullptr) {
    return SaveInChild(dir, tag, full, world, point, 0, Exchange::kOff);
  }
};

TEST_P(FallbackSwapTest, CrashBetweenTheRenamesKeepsTheOldCopyAndTheNextSaveRestoresIt) {
  const int world = GetParam();
  const std::string dir = ScratchDir("fallback");
  const FullState old_state = StateV(1, world), new_state = StateV(3, world);
  ASSERT_EQ(Save(dir, "t", old_state, world), 0);
  // A complete overwrite through the fallback works.
  ASSERT_EQ(Save(dir, "t", new_state, world), 0);
  ExpectTagHolds(dir, "t", new_state);
  EXPECT_THAT(StagingDirs(dir), ::testing::IsEmpty());

  ASSERT_EQ(Save(dir, "t", old_state, world, "fallback_old_moved_away"), kCrashExit);
  // <dir>/t is gone for the moment; load says where the intact previous copy is.
  EXPECT_FALSE(PathExists(dir + "/t"));
  auto latest = ReadLatest(dir);
  EXPECT_EQ(latest.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(latest.status().message(), HasSubstr("the previous copy is intact at " + dir + "/" + kStagingPrefix));
  EXPECT_THAT(latest.status().message(), HasSubstr("the next SaveCheckpoint"));
  ASSERT_EQ(StagingDirs(dir).size(), 1u);
  ExpectTagHolds(dir + "/" + StagingDirs(dir)[0], "previous", new_state);

  // The next save (another tag) puts it back, then saves.
  const FullState next = StateV(4, world);
  ASSERT_EQ(Save(dir, "u", next, world), 0);
  EXPECT_THAT(StagingDirs(dir), ::testing::IsEmpty());
  ExpectTagHolds(dir, "t", new_state);
  ExpectTagHolds(dir, "u", next);
  EXPECT_EQ(*ReadLatest(dir), "u");
}

INSTANTIATE_TEST_SUITE_P(Worlds, FallbackSwapTest, ::testing::Values(1, 2));

// The exchange the swap relies on works on the test's filesystem (else the fallback above is the
// path every overwrite takes there, and this says so).
TEST(ExchangeTest, ExchangeSwapsTwoDirectories) {
  const std::string dir = ScratchDir("exchange");
  ASSERT_OK(CreateDirectories(dir + "/a"));
  ASSERT_OK(CreateDirectories(dir + "/b"));
  ASSERT_OK(WriteFileAtomic(dir + "/a/f", "A"));
  ASSERT_OK(WriteFileAtomic(dir + "/b/f", "B"));
  Status st = ExchangePaths(dir + "/a", dir + "/b");
  if (st.code() == StatusCode::kUnimplemented) {
    GTEST_SKIP() << "no RENAME_EXCHANGE on this filesystem, saves use the fallback: " << st.ToString();
  }
  ASSERT_OK(st);
  EXPECT_EQ(*ReadFile(dir + "/a/f"), "B");
  EXPECT_EQ(*ReadFile(dir + "/b/f"), "A");
  EXPECT_THAT(ExchangePaths(dir + "/a", dir + "/missing").message(), HasSubstr(dir + "/missing"));
}

// --- stale staging directories --------------------------------------------------------------------

TEST(StagingTest, LoadIgnoresStagingDirectoriesAndTheyAreNotTags) {
  const std::string dir = ScratchDir("stale");
  const FullState state = StateV(1, 1);
  ASSERT_EQ(SaveInChild(dir, "t", state, 1), 0);
  ASSERT_EQ(SaveInChild(dir, "t", StateV(2, 1), 1, "metadata_written"), kCrashExit);
  ASSERT_EQ(StagingDirs(dir).size(), 1u);
  const std::string staging = StagingDirs(dir)[0];
  EXPECT_EQ(*ReadLatest(dir), "t");
  ExpectTagHolds(dir, "t", state);
  EXPECT_THAT(ResolveTag(dir, staging).status().message(), HasSubstr("staging directories"));
  auto done = CleanStaleSaves(dir);
  ASSERT_OK(done);
  EXPECT_EQ(*done, std::vector<std::string>{"removed " + dir + "/" + staging});
  EXPECT_THAT(StagingDirs(dir), ::testing::IsEmpty());
  ExpectTagHolds(dir, "t", state);
}

}  // namespace
}  // namespace zero
