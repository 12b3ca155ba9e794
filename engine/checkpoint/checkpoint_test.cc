// SaveCheckpoint/LoadCheckpoint as collectives over real communicators (Gloo, ranks as threads).
#include "engine/checkpoint/checkpoint.h"

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <vector>

#include "comm/thread_ranks.h"
#include "engine/checkpoint/io.h"
#include "engine/checkpoint/test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/status_matchers.h"

namespace zero {
namespace {

using ::testing::HasSubstr;
using zero::testing::SameBits;
using zero::testing::ScratchDir;
using zero::testing::SyntheticModel;
using zero::testing::SyntheticState;

CheckpointMeta MetaFor(const FullState& full, int world) {
  CheckpointMeta meta = full.meta;
  meta.dp_world_size = world;
  meta.params.clear();
  for (const FullParam& p : full.params) {
    meta.params.push_back(MakeCheckpointParam(p.name, p.shape, p.module, world));
  }
  return meta;
}

Status SaveAll(const std::string& dir, const std::string& tag, const FullState& full, int world) {
  return RunThreadRanks(world, [&](int rank, Communicator* comm, Device*) {
    return SaveCheckpoint(comm, dir, tag, MetaFor(full, world), ShardFor(full, rank, world));
  });
}

CommOptions ShortTimeout() {
  CommOptions o;
  o.timeout = std::chrono::milliseconds(2000);
  return o;
}

TEST(CollectiveCheckpointTest, SaveAtThreeLoadAtTwoAndFull) {
  const std::string dir = ScratchDir("coll");
  FullState full = SyntheticState(SyntheticModel(), 3);
  Status st = SaveAll(dir, "global_step120", full, 3);
  ASSERT_OK(st);
  EXPECT_EQ(*ReadLatest(dir), "global_step120");

  std::vector<ParamSignature> model = SyntheticModel();
  st = RunThreadRanks(2, [&](int rank, Communicator* comm, Device*) -> Status {
    ZERO_ASSIGN_OR_RETURN(LoadedCheckpoint loaded, LoadCheckpoint(comm, dir, "", model, true));
    EXPECT_EQ(loaded.meta.dp_world_size, 3);
    EXPECT_EQ(loaded.meta.global_steps, 120);
    std::vector<ParamShard> want = ShardFor(full, rank, 2);
    EXPECT_EQ(loaded.shards.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_EQ(loaded.shards[i].begin, want[i].begin) << want[i].name;
      EXPECT_TRUE(SameBits(loaded.shards[i].master, want[i].master)) << want[i].name;
      EXPECT_TRUE(SameBits(loaded.shards[i].exp_avg_sq, want[i].exp_avg_sq)) << want[i].name;
    }
    return OkStatus();
  });
  ASSERT_OK(st);

  // Stage 0 style: full tensors on every rank.
  st = RunThreadRanks(2, [&](int rank, Communicator* comm, Device*) -> Status {
    ZERO_ASSIGN_OR_RETURN(LoadedCheckpoint loaded, LoadCheckpoint(comm, dir, "global_step120", model, false));
    for (size_t i = 0; i < full.params.size(); ++i) {
      EXPECT_EQ(loaded.shards[i].begin, 0);
      EXPECT_EQ(loaded.shards[i].end, full.params[i].numel);
      EXPECT_TRUE(SameBits(loaded.shards[i].master, full.params[i].master));
    }
    return OkStatus();
  });
  ASSERT_OK(st);
}

TEST(CollectiveCheckpointTest, Stage0SlicesOfFullStateSaveTheSameBytes) {
  FullState full = SyntheticState(SyntheticModel(), 2);
  for (int r = 0; r < 2; ++r) {
    std::vector<ParamShard> want = ShardFor(full, r, 2);
    for (size_t i = 0; i < full.params.size(); ++i) {
      const FullParam& p = full.params[i];
      ParamShard s =
          SliceFullParam(p.name, p.shape, p.module, p.master.data(), p.exp_avg.data(), p.exp_avg_sq.data(), r, 2);
      EXPECT_EQ(s.begin, want[i].begin);
      EXPECT_EQ(s.end, want[i].end);
      EXPECT_TRUE(SameBits(s.master, want[i].master));
      EXPECT_TRUE(SameBits(s.exp_avg, want[i].exp_avg));
      EXPECT_TRUE(SameBits(s.exp_avg_sq, want[i].exp_avg_sq));
    }
  }
}

// A second job saving into the same directory (issue 23): it used to remove the first job's staging
// directory (as an interrupted save's) and fail with an unexplained rename error. The directory is
// locked by the job saving into it; here a fork()ed child plays the first job.
TEST(CollectiveCheckpointTest, SecondJobSavingIntoTheSameDirectoryIsRefused) {
  const std::string dir = ScratchDir("two_jobs");
  FullState full = SyntheticState(SyntheticModel(), 2);
  ASSERT_OK(SaveAll(dir, "first", full, 2));
  testing::ChildHoldingLock other;
  ASSERT_NO_FATAL_FAILURE(other.Start(dir));
  const Status st = SaveAll(dir, "second", full, 2);
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition) << st.ToString();
  EXPECT_THAT(st.message(), HasSubstr("checkpoint directory " + dir + " is in use by another job (pid " +
                                      std::to_string(other.pid) + " on host "));
  EXPECT_THAT(st.message(), HasSubstr("nothing was written; `latest` is unchanged"));
  EXPECT_FALSE(PathExists(dir + "/second"));
  EXPECT_EQ(*ReadLatest(dir), "first");
  ASSERT_NO_FATAL_FAILURE(other.Release());
  // The other job gone, however it ended, the directory is free again.
  EXPECT_OK(SaveAll(dir, "second", full, 2));
  EXPECT_EQ(*ReadLatest(dir), "second");
}

TEST(CollectiveCheckpointTest, SaveOnRank0OnlyTimesOutWithAClearMessage) {
  const std::string dir = ScratchDir("rank0only");
  FullState full = SyntheticState(SyntheticModel(), 2);
  ASSERT_OK(SaveAll(dir, "good", full, 2));
  Status st = RunThreadRanks(
      2,
      [&](int rank, Communicator* comm, Device*) -> Status {
        if (rank != 0) return OkStatus();  // the user's `if rank == 0: save()`
        return SaveCheckpoint(comm, dir, "bad", MetaFor(full, 2), ShardFor(full, 0, 2));
      },
      ShortTimeout());
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), StatusCode::kDeadlineExceeded);
  EXPECT_THAT(st.message(), HasSubstr("not every rank joined the save"));
  EXPECT_THAT(st.message(), HasSubstr("calling it on rank 0 only is a common mistake"));
  EXPECT_EQ(*ReadLatest(dir), "good");
  EXPECT_FALSE(PathExists(dir + "/bad"));
}

TEST(CollectiveCheckpointTest, DisagreementAndFailedWritesFailEveryRank) {
  const std::string dir = ScratchDir("disagree");
  FullState full = SyntheticState(SyntheticModel(), 2);
  ASSERT_OK(SaveAll(dir, "good", full, 2));

  std::vector<Status> results(2);
  Status st = RunThreadRanks(2, [&](int rank, Communicator* comm, Device*) -> Status {
    results[rank] = SaveCheckpoint(comm, dir, rank == 0 ? "a" : "b", MetaFor(full, 2), ShardFor(full, rank, 2));
    return OkStatus();
  });
  ASSERT_OK(st);
  for (const Status& r : results) {
    EXPECT_EQ(r.code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(r.message(), HasSubstr("different tags or parameter tables"));
  }

  // Rank 1's shards are malformed: its write fails, rank 0 learns it, latest stays.
  st = RunThreadRanks(2, [&](int rank, Communicator* comm, Device*) -> Status {
    std::vector<ParamShard> shards = ShardFor(full, rank, 2);
    if (rank == 1) shards[0].master.pop_back();
    results[rank] = SaveCheckpoint(comm, dir, "broken", MetaFor(full, 2), shards);
    return OkStatus();
  });
  ASSERT_OK(st);
  EXPECT_THAT(results[0].message(), HasSubstr("writing failed on rank(s) 1"));
  // Nothing was lost (issue 23: the healthy rank said DATA_LOSS, as for a corrupt checkpoint).
  EXPECT_EQ(results[0].code(), StatusCode::kUnavailable) << results[0].ToString();
  EXPECT_THAT(results[0].message(), HasSubstr("nothing was lost: the previous checkpoints and `latest` are unchanged"));
  EXPECT_THAT(results[1].message(), HasSubstr("'embed.weight'"));
  EXPECT_EQ(*ReadLatest(dir), "good");

  // Load with a model that does not match: every rank fails, the reason is in each message.
  std::vector<ParamSignature> model = SyntheticModel();
  model[0].shape = {5, 7};
  st = RunThreadRanks(2, [&](int rank, Communicator* comm, Device*) -> Status {
    auto r = LoadCheckpoint(comm, dir, "", model, true);
    results[rank] = r.status();
    return OkStatus();
  });
  ASSERT_OK(st);
  for (const Status& r : results) {
    EXPECT_THAT(r.message(), HasSubstr("parameter 'embed.weight': checkpoint shape [7, 5], model shape [5, 7]"));
  }
}

}  // namespace
}  // namespace zero
