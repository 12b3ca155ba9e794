#include "engine/checkpoint/format.h"

#include <sys/stat.h>

#include <algorithm>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "engine/checkpoint/io.h"
#include "engine/checkpoint/test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/crc32c.h"
#include "testing/status_matchers.h"

namespace zero {
namespace {

using ::testing::HasSubstr;
using zero::testing::InChild;
using zero::testing::SameBits;
using zero::testing::SaveSynthetic;
using zero::testing::ScratchDir;
using zero::testing::SyntheticModel;
using zero::testing::SyntheticState;

std::string Slurp(const std::string& path) { return *ReadFile(path); }
void Spit(const std::string& path, const std::string& data) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << data;
}

void ExpectShardsEqual(const std::vector<ParamShard>& got, const std::vector<ParamShard>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    SCOPED_TRACE(want[i].name);
    EXPECT_EQ(got[i].name, want[i].name);
    EXPECT_EQ(got[i].shape, want[i].shape);
    EXPECT_EQ(got[i].module, want[i].module);
    EXPECT_EQ(got[i].numel, want[i].numel);
    EXPECT_EQ(got[i].begin, want[i].begin);
    EXPECT_EQ(got[i].end, want[i].end);
    EXPECT_TRUE(SameBits(got[i].master, want[i].master));
    EXPECT_TRUE(SameBits(got[i].exp_avg, want[i].exp_avg));
    EXPECT_TRUE(SameBits(got[i].exp_avg_sq, want[i].exp_avg_sq));
  }
}

void ExpectFullEqual(const FullState& got, const FullState& want) {
  ASSERT_EQ(got.params.size(), want.params.size());
  for (size_t i = 0; i < got.params.size(); ++i) {
    SCOPED_TRACE(want.params[i].name);
    EXPECT_EQ(got.params[i].name, want.params[i].name);
    EXPECT_EQ(got.params[i].shape, want.params[i].shape);
    EXPECT_EQ(got.params[i].module, want.params[i].module);
    EXPECT_EQ(got.params[i].numel, want.params[i].numel);
    EXPECT_TRUE(SameBits(got.params[i].master, want.params[i].master));
    EXPECT_TRUE(SameBits(got.params[i].exp_avg, want.params[i].exp_avg));
    EXPECT_TRUE(SameBits(got.params[i].exp_avg_sq, want.params[i].exp_avg_sq));
  }
}

// --- partition math --------------------------------------------------------------------------

TEST(PartitionTest, PaddingAndRanges) {
  EXPECT_EQ(PaddedNumel(35, 2), 36);
  EXPECT_EQ(PaddedNumel(35, 3), 36);
  EXPECT_EQ(PaddedNumel(35, 4), 36);
  EXPECT_EQ(PaddedNumel(143, 4), 144);
  EXPECT_EQ(PaddedNumel(0, 3), 0);
  EXPECT_EQ(PaddedNumel(1, 3), 3);
  int64_t pos = 0;
  for (int r = 0; r < 4; ++r) {
    ElementRange range = PartitionRange(143, r, 4);
    EXPECT_EQ(range.begin, pos);
    EXPECT_EQ(range.end - range.begin, 36);
    pos = range.end;
  }
  EXPECT_EQ(pos, 144);
  EXPECT_EQ(PartitionRange(1, 2, 3).begin, 2);
  EXPECT_EQ(PartitionRange(1, 2, 3).end, 3);
}

TEST(PartitionTest, ShardForSlicesWithZeroPadding) {
  FullState full = SyntheticState(SyntheticModel(), 3);
  for (int world : {1, 2, 3, 4, 5}) {
    for (int r = 0; r < world; ++r) {
      std::vector<ParamShard> shards = ShardFor(full, r, world);
      ASSERT_EQ(shards.size(), full.params.size());
      for (size_t i = 0; i < shards.size(); ++i) {
        const FullParam& f = full.params[i];
        const int64_t n_pad = (f.numel + world - 1) / world * world;
        const ParamShard& s = shards[i];
        EXPECT_EQ(s.begin, r * n_pad / world);
        EXPECT_EQ(s.end, (r + 1) * n_pad / world);
        for (int64_t e = s.begin; e < s.end; ++e) {
          float want = e < f.numel ? f.master[e] : 0.0f;
          ASSERT_EQ(s.master[e - s.begin], want) << f.name << " world " << world << " e " << e;
          ASSERT_EQ(s.exp_avg_sq[e - s.begin], e < f.numel ? f.exp_avg_sq[e] : 0.0f);
        }
      }
    }
  }
}

TEST(TagTest, Validation) {
  EXPECT_OK(ValidateTag("global_step100"));
  EXPECT_OK(ValidateTag("run-3.v2"));
  EXPECT_FALSE(ValidateTag("").ok());
  EXPECT_FALSE(ValidateTag(".").ok());
  EXPECT_FALSE(ValidateTag("..").ok());
  EXPECT_FALSE(ValidateTag("a/b").ok());
  EXPECT_FALSE(ValidateTag("a b").ok());
  EXPECT_FALSE(ValidateTag("a\n").ok());
  EXPECT_FALSE(ValidateTag(std::string(256, 'x')).ok());
  EXPECT_THAT(ValidateTag(".zero_save.1.ab").message(), HasSubstr("staging directories"));
  EXPECT_OK(ValidateTag(".zero_other"));
  EXPECT_EQ(DefaultTag(100), "global_step100");
  EXPECT_EQ(RankFileName(3), "zero_rank_3_optim_states.bin");
}

// --- round trips --------------------------------------------------------------------------------

TEST(CheckpointTest, RankFilesAndMetadataRoundTrip) {
  const std::string dir = ScratchDir("ckpt");
  FullState full = SyntheticState(SyntheticModel(), 3);
  SaveSynthetic(dir, "global_step120", full, 3);

  EXPECT_EQ(Slurp(dir + "/latest"), "global_step120");
  auto tag = ReadLatest(dir);
  ASSERT_OK(tag);
  EXPECT_EQ(*tag, "global_step120");
  EXPECT_EQ(*ResolveTag(dir, ""), "global_step120");
  EXPECT_EQ(*ResolveTag(dir, "other"), "other");

  auto meta = ReadMetadata(dir, *tag);
  ASSERT_OK(meta);
  const CheckpointMeta& want = full.meta;
  EXPECT_EQ(meta->format_version, kCheckpointFormatVersion);
  EXPECT_EQ(meta->zero_version, kZeroVersion);
  EXPECT_EQ(meta->tag, "global_step120");
  EXPECT_EQ(meta->global_steps, want.global_steps);
  EXPECT_EQ(meta->skipped_steps, want.skipped_steps);
  EXPECT_EQ(meta->micro_steps, want.micro_steps);
  EXPECT_EQ(meta->adam_step, want.adam_step);
  EXPECT_EQ(meta->loss_scaler.dynamic, want.loss_scaler.dynamic);
  EXPECT_EQ(meta->loss_scaler.scale, want.loss_scaler.scale);
  EXPECT_EQ(meta->loss_scaler.good_steps, want.loss_scaler.good_steps);
  EXPECT_EQ(meta->loss_scaler.hysteresis, want.loss_scaler.hysteresis);
  EXPECT_EQ(meta->loss_scaler.last_overflow_step, want.loss_scaler.last_overflow_step);
  EXPECT_EQ(meta->scheduler.type, want.scheduler.type);
  EXPECT_EQ(meta->scheduler.last_step, want.scheduler.last_step);
  EXPECT_EQ(meta->scheduler.last_lr, want.scheduler.last_lr);  // exact: shortest round-trip print
  EXPECT_EQ(meta->model_dtype, DType::kBF16);
  EXPECT_EQ(meta->zero_stage, 2);
  EXPECT_EQ(meta->dp_world_size, 3);
  EXPECT_EQ(meta->config_json, want.config_json);
  EXPECT_EQ(meta->client_state_json, want.client_state_json);
  ASSERT_EQ(meta->params.size(), want.params.size());
  for (size_t i = 0; i < meta->params.size(); ++i) {
    EXPECT_EQ(meta->params[i].name, want.params[i].name);
    EXPECT_EQ(meta->params[i].shape, want.params[i].shape);
    EXPECT_EQ(meta->params[i].module, want.params[i].module);
    EXPECT_EQ(meta->params[i].numel, want.params[i].numel);
    EXPECT_EQ(meta->params[i].n_pad, PaddedNumel(want.params[i].numel, 3));
  }
  ASSERT_EQ(meta->rank_files.size(), 3u);
  for (int r = 0; r < 3; ++r) {
    const std::string path = dir + "/global_step120/" + RankFileName(r);
    const std::string bytes = Slurp(path);
    EXPECT_EQ(meta->rank_files[r].file, RankFileName(r));
    EXPECT_EQ(meta->rank_files[r].bytes, bytes.size());
    EXPECT_EQ(meta->rank_files[r].crc32c, Crc32c(bytes.data(), bytes.size() - 8));
    auto shards = ReadRankFile(dir, *tag, r, *meta);
    ASSERT_OK(shards);
    ExpectShardsEqual(*shards, ShardFor(full, r, 3));
    auto info = ReadRankFileInfo(dir, *tag, r, 3);
    ASSERT_OK(info);
    EXPECT_EQ(*info, meta->rank_files[r]);
  }
  // Distinct files, distinct checksums (a CRC over data plus its own CRC would be one constant).
  EXPECT_NE(meta->rank_files[0].crc32c, meta->rank_files[1].crc32c);
  EXPECT_NE(meta->rank_files[1].crc32c, meta->rank_files[2].crc32c);
  // Only the files of the layout, no temporaries.
  for (const char* name : {"metadata.json", "zero_rank_0_optim_states.bin"}) {
    EXPECT_TRUE(PathExists(dir + "/global_step120/" + name)) << name;
  }
}

TEST(CheckpointTest, WriteRankFileChecksShards) {
  const std::string dir = ScratchDir("ckpt");
  FullState full = SyntheticState(SyntheticModel(), 2);
  std::vector<ParamShard> shards = ShardFor(full, 0, 2);
  shards[1].exp_avg.pop_back();
  auto r = WriteRankFile(dir, "t", 0, 2, shards);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("'block0.fc.weight'"));
  EXPECT_THAT(r.status().message(), HasSubstr("exp_avg 71"));

  shards = ShardFor(full, 0, 2);
  shards[0].end = 40;  // past n_pad 36
  shards[0].master.resize(40);
  shards[0].exp_avg.resize(40);
  shards[0].exp_avg_sq.resize(40);
  EXPECT_THAT(WriteRankFile(dir, "t", 0, 2, shards).status().message(),
              HasSubstr("'embed.weight': range [0, 40) is outside the padded parameter [0, 36)"));

  shards = ShardFor(full, 0, 2);
  shards[2].numel = 12;
  EXPECT_THAT(WriteRankFile(dir, "t", 0, 2, shards).status().message(),
              HasSubstr("'block0.fc.bias': numel 12 is not the product of shape [11]"));
  EXPECT_FALSE(WriteRankFile(dir, "t", 2, 2, ShardFor(full, 0, 2)).ok());
  EXPECT_FALSE(WriteRankFile(dir, "bad/tag", 0, 2, ShardFor(full, 0, 2)).ok());
}

TEST(CheckpointTest, WriteMetadataRefusesBadParamTables) {
  const std::string dir = ScratchDir("ckpt");
  CheckpointMeta m = SyntheticState(SyntheticModel(), 2).meta;
  m.tag = "t";
  m.rank_files.resize(2);
  m.params[0] = MakeCheckpointParam("x", {-1, 3}, "m", 2);
  EXPECT_THAT(WriteMetadata(dir, "t", m).message(), HasSubstr("parameter 'x': shape [-1, 3]"));
  m.params[0] = m.params[1];
  EXPECT_THAT(WriteMetadata(dir, "t", m).message(), HasSubstr("appears twice"));
  m = SyntheticState(SyntheticModel(), 2).meta;
  m.tag = "t";
  m.rank_files.resize(3);
  EXPECT_THAT(WriteMetadata(dir, "t", m).message(), HasSubstr("dp world size 2 but 3 rank files"));
  m.rank_files.resize(2);
  m.config_json = "{not json";
  EXPECT_THAT(WriteMetadata(dir, "t", m).message(), HasSubstr("config_json: not valid JSON"));
}

// --- repartitioning -----------------------------------------------------------------------------

struct Reshard {
  int old_world, new_world;
};

class RepartitionTest : public ::testing::TestWithParam<Reshard> {};

TEST_P(RepartitionTest, FullStateAndNewShardsAreExact) {
  const Reshard p = GetParam();
  const std::string dir = ScratchDir("reshard");
  FullState full = SyntheticState(SyntheticModel(), p.old_world);
  SaveSynthetic(dir, "step", full, p.old_world);

  auto loaded = LoadFullState(dir, "step");
  ASSERT_OK(loaded);
  ExpectFullEqual(*loaded, full);
  EXPECT_EQ(loaded->meta.dp_world_size, p.old_world);

  // The engine's path: the model registers parameters in its own order.
  std::vector<ParamSignature> model = SyntheticModel();
  std::reverse(model.begin(), model.end());
  for (int r = 0; r < p.new_world; ++r) {
    CheckpointMeta meta;
    auto shards = LoadShardsForRank(dir, "step", model, r, p.new_world, &meta);
    ASSERT_OK(shards);
    EXPECT_EQ(meta.global_steps, 120);
    std::vector<ParamShard> want = ShardFor(full, r, p.new_world);
    std::reverse(want.begin(), want.end());
    ExpectShardsEqual(*shards, want);
  }
  // Saving the new shards at the new world size and loading again gives the same full state.
  const std::string dir2 = ScratchDir("reshard2");
  SaveSynthetic(dir2, "again", *loaded, p.new_world);
  auto again = LoadFullState(dir2, "again");
  ASSERT_OK(again);
  ExpectFullEqual(*again, full);
}

INSTANTIATE_TEST_SUITE_P(Worlds, RepartitionTest,
                         ::testing::Values(Reshard{2, 3}, Reshard{4, 1}, Reshard{3, 2}, Reshard{1, 4}, Reshard{5, 5}),
                         [](const ::testing::TestParamInfo<Reshard>& info) {
                           return std::to_string(info.param.old_world) + "to" + std::to_string(info.param.new_world);
                         });

TEST(RepartitionTest, Stage0StyleRank0HoldsEverything) {
  // Any tiling of [0, numel) loads, e.g. rank 0 saving full tensors and rank 1 nothing.
  const std::string dir = ScratchDir("tiling");
  FullState full = SyntheticState(SyntheticModel(), 2);
  std::vector<ParamShard> all = ShardFor(full, 0, 1), none = ShardFor(full, 0, 1);
  for (ParamShard& s : none) {
    s.begin = s.end = 0;
    s.master.clear();
    s.exp_avg.clear();
    s.exp_avg_sq.clear();
  }
  ASSERT_OK(WriteRankFile(dir, "t", 0, 2, all));
  ASSERT_OK(WriteRankFile(dir, "t", 1, 2, none));
  CheckpointMeta meta = full.meta;
  ASSERT_OK(FinalizeCheckpoint(dir, "t", meta));
  auto loaded = LoadFullState(dir, "t");
  ASSERT_OK(loaded);
  ExpectFullEqual(*loaded, full);
}

TEST(RepartitionTest, GapsAndOverlapsNameTheParameter) {
  const std::string dir = ScratchDir("gaps");
  FullState full = SyntheticState(SyntheticModel(), 2);
  std::vector<ParamShard> r0 = ShardFor(full, 0, 2), r1 = ShardFor(full, 0, 2);
  // r1 repeats rank 0's range: elements [0, 18) of embed.weight twice, [18, 35) nowhere.
  ASSERT_OK(WriteRankFile(dir, "t", 0, 2, r0));
  ASSERT_OK(WriteRankFile(dir, "t", 1, 2, r1));
  ASSERT_OK(FinalizeCheckpoint(dir, "t", full.meta));
  auto loaded = LoadFullState(dir, "t");
  EXPECT_EQ(loaded.status().code(), StatusCode::kDataLoss);
  EXPECT_THAT(loaded.status().message(),
              HasSubstr("parameter 'embed.weight': elements [0, 18) are in more than one rank file"));

  std::vector<ParamShard> empty = ShardFor(full, 1, 2);
  for (ParamShard& s : empty) {
    s.end = s.begin;
    s.master.clear();
    s.exp_avg.clear();
    s.exp_avg_sq.clear();
  }
  ASSERT_OK(WriteRankFile(dir, "t", 1, 2, empty));
  ASSERT_OK(FinalizeCheckpoint(dir, "t", full.meta));
  loaded = LoadFullState(dir, "t");
  EXPECT_THAT(loaded.status().message(), HasSubstr("parameter 'embed.weight': elements [18, 35) are in no rank file"));
}

// --- model mismatch -----------------------------------------------------------------------------

TEST(CheckpointTest, ModelMismatchNamesParametersAndShapes) {
  const std::string dir = ScratchDir("mismatch");
  FullState full = SyntheticState(SyntheticModel(), 2);
  SaveSynthetic(dir, "t", full, 2);
  std::vector<ParamSignature> model = SyntheticModel();
  model[1].shape = {13, 11};
  auto r = LoadShardsForRank(dir, "t", model, 0, 2);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(),
              HasSubstr("parameter 'block0.fc.weight': checkpoint shape [11, 13], model shape [13, 11]"));

  model = SyntheticModel();
  model[5].name = "head.w";
  r = LoadShardsForRank(dir, "t", model, 1, 2);
  EXPECT_THAT(r.status().message(), HasSubstr("2 differences"));
  EXPECT_THAT(r.status().message(), HasSubstr("parameter 'head.w' (model shape [3, 17]) is not in the checkpoint"));
  EXPECT_THAT(r.status().message(),
              HasSubstr("checkpoint parameter 'head.weight' (shape [3, 17]) is not registered by the model"));

  model = SyntheticModel();
  model.pop_back();
  EXPECT_FALSE(CheckModelMatches(full.meta, model).ok());
  model = SyntheticModel();
  EXPECT_OK(CheckModelMatches(full.meta, model));
  EXPECT_FALSE(LoadShardsForRank(dir, "t", model, 2, 2).ok());  // rank out of range
}

// --- atomicity
// ------------------------------------------------------------------------------------

TEST(CheckpointTest, CrashedSaveLeavesPreviousCheckpointLoadable) {
  const std::string dir = ScratchDir("crash");
  FullState first = SyntheticState(SyntheticModel(), 2);
  SaveSynthetic(dir, "global_step120", first, 2);

  // Save of global_step121 at world 2: rank 0 finished, rank 1 "crashed" mid-write.
  FullState second = first;
  second.meta.global_steps = 121;
  for (FullParam& p : second.params) {
    for (float& v : p.master) v += 1.0f;
  }
  ASSERT_OK(WriteRankFile(dir, "global_step121", 0, 2, ShardFor(second, 0, 2)));
  {
    auto w = AtomicFileWriter::Open(dir + "/global_step121/" + RankFileName(1));
    ASSERT_OK(w);
    ASSERT_OK(w->Append("partial rank 1 data"));
    w->AbandonForTest();
  }
  // A crashed rewrite of the old tag's metadata leaves a temporary next to it: harmless.
  {
    auto w = AtomicFileWriter::Open(dir + "/global_step120/metadata.json");
    ASSERT_OK(w);
    ASSERT_OK(w->Append("{\"format\": \"zero-chec"));
    w->AbandonForTest();
  }
  // Rank 0 finalizing now (without the barrier, as "save on rank 0 only" would) is refused.
  Status st = FinalizeCheckpoint(dir, "global_step121", second.meta);
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(st.message(), HasSubstr("dp world size 2 but no rank file for rank(s) 1"));
  EXPECT_THAT(st.message(), HasSubstr("zero_rank_1_optim_states.bin"));
  EXPECT_THAT(st.message(), HasSubstr("called on every rank"));

  EXPECT_EQ(*ReadLatest(dir), "global_step120");
  auto loaded = LoadFullState(dir, *ReadLatest(dir));
  ASSERT_OK(loaded);
  ExpectFullEqual(*loaded, first);
  auto incomplete = ReadMetadata(dir, "global_step121");
  EXPECT_EQ(incomplete.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(incomplete.status().message(), HasSubstr("did not complete"));

  // The save completes: only now does latest switch.
  ASSERT_OK(WriteRankFile(dir, "global_step121", 1, 2, ShardFor(second, 1, 2)));
  EXPECT_EQ(*ReadLatest(dir), "global_step120");
  ASSERT_OK(FinalizeCheckpoint(dir, "global_step121", second.meta));
  EXPECT_EQ(*ReadLatest(dir), "global_step121");
  loaded = LoadFullState(dir, "global_step121");
  ASSERT_OK(loaded);
  ExpectFullEqual(*loaded, second);
}

TEST(CheckpointTest, FinalizeChecksGatheredInfosAndStaleWorld) {
  const std::string dir = ScratchDir("finalize");
  FullState full = SyntheticState(SyntheticModel(), 2);
  std::vector<RankFileInfo> infos;
  for (int r = 0; r < 2; ++r) {
    auto info = WriteRankFile(dir, "t", r, 2, ShardFor(full, r, 2));
    ASSERT_OK(info);
    infos.push_back(*info);
  }
  CheckpointMeta meta = full.meta;
  meta.rank_files = infos;  // as an all-gather would deliver them
  ASSERT_OK(FinalizeCheckpoint(dir, "t", meta));
  meta.rank_files[1].crc32c ^= 1;
  Status st = FinalizeCheckpoint(dir, "t", meta);
  EXPECT_EQ(st.code(), StatusCode::kDataLoss);
  EXPECT_THAT(st.message(), HasSubstr("is not what rank 1 wrote"));

  // A file left by a save at world 3 under the same tag is not taken for world 2's.
  const std::string dir3 = ScratchDir("finalize3");
  FullState f3 = SyntheticState(SyntheticModel(), 3);
  ASSERT_OK(WriteRankFile(dir3, "t", 0, 2, ShardFor(full, 0, 2)));
  ASSERT_OK(WriteRankFile(dir3, "t", 1, 3, ShardFor(f3, 1, 3)));
  st = FinalizeCheckpoint(dir3, "t", full.meta);
  EXPECT_EQ(st.code(), StatusCode::kDataLoss);
  EXPECT_THAT(st.message(), HasSubstr("header says rank 1 of world 3, expected rank 1 of world 2"));
  EXPECT_FALSE(PathExists(dir3 + "/latest"));
}

// --- corruption
// -----------------------------------------------------------------------------------

class CorruptionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ScratchDir("corrupt");
    full_ = SyntheticState(SyntheticModel(), 3);
    SaveSynthetic(dir_, "t", full_, 3);
    path1_ = dir_ + "/t/" + RankFileName(1);
    meta_ = *ReadMetadata(dir_, "t");
  }
  std::string dir_, path1_;
  FullState full_;
  CheckpointMeta meta_;
};

TEST_F(CorruptionTest, FlippedByteIsAChecksumMismatchNamingTheFile) {
  std::string bytes = Slurp(path1_);
  const uint32_t want = Crc32c(bytes.data(), bytes.size() - 8);
  EXPECT_EQ(meta_.rank_files[1].crc32c, want);
  bytes[bytes.size() / 2] ^= 0x10;
  Spit(path1_, bytes);
  auto r = LoadFullState(dir_, "t");
  EXPECT_EQ(r.status().code(), StatusCode::kDataLoss);
  EXPECT_THAT(r.status().message(),
              HasSubstr("rank 1 file: " + path1_ + ": checksum mismatch: expected crc32c " + Crc32cHex(want) +
                        " (metadata.json), got " + Crc32cHex(Crc32c(bytes.data(), bytes.size() - 8))));
  EXPECT_FALSE(LoadShardsForRank(dir_, "t", SyntheticModel(), 0, 1).ok());
}

TEST_F(CorruptionTest, FlippedHeaderByteIsCaughtWithoutMetadataToo) {
  std::string bytes = Slurp(path1_);
  bytes[13] ^= 0x01;  // the rank field
  Spit(path1_, bytes);
  EXPECT_THAT(ReadRankFile(dir_, "t", 1, meta_).status().message(), HasSubstr("checksum mismatch"));
  auto info = ReadRankFileInfo(dir_, "t", 1, 3);
  EXPECT_EQ(info.status().code(), StatusCode::kDataLoss);
  EXPECT_THAT(info.status().message(), HasSubstr(path1_ + ": header checksum mismatch"));
}

TEST_F(CorruptionTest, TruncatedFileReportsBothSizes) {
  std::string bytes = Slurp(path1_);
  const size_t full_size = bytes.size();
  Spit(path1_, bytes.substr(0, full_size - 100));
  auto r = ReadRankFile(dir_, "t", 1, meta_);
  EXPECT_EQ(r.status().code(), StatusCode::kDataLoss);
  EXPECT_THAT(r.status().message(), HasSubstr(path1_ + ": truncated: expected " + std::to_string(full_size) +
                                              " bytes (metadata.json), got " + std::to_string(full_size - 100)));
  auto info = ReadRankFileInfo(dir_, "t", 1, 3);
  EXPECT_THAT(info.status().message(),
              HasSubstr("truncated: expected " + std::to_string(full_size) + " bytes (from its header)"));
}

TEST_F(CorruptionTest, MissingRankFileNamesItAndTheSavedWorldSize) {
  ASSERT_EQ(::unlink(path1_.c_str()), 0);
  auto r = LoadFullState(dir_, "t");
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(r.status().message(), HasSubstr("was saved with dp world size 3"));
  EXPECT_THAT(r.status().message(), HasSubstr("zero_rank_1_optim_states.bin is missing"));
  auto shards = LoadShardsForRank(dir_, "t", SyntheticModel(), 0, 2);
  EXPECT_THAT(shards.status().message(), HasSubstr("was saved with dp world size 3"));
}

TEST_F(CorruptionTest, RankFileSwappedWithAnotherRanksIsRefused) {
  // Same size is not enough: the metadata's checksum tells the files apart.
  Spit(path1_, Slurp(dir_ + "/t/" + RankFileName(2)));
  EXPECT_THAT(ReadRankFile(dir_, "t", 1, meta_).status().message(), HasSubstr("checksum mismatch"));
}

TEST_F(CorruptionTest, LatestNamingAMissingTag) {
  ASSERT_OK(WriteLatest(dir_, "ghost"));
  auto r = ReadLatest(dir_);
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(r.status().message(), HasSubstr(dir_ + "/latest names tag 'ghost'"));
  EXPECT_THAT(r.status().message(), HasSubstr(dir_ + "/ghost/metadata.json does not exist"));
  EXPECT_FALSE(ResolveTag(dir_, "").ok());
  Spit(dir_ + "/latest", "t\n");  // hand-written with a newline: accepted
  EXPECT_EQ(*ReadLatest(dir_), "t");
  ::unlink((dir_ + "/latest").c_str());
  EXPECT_THAT(ReadLatest(dir_).status().message(), HasSubstr("no checkpoint was completed"));
  EXPECT_THAT(ReadLatest(dir_ + "/nothere").status().message(), HasSubstr("does not exist"));
  EXPECT_THAT(ReadMetadata(dir_, "nope").status().message(), HasSubstr("checkpoint tag 'nope' does not exist"));
}

TEST_F(CorruptionTest, MetadataOfAnotherFormatVersion) {
  const std::string path = dir_ + "/t/metadata.json";
  std::string text = Slurp(path);
  const std::string key = "\"format_version\": 2";
  ASSERT_NE(text.find(key), std::string::npos) << text.substr(0, 200);
  text.replace(text.find(key), key.size(), "\"format_version\": 3");
  Spit(path, SealMetadataText(text));
  auto r = ReadMetadata(dir_, "t");
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(r.status().message(), HasSubstr("checkpoint format version 3"));
  EXPECT_THAT(r.status().message(), HasSubstr("reads format versions 1 to 2"));
}

TEST_F(CorruptionTest, MalformedMetadataNamesTheKey) {
  const std::string path = dir_ + "/t/metadata.json";
  std::string text = Slurp(path);
  const std::string key = "\"adam_step\": 117";
  ASSERT_NE(text.find(key), std::string::npos);
  std::string bad = text;
  bad.replace(bad.find(key), key.size(), "\"adam_step\": \"x\"");
  Spit(path, SealMetadataText(bad));
  EXPECT_THAT(ReadMetadata(dir_, "t").status().message(), HasSubstr("key 'adam_step' is missing or not an integer"));
  bad = text;
  const std::string numel = "\"numel\": 143";
  ASSERT_NE(bad.find(numel), std::string::npos);
  bad.replace(bad.find(numel), numel.size(), "\"numel\": 144");
  Spit(path, SealMetadataText(bad));
  EXPECT_THAT(ReadMetadata(dir_, "t").status().message(),
              HasSubstr("parameter 'block0.fc.weight': shape [11, 13], numel 144"));
}

// --- hostile files (issue 23): a clear error within seconds, never a hang or a crash
// -------------------------------------------------------------------------------------------

TEST_F(CorruptionTest, NamedPipesInPlaceOfCheckpointFilesAreRefusedNamingThem) {
  // Each used to hang the resume forever in open().
  for (const std::string& path : {path1_, dir_ + "/t/metadata.json", dir_ + "/latest"}) {
    const std::string saved = Slurp(path);
    ASSERT_EQ(::unlink(path.c_str()), 0);
    ASSERT_EQ(::mkfifo(path.c_str(), 0600), 0);
    const std::string message = InChild(
        [&] {
          auto tag = ReadLatest(dir_);
          if (!tag.ok()) return tag.status().ToString();
          return LoadFullState(dir_, *tag).status().ToString();
        },
        5);
    EXPECT_THAT(message, HasSubstr("FAILED_PRECONDITION: ")) << path;
    EXPECT_THAT(message, HasSubstr(path + ": not a regular file (it is a named pipe)")) << message;
    ASSERT_EQ(::unlink(path.c_str()), 0);
    Spit(path, saved);
    ASSERT_OK(LoadFullState(dir_, "t"));
  }
}

TEST_F(CorruptionTest, DeeplyNestedMetadataIsRefusedNotACrash) {
  // 100k levels in the saved config crashed (SIGSEGV) when the loader dumped it.
  const std::string path = dir_ + "/t/metadata.json";
  std::string text = Slurp(path);
  const std::string config = "\"config\": {";
  const size_t at = text.find(config);
  ASSERT_NE(at, std::string::npos);
  std::string deep;
  for (int i = 0; i < 100000; ++i) deep += "[";
  for (int i = 0; i < 100000; ++i) deep += "]";
  text.insert(at + config.size(), "\"deep\": " + deep + ", ");
  Spit(path, SealMetadataText(text.substr(0, text.rfind(",\n \"metadata_crc32c\"")) + "\n}\n"));
  const std::string message = InChild([&] { return ReadMetadata(dir_, "t").status().ToString(); }, 10);
  EXPECT_THAT(message, HasSubstr("DATA_LOSS: " + path +
                                 ": not valid JSON (the file is corrupt): JSON nested deeper "
                                 "than 100 levels at line "))
      << message.substr(0, 300);
}

TEST(CheckpointJsonTest, EmbeddedJsonLeavesRoomForTheMetadataLevel) {
  // The client state sits one level down in metadata.json: 99 levels of its own at most, checked at
  // save time rather than found unreadable at load.
  auto nested = [](int levels) {
    std::string s;
    for (int i = 0; i < levels; ++i) s += "[";
    for (int i = 0; i < levels; ++i) s += "]";
    return s;
  };
  EXPECT_OK(CheckJsonText(nested(99), "client_state_json"));
  const Status st = CheckJsonText(nested(100), "client_state_json");
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(st.message(), HasSubstr("client_state_json: not valid JSON: client_state_json (embedded in "
                                      "metadata.json): JSON nested deeper than 99 levels at line 1, column 100"));
  EXPECT_THAT(CheckJsonText("{\"a\": 1e400}", "client_state_json").message(),
              HasSubstr("number 1e400 at line 1, column 7 (key 'a') is outside the range of a double"));
}

// --- metadata.json's checksum
// --------------------------------------------------------------------

TEST_F(CorruptionTest, MetadataIsSealedWithItsChecksum) {
  const std::string text = Slurp(dir_ + "/t/metadata.json");
  const std::string entry = ",\n \"metadata_crc32c\": \"";
  const size_t at = text.rfind(entry);
  ASSERT_NE(at, std::string::npos);
  EXPECT_EQ(text.substr(at + entry.size()), Crc32cHex(Crc32c(text.data(), at)) + "\"\n}\n");
  EXPECT_EQ(SealMetadataText(text), text);  // resealing a sealed text changes nothing
  EXPECT_EQ(meta_.format_version, 2);
}

TEST_F(CorruptionTest, FlippedMetadataByteIsAChecksumMismatchNamingTheFile) {
  const std::string path = dir_ + "/t/metadata.json";
  std::string text = Slurp(path);
  // "adam_step": 117 -> 107 is still valid JSON with the right types: only the checksum sees it.
  const std::string key = "\"adam_step\": 117";
  const size_t at = text.find(key);
  ASSERT_NE(at, std::string::npos);
  const size_t covered = text.size() - 37;  // the seal is the last 37 bytes
  const uint32_t stored = Crc32c(text.data(), covered);
  text[at + key.size() - 2] = '0';
  Spit(path, text);
  auto r = ReadMetadata(dir_, "t");
  EXPECT_EQ(r.status().code(), StatusCode::kDataLoss);
  EXPECT_THAT(r.status().message(),
              HasSubstr(path + ": checksum mismatch: its metadata_crc32c entry says " + Crc32cHex(stored) + ", "));
  EXPECT_THAT(r.status().message(), HasSubstr("the " + std::to_string(covered) + " bytes before it have crc32c " +
                                              Crc32cHex(Crc32c(text.data(), covered))));
  EXPECT_FALSE(LoadFullState(dir_, "t").ok());
  EXPECT_FALSE(LoadShardsForRank(dir_, "t", SyntheticModel(), 0, 1).ok());
}

TEST_F(CorruptionTest, TruncatedMetadataSaysSo) {
  const std::string path = dir_ + "/t/metadata.json";
  const std::string text = Slurp(path);
  for (size_t keep : {text.size() / 2, text.size() - 1, text.size() - 20}) {
    Spit(path, text.substr(0, keep));
    auto r = ReadMetadata(dir_, "t");
    EXPECT_EQ(r.status().code(), StatusCode::kDataLoss) << keep;
    EXPECT_THAT(r.status().message(), HasSubstr(path + ": ")) << keep;
    // Cut inside the JSON: not parseable; cut after the last '}': parseable but unsealed.
    EXPECT_THAT(r.status().message(), ::testing::AnyOf(HasSubstr("truncated or corrupt: it does not end with its "
                                                                 "\"metadata_crc32c\" entry and is not valid JSON"),
                                                       HasSubstr("this file has none at its end (it was truncated or "
                                                                 "edited)")))
        << keep << ": " << r.status().message();
  }
}

TEST_F(CorruptionTest, FormatVersion1WithoutChecksumStillLoads) {
  // A checkpoint as format version 1 wrote it: the same JSON, no metadata_crc32c entry.
  const std::string path = dir_ + "/t/metadata.json";
  std::string text = Slurp(path);
  text = text.substr(0, text.rfind(",\n \"metadata_crc32c\"")) + "\n}\n";
  const std::string key = "\"format_version\": 2";
  ASSERT_NE(text.find(key), std::string::npos);
  std::string v2_unsealed = text;
  text.replace(text.find(key), key.size(), "\"format_version\": 1");
  Spit(path, text);
  auto loaded = LoadFullState(dir_, "t");
  ASSERT_OK(loaded);
  EXPECT_EQ(loaded->meta.format_version, 1);
  ExpectFullEqual(*loaded, full_);
  // Version 1's rank files are still verified against it.
  std::string bytes = Slurp(path1_);
  bytes[bytes.size() / 2] ^= 0x10;
  Spit(path1_, bytes);
  EXPECT_THAT(LoadFullState(dir_, "t").status().message(), HasSubstr("checksum mismatch"));
  // Version 2 without its checksum is refused.
  Spit(path, v2_unsealed);
  auto r = ReadMetadata(dir_, "t");
  EXPECT_EQ(r.status().code(), StatusCode::kDataLoss);
  EXPECT_THAT(r.status().message(), HasSubstr(path + ": format version 2 ends with a \"metadata_crc32c\" entry, this "
                                                     "file has none at its end"));
}

}  // namespace
}  // namespace zero
