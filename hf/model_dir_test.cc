#include "hf/model_dir.h"

#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "engine/checkpoint/io.h"
#include "engine/checkpoint/test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "hf/safetensors.h"
#include "runtime/faulty_file_system.h"
#include "testing/status_matchers.h"

namespace zero::llm {
namespace {

using examples::ModelParamSpec;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;
using zero::testing::ScratchDir;

const char kConfig[] = R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 4})";

// A small Llama-shaped list; the 10x10 tensor is larger than the sharded tests' shard limit.
std::vector<ModelParamSpec> Specs() {
  return {
      {"model.embed_tokens.weight", {4, 4}, "embed"},
      {"model.layers.0.input_layernorm.weight", {8}, "layer0"},
      {"model.layers.0.self_attn.q_proj.weight", {4, 8}, "layer0"},
      {"model.layers.0.self_attn.q_norm.weight", {3}, "layer0"},
      {"model.layers.0.mlp.down_proj.weight", {10, 10}, "layer0"},
      {"model.norm.weight", {2}, "head"},
  };
}

float Value(int param, int64_t j) { return 0.37f * static_cast<float>(param + 1) - 0.011f * j; }

Status FillValues(const std::vector<ModelParamSpec>& specs, int i, float* out) {
  for (int64_t j = 0; j < specs[i].numel(); ++j) out[j] = Value(i, j);
  return OkStatus();
}

std::function<Status(int, float*)> ValuesOf(const std::vector<ModelParamSpec>& specs) {
  return [&specs](int i, float* out) { return FillValues(specs, i, out); };
}

std::vector<std::string> Listing(const std::string& dir) {
  auto names = ListDirectory(dir);
  EXPECT_OK(names);
  return names.ok() ? *names : std::vector<std::string>{};
}

// Every value of every spec reads back as Value() rounded to `dtype`.
void ExpectValues(const HfWeights& w, const std::vector<ModelParamSpec>& specs, DType dtype) {
  for (size_t i = 0; i < specs.size(); ++i) {
    const int64_t n = specs[i].numel();
    std::vector<float> got(n);
    Status st = w.ReadSlice(specs[i].name, 0, n, got.data());
    ASSERT_OK(st);
    EXPECT_EQ(w.dtype_of(specs[i].name), dtype);
    for (int64_t j = 0; j < n; ++j) {
      uint16_t bits[2];
      StoreFromFloat(bits, dtype, 0, Value(static_cast<int>(i), j));
      const float want = dtype == DType::kF32 ? Value(static_cast<int>(i), j) : LoadAsFloat(bits, dtype, 0);
      ASSERT_EQ(got[j], want) << specs[i].name << "[" << j << "]";
    }
  }
}

TEST(HfCheckpointTest, ExportsOneFileAndReadsItBack) {
  const std::string dir = ScratchDir("hf") + "/new/model";  // created by the export
  const std::vector<ModelParamSpec> specs = Specs();
  Status st = ExportHf(dir, kConfig, specs, DType::kBF16, ValuesOf(specs));
  ASSERT_OK(st);
  EXPECT_EQ(Listing(dir), (std::vector<std::string>{"config.json", "model.safetensors"}));
  EXPECT_EQ(*ReadFile(dir + "/config.json"), kConfig);

  auto w = HfWeights::Open(dir);
  ASSERT_OK(w);
  st = w->Check(specs, {});
  EXPECT_OK(st);
  ExpectValues(*w, specs, DType::kBF16);
  EXPECT_EQ(w->file_of("model.norm.weight"), "model.safetensors");
  EXPECT_EQ(w->names().size(), specs.size());

  auto f = SafetensorsFile::Open(dir + "/model.safetensors");
  ASSERT_OK(f);
  EXPECT_EQ(f->metadata().at("format"), "pt");
  for (size_t i = 0; i < specs.size(); ++i) EXPECT_EQ(f->tensors()[i].name, specs[i].name);

  // A slice reads only its range (a ZeRO-3 partition).
  float part[5];
  ASSERT_OK(w->ReadSlice("model.layers.0.mlp.down_proj.weight", 37, 5, part));
  for (int j = 0; j < 5; ++j) EXPECT_EQ(part[j], Bf16ToFloat(FloatToBf16(Value(4, 37 + j))));
  Status missing = w->ReadSlice("lm_head.weight", 0, 1, part);
  EXPECT_EQ(missing.code(), StatusCode::kNotFound);
  EXPECT_THAT(missing.message(), AllOf(HasSubstr(dir), HasSubstr("'lm_head.weight'")));
}

TEST(HfCheckpointTest, ShardsWithIndexAndRemovesStaleFiles) {
  const std::string dir = ScratchDir("hf");
  const std::vector<ModelParamSpec> specs = Specs();
  // An earlier unsharded save, which the sharded one must replace.
  ASSERT_OK(ExportHf(dir, kConfig, specs, DType::kF32, ValuesOf(specs)));
  ASSERT_OK(WriteFileAtomic(dir + "/tokenizer.json", "{}"));  // an earlier export's: this one drops it

  const int64_t max_bytes = 64;
  Status st = ExportHf(dir, kConfig, specs, DType::kBF16, ValuesOf(specs), max_bytes);
  ASSERT_OK(st);
  // BF16 bytes 32 | 16 | 64 | 6 | 200 | 4: greedy in order gives {32+16}, {64}, {6}, {200}, {4}.
  EXPECT_EQ(Listing(dir), (std::vector<std::string>{
                              "config.json", "model-00001-of-00005.safetensors", "model-00002-of-00005.safetensors",
                              "model-00003-of-00005.safetensors", "model-00004-of-00005.safetensors",
                              "model-00005-of-00005.safetensors", "model.safetensors.index.json"}));
  auto index = nlohmann::json::parse(*ReadFile(dir + "/model.safetensors.index.json"));
  EXPECT_EQ(index["metadata"]["total_size"], 32 + 16 + 64 + 6 + 200 + 4);
  EXPECT_EQ(index["weight_map"].size(), specs.size());
  EXPECT_EQ(index["weight_map"]["model.layers.0.input_layernorm.weight"], "model-00001-of-00005.safetensors");
  EXPECT_EQ(index["weight_map"]["model.norm.weight"], "model-00005-of-00005.safetensors");
  for (int k = 1; k <= 5; ++k) {
    auto f = SafetensorsFile::Open(dir + "/" + HfShardName(k, 5));
    ASSERT_OK(f);
    const uint64_t data = *FileSize(dir + "/" + HfShardName(k, 5)) - f->data_start();
    EXPECT_TRUE(data <= static_cast<uint64_t>(max_bytes) || f->tensors().size() == 1) << k;
    EXPECT_EQ(f->metadata().at("format"), "pt");
  }

  auto w = HfWeights::Open(dir);
  ASSERT_OK(w);
  EXPECT_OK(w->Check(specs, {}));
  ExpectValues(*w, specs, DType::kBF16);
  EXPECT_EQ(w->file_of("model.layers.0.mlp.down_proj.weight"), HfShardName(4, 5));

  // Fewer shards, then one file again: the old shards and index go.
  ASSERT_OK(ExportHf(dir, kConfig, specs, DType::kBF16, ValuesOf(specs), 250));
  EXPECT_EQ(Listing(dir),
            (std::vector<std::string>{"config.json", "model-00001-of-00002.safetensors",
                                      "model-00002-of-00002.safetensors", "model.safetensors.index.json"}));
  ASSERT_OK(ExportHf(dir, kConfig, specs, DType::kF16, ValuesOf(specs), 5'000'000'000, {{"tokenizer.json", "{}"}}));
  EXPECT_EQ(Listing(dir), (std::vector<std::string>{"config.json", "model.safetensors", "tokenizer.json"}));
  auto w16 = HfWeights::Open(dir);
  ASSERT_OK(w16);
  ExpectValues(*w16, specs, DType::kF16);
}

// Random bit patterns of `dtype` (every finite value and the infinities; NaN payloads are not
// preserved by a float round trip and do not occur in weights).
std::vector<uint8_t> RandomBits(int64_t numel, DType dtype, std::mt19937& rng) {
  std::vector<uint8_t> out(numel * SizeOf(dtype));
  for (int64_t i = 0; i < numel; ++i) {
    float v;
    do {
      const uint32_t r = rng();
      if (dtype == DType::kF32) {
        std::memcpy(&out[i * 4], &r, 4);
      } else {
        const uint16_t h = static_cast<uint16_t>(r);
        std::memcpy(&out[i * 2], &h, 2);
      }
      v = LoadAsFloat(out.data(), dtype, i);
    } while (std::isnan(v));
  }
  return out;
}

// Import -> export with no change reproduces every byte, in each dtype, one file and sharded.
TEST(HfCheckpointTest, ImportExportIsBitwise) {
  const std::vector<ModelParamSpec> specs = Specs();
  std::mt19937 rng(1234);
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (int64_t max_bytes : {int64_t{5'000'000'000}, int64_t{100}}) {
      SCOPED_TRACE(std::string(DTypeName(dtype)) + " max " + std::to_string(max_bytes));
      const std::string src = ScratchDir("hf_src"), dst = ScratchDir("hf_dst");
      // The source: written by the export from random bits (so sharded sources have an index).
      std::vector<std::vector<uint8_t>> bits;
      for (const ModelParamSpec& s : specs) bits.push_back(RandomBits(s.numel(), dtype, rng));
      Status st = ExportHf(
          src, kConfig, specs, dtype,
          [&](int i, float* out) {
            for (int64_t j = 0; j < specs[i].numel(); ++j) out[j] = LoadAsFloat(bits[i].data(), dtype, j);
            return OkStatus();
          },
          max_bytes);
      ASSERT_OK(st);
      auto in = HfWeights::Open(src);
      ASSERT_OK(in);
      ASSERT_OK(in->Check(specs, {}));
      // Raw bytes are the random bits (the export stored them unchanged).
      for (size_t i = 0; i < specs.size(); ++i) {
        std::vector<float> v(specs[i].numel());
        ASSERT_OK(in->ReadSlice(specs[i].name, 0, specs[i].numel(), v.data()));
        std::vector<uint8_t> back(bits[i].size());
        for (size_t j = 0; j < v.size(); ++j) StoreFromFloat(back.data(), dtype, j, v[j]);
        ASSERT_EQ(back, bits[i]) << specs[i].name;
      }
      st = ExportHf(
          dst, kConfig, specs, in->dtype_of(specs[0].name),
          [&](int i, float* out) { return in->ReadSlice(specs[i].name, 0, specs[i].numel(), out); }, max_bytes);
      ASSERT_OK(st);
      const std::vector<std::string> files = Listing(src);
      ASSERT_EQ(Listing(dst), files);
      if (max_bytes == 100) {  // config, index and at least two shards
        EXPECT_GT(files.size(), 3u);
        EXPECT_TRUE(PathExists(dst + "/model.safetensors.index.json"));
      } else {
        EXPECT_EQ(files, (std::vector<std::string>{"config.json", "model.safetensors"}));
      }
      for (const std::string& f : files) {
        EXPECT_TRUE(*ReadFile(src + "/" + f) == *ReadFile(dst + "/" + f)) << f << " differs";
      }
    }
  }
}

// A file written by WriteSafetensors directly (not by the export) exports to the same bytes.
TEST(HfCheckpointTest, ForeignSingleFileExportsToTheSameBytes) {
  const std::string src = ScratchDir("hf_src"), dst = ScratchDir("hf_dst");
  const std::vector<ModelParamSpec> specs = Specs();
  std::mt19937 rng(99);
  std::vector<std::vector<uint8_t>> bits;
  std::vector<TensorToWrite> tensors;
  for (const ModelParamSpec& s : specs) bits.push_back(RandomBits(s.numel(), DType::kBF16, rng));
  for (size_t i = 0; i < specs.size(); ++i) {
    tensors.push_back({specs[i].name, DType::kBF16, specs[i].shape, bits[i].data()});
  }
  ASSERT_OK(WriteSafetensors(src + "/model.safetensors", tensors, {{"format", "pt"}}));
  auto in = HfWeights::Open(src);
  ASSERT_OK(in);
  Status st = ExportHf(dst, kConfig, specs, DType::kBF16,
                       [&](int i, float* out) { return in->ReadSlice(specs[i].name, 0, specs[i].numel(), out); });
  ASSERT_OK(st);
  EXPECT_TRUE(*ReadFile(src + "/model.safetensors") == *ReadFile(dst + "/model.safetensors"));
}

TEST(HfCheckpointTest, CheckListsEveryProblemInOneMessage) {
  const std::string dir = ScratchDir("hf");
  std::vector<ModelParamSpec> on_disk = Specs();
  on_disk.push_back({"lm_head.weight", {4, 4}, "head"});
  on_disk.push_back({"model.layers.0.self_attn.rotary_emb.inv_freq", {2}, "layer0"});
  on_disk.push_back({"model.layers.0.self_attn.extra_bias", {4}, "layer0"});
  ASSERT_OK(ExportHf(dir, kConfig, on_disk, DType::kBF16, ValuesOf(on_disk), 100));
  auto w = HfWeights::Open(dir);
  ASSERT_OK(w);

  std::vector<ModelParamSpec> model = Specs();
  model[2].shape = {8, 4};                                                        // transposed q_proj
  model[3].shape = {4};                                                           // q_norm of another head_dim
  model.push_back({"model.layers.0.self_attn.k_proj.weight", {4, 8}, "layer0"});  // missing
  model.push_back({"model.layers.1.input_layernorm.weight", {8}, "layer1"});      // missing
  const std::set<std::string> tied = {"lm_head.weight", "rotary_emb.inv_freq"};
  Status st = w->Check(model, tied);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  const std::string q_file = w->file_of("model.layers.0.self_attn.q_proj.weight");
  EXPECT_THAT(st.message(), AllOf(HasSubstr(dir), HasSubstr("2 missing, 2 with the wrong shape, 1 unexpected"),
                                  HasSubstr("missing model.layers.0.self_attn.k_proj.weight [4, 8]"),
                                  HasSubstr("missing model.layers.1.input_layernorm.weight [8]"),
                                  HasSubstr("wrong shape model.layers.0.self_attn.q_proj.weight in " + q_file +
                                            ": expected [8, 4], got [4, 8]"),
                                  HasSubstr("wrong shape model.layers.0.self_attn.q_norm.weight in "),
                                  HasSubstr("expected [4], got [3]"),
                                  HasSubstr("unexpected model.layers.0.self_attn.extra_bias in " +
                                            w->file_of("model.layers.0.self_attn.extra_bias")),
                                  Not(HasSubstr("lm_head")), Not(HasSubstr("inv_freq"))));
  // Without the ignorable names, lm_head and inv_freq are reported too.
  EXPECT_THAT(w->Check(Specs(), {}).message(),
              AllOf(HasSubstr("3 unexpected"), HasSubstr("unexpected lm_head.weight in "),
                    HasSubstr("unexpected model.layers.0.self_attn.rotary_emb.inv_freq")));
  // A suffix must match whole name components.
  EXPECT_THAT(w->Check(Specs(), {"head.weight", "inv_freq", "extra_bias"}).message(),
              AllOf(HasSubstr("1 unexpected"), HasSubstr("unexpected lm_head.weight")));
}

// Issue 35: a tied model (tie_word_embeddings true) computes with the embedding in the lm_head's
// place, so a checkpoint's own lm_head.weight would be dropped silently unless it equals the
// embedding.
TEST(HfCheckpointTest, TiedCopyMustEqualItsOriginal) {
  const char* why = "config.json: tie_word_embeddings is true";
  const std::string emb = "model.embed_tokens.weight", head = "lm_head.weight";
  auto dir_with = [&](const std::vector<float>& e, const std::vector<float>& h, std::vector<int64_t> head_shape,
                      DType head_dtype) {
    const std::string dir = ScratchDir("hf_tied");
    std::vector<uint16_t> bits(h.size());
    for (size_t i = 0; i < h.size(); ++i) StoreFromFloat(bits.data(), DType::kBF16, i, h[i]);
    std::vector<TensorToWrite> t = {{emb, DType::kF32, {2, 3}, e.data()}};
    if (!head_shape.empty()) {
      t.push_back(
          {head, head_dtype, head_shape,
           head_dtype == DType::kF32 ? static_cast<const void*>(h.data()) : static_cast<const void*>(bits.data())});
    }
    EXPECT_OK(WriteSafetensors(dir + "/model.safetensors", t));
    return dir;
  };
  const std::vector<float> e = {1, 2, 3, 4, 5, 6};
  {  // no copy: nothing to check
    ASSERT_OK_AND_ASSIGN(HfWeights w, HfWeights::Open(dir_with(e, {}, {}, DType::kF32)));
    EXPECT_OK(w.CheckTiedCopy(head, emb, why));
  }
  {  // an equal copy (also in another dtype holding the same values) is the tied weight written twice
    ASSERT_OK_AND_ASSIGN(HfWeights w, HfWeights::Open(dir_with(e, e, {2, 3}, DType::kF32)));
    EXPECT_OK(w.CheckTiedCopy(head, emb, why));
    ASSERT_OK_AND_ASSIGN(HfWeights b, HfWeights::Open(dir_with(e, e, {2, 3}, DType::kBF16)));
    EXPECT_OK(b.CheckTiedCopy(head, emb, why));
  }
  {  // a different lm_head: refused naming both tensors, the key and the first difference
    std::vector<float> h = e;
    h[4] = 7;
    ASSERT_OK_AND_ASSIGN(HfWeights w, HfWeights::Open(dir_with(e, h, {2, 3}, DType::kF32)));
    Status st = w.CheckTiedCopy(head, emb, why);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(st.message(), AllOf(HasSubstr(w.dir()), HasSubstr("lm_head.weight in model.safetensors"),
                                    HasSubstr("differs from model.embed_tokens.weight"), HasSubstr("element 4"),
                                    HasSubstr("tie_word_embeddings is true")));
  }
  {  // another shape
    ASSERT_OK_AND_ASSIGN(HfWeights w, HfWeights::Open(dir_with(e, e, {3, 2}, DType::kF32)));
    EXPECT_THAT(w.CheckTiedCopy(head, emb, why).message(),
                AllOf(HasSubstr("lm_head.weight"), HasSubstr("shape [3, 2]"), HasSubstr("[2, 3]"),
                      HasSubstr("tie_word_embeddings")));
  }
  {  // the original missing
    ASSERT_OK_AND_ASSIGN(HfWeights w, HfWeights::Open(dir_with(e, e, {2, 3}, DType::kF32)));
    EXPECT_EQ(w.CheckTiedCopy(head, "model.absent.weight", why).code(), StatusCode::kNotFound);
  }
}

// Writes `index` as the directory's index and shards a.safetensors {x, y} and b.safetensors {z}.
std::string ShardedDir(const std::string& index) {
  const std::string dir = ScratchDir("hf_bad");
  const float v[2] = {1.0f, 2.0f};
  EXPECT_OK(WriteSafetensors(dir + "/a.safetensors", {{"x", DType::kF32, {2}, v}, {"y", DType::kF32, {1}, v}}));
  EXPECT_OK(WriteSafetensors(dir + "/b.safetensors", {{"z", DType::kF32, {2}, v}}));
  EXPECT_OK(WriteFileAtomic(dir + "/model.safetensors.index.json", index));
  return dir;
}

std::string OpenError(const std::string& dir) {
  auto w = HfWeights::Open(dir);
  return w.ok() ? std::string() : w.status().ToString();
}

TEST(HfCheckpointTest, RefusesBadDirectoriesAndIndexes) {
  const std::string good =
      R"({"metadata": {"total_size": 20}, "weight_map": {"x": "a.safetensors", "y": "a.safetensors", "z": "b.safetensors"}})";
  {
    const std::string dir = ShardedDir(good);
    auto w = HfWeights::Open(dir);
    ASSERT_OK(w);
    EXPECT_EQ(w->names(), (std::vector<std::string>{"x", "y", "z"}));
    EXPECT_EQ(w->file_of("z"), "b.safetensors");
    float z[2];
    ASSERT_OK(w->ReadSlice("z", 0, 2, z));
    EXPECT_EQ(z[1], 2.0f);
  }
  const std::string index_name = "model.safetensors.index.json";
  struct Case {
    const char* what;
    std::string index, expect;
  };
  const std::vector<Case> cases = {
      {"not JSON", R"({"weight_map": )", index_name + ": malformed JSON at line 1"},
      {"no weight_map", R"({"metadata": {}})", "\"weight_map\""},
      {"slash", R"({"weight_map": {"x": "sub/a.safetensors"}})", "'sub/a.safetensors' is not a file name"},
      {"dotdot", R"({"weight_map": {"x": "..a.safetensors"}})", "is not a file name"},
      {"not a string", R"({"weight_map": {"x": 3}})", "weight_map['x'] is not a file name"},
      {"missing shard", R"({"weight_map": {"x": "a.safetensors", "y": "a.safetensors", "z": "c.safetensors"}})",
       "names shard c.safetensors"},
      {"tensor not in its shard",
       R"({"weight_map": {"x": "a.safetensors", "y": "a.safetensors", "z": "b.safetensors", "q": "b.safetensors"}})",
       "maps tensor 'q' to b.safetensors, which does not hold it"},
      {"mapped elsewhere", R"({"weight_map": {"x": "b.safetensors", "y": "a.safetensors", "z": "b.safetensors"}})",
       "tensor 'x' is in a.safetensors and also mapped to b.safetensors"},
      {"unlisted", R"({"weight_map": {"x": "a.safetensors", "z": "b.safetensors"}})",
       "tensor 'y' is in a.safetensors but"},
  };
  for (const Case& c : cases) {
    const std::string dir = ShardedDir(c.index);
    EXPECT_THAT(OpenError(dir), AllOf(HasSubstr(dir), HasSubstr(c.expect))) << c.what;
  }
  {  // x in both shards
    const std::string dir = ShardedDir(good);
    const float v[2] = {1.0f, 2.0f};
    ASSERT_OK(WriteSafetensors(dir + "/b.safetensors", {{"z", DType::kF32, {2}, v}, {"x", DType::kF32, {2}, v}}));
    EXPECT_THAT(OpenError(dir), HasSubstr("tensor 'x' is in both a.safetensors and b.safetensors"));
  }
  {  // a broken shard names the index and the shard's own problem
    const std::string dir = ShardedDir(good);
    ASSERT_OK(WriteFileAtomic(dir + "/b.safetensors", std::string(3, '\0')));
    EXPECT_THAT(OpenError(dir),
                AllOf(HasSubstr("names shard b.safetensors"), HasSubstr(dir + "/b.safetensors: truncated")));
  }
  {  // both layouts at once
    const std::string dir = ShardedDir(good);
    const float v = 1.0f;
    ASSERT_OK(WriteSafetensors(dir + "/model.safetensors", {{"x", DType::kF32, {1}, &v}}));
    EXPECT_THAT(OpenError(dir), HasSubstr("ambiguous"));
  }
  {  // an index that is a FIFO is refused at once
    const std::string dir = ScratchDir("hf_bad");
    ASSERT_EQ(::mkfifo((dir + "/" + index_name).c_str(), 0600), 0);
    const auto start = std::chrono::steady_clock::now();
    EXPECT_THAT(OpenError(dir), HasSubstr("FIFO"));
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  }
  const std::string empty = ScratchDir("hf_bad");
  auto none = HfWeights::Open(empty);
  EXPECT_EQ(none.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(none.status().message(), AllOf(HasSubstr(empty), HasSubstr("no model.safetensors")));
  ASSERT_OK(WriteFileAtomic(empty + "/file", "x"));
  EXPECT_THAT(OpenError(empty + "/file"), HasSubstr("not a directory"));
  EXPECT_EQ(HfWeights::Open(empty + "/absent").status().code(), StatusCode::kNotFound);
}

// Issue 35: hostile index text is DATA_LOSS naming the index, never a crash or an exception.
TEST(HfCheckpointTest, HostileIndexJsonIsAnErrorNamingTheFile) {
  const std::string index_name = "model.safetensors.index.json";
  const std::string map = R"("weight_map": {"x": "a.safetensors", "y": "a.safetensors", "z": "b.safetensors"})";
  struct Case {
    const char* what;
    std::string index, expect;
  };
  const std::vector<Case> cases = {
      {"100k-deep nesting", "{" + map + ", \"metadata\": " + std::string(100000, '[') + std::string(100000, ']') + "}",
       index_name + ": JSON nested deeper than 100 levels at line 1"},
      {"1e400 under a known key", "{\"metadata\": {\"total_size\": 1e400}, " + map + "}",
       "number 1e400 at line 1, column 29 (key 'metadata.total_size') is outside the range of a double"},
      {"1e400 under an unknown key", "{\"extra\": 1e400, " + map + "}",
       "number 1e400 at line 1, column 11 (key 'extra') is outside the range of a double"},
      {"a tensor mapped twice",
       R"({"weight_map": {"x": "a.safetensors", "y": "a.safetensors", "x": "b.safetensors", "z": "b.safetensors"}})",
       "duplicate key 'weight_map.x'"},
  };
  for (const Case& c : cases) {
    const std::string dir = ShardedDir(c.index);
    auto w = HfWeights::Open(dir);
    if (w.ok()) {
      ADD_FAILURE() << c.what << ": opened";
      continue;
    }
    EXPECT_EQ(w.status().code(), StatusCode::kDataLoss) << c.what << ": " << w.status().ToString();
    EXPECT_THAT(w.status().message(), AllOf(HasSubstr(dir + "/" + index_name + ": "), HasSubstr(c.expect))) << c.what;
  }
  // The config given to ExportHf is checked the same way before anything is written.
  const std::string out = ScratchDir("hf") + "/m";
  const std::vector<ModelParamSpec> specs = Specs();
  EXPECT_THAT(ExportHf(out, "{\"a\": " + std::string(100000, '[') + std::string(100000, ']') + "}", specs, DType::kBF16,
                       ValuesOf(specs))
                  .message(),
              AllOf(HasSubstr("export to " + out + ": config.json"), HasSubstr("nested deeper than 100 levels")));
  EXPECT_THAT(ExportHf(out, R"({"a": 1, "a": 2})", specs, DType::kBF16, ValuesOf(specs)).message(),
              HasSubstr("duplicate key 'a'"));
  EXPECT_FALSE(PathExists(out));
}

TEST(HfCheckpointTest, ExportRefusesBadArgumentsAndStopsOnValueErrors) {
  const std::string dir = ScratchDir("hf");
  const std::vector<ModelParamSpec> specs = Specs();
  ASSERT_OK(WriteFileAtomic(dir + "/file", "x"));
  EXPECT_THAT(ExportHf(dir + "/file", kConfig, specs, DType::kBF16, ValuesOf(specs)).message(),
              AllOf(HasSubstr(dir + "/file"), HasSubstr("not a directory")));
  EXPECT_THAT(ExportHf(dir + "/m", "{\"a\": ", specs, DType::kBF16, ValuesOf(specs)).message(),
              HasSubstr("export to " + dir + "/m: config.json: malformed JSON at line 1"));
  EXPECT_THAT(ExportHf(dir + "/m", "[1]", specs, DType::kBF16, ValuesOf(specs)).message(),
              HasSubstr("config.json is not a JSON object"));
  EXPECT_THAT(ExportHf(dir + "/m", kConfig, specs, DType::kBF16, ValuesOf(specs), 0).message(),
              HasSubstr("max_shard_bytes must be positive"));
  std::vector<ModelParamSpec> neg = specs;
  neg[1].shape = {-8};
  EXPECT_THAT(ExportHf(dir + "/m", kConfig, neg, DType::kBF16, ValuesOf(specs)).message(),
              AllOf(HasSubstr("'model.layers.0.input_layernorm.weight'"), HasSubstr("[-8]")));
  std::vector<ModelParamSpec> twice = specs;
  twice[1].name = twice[0].name;
  EXPECT_THAT(ExportHf(dir + "/m", kConfig, twice, DType::kBF16, ValuesOf(specs)).message(),
              AllOf(HasSubstr("'model.embed_tokens.weight'"), HasSubstr("used twice")));

  // values fails on tensor 4: nothing is published (the first shards were written only to staging).
  const std::string out = dir + "/fail";
  Status st = ExportHf(
      out, kConfig, specs, DType::kBF16,
      [&](int i, float* v) {
        if (i == 4) return InternalError("device lost");
        return FillValues(specs, i, v);
      },
      64);
  EXPECT_EQ(st.code(), StatusCode::kInternal);
  EXPECT_THAT(st.message(), AllOf(HasSubstr("'model.layers.0.mlp.down_proj.weight'"), HasSubstr("device lost")));
  EXPECT_THAT(st.message(), HasSubstr("export to " + out + " (nothing was replaced)"));
  EXPECT_FALSE(PathExists(out));
  EXPECT_EQ(Listing(dir), (std::vector<std::string>{"file"}));  // no staging directory left
}

// The files of `dir`, name -> contents.
std::map<std::string, std::string> Contents(const std::string& dir) {
  std::map<std::string, std::string> out;
  for (const std::string& f : Listing(dir)) out[f] = *ReadFile(dir + "/" + f);
  return out;
}

// An export into an earlier one replaces it whole: its tokenizer files and shards do not survive.
TEST(HfExportTest, ReplacesAnEarlierExportWhole) {
  const std::string root = ScratchDir("hf"), dir = root + "/m";
  const std::vector<ModelParamSpec> specs = Specs();
  ASSERT_OK(ExportHf(dir, kConfig, specs, DType::kBF16, ValuesOf(specs), 64,
                     {{"tokenizer.json", "{\"old\": 1}"}, {"tokenizer_config.json", "{}"}}));
  ASSERT_EQ(Listing(dir).size(), 9u);  // config, index, 5 shards, 2 tokenizer files
  ASSERT_OK(ExportHf(dir, kConfig, specs, DType::kF32, ValuesOf(specs)));
  EXPECT_EQ(Listing(dir), (std::vector<std::string>{"config.json", "model.safetensors"}));
  EXPECT_EQ(Listing(root), (std::vector<std::string>{"m"}));  // no staging or old directory beside it
  auto w = HfWeights::Open(dir);
  ASSERT_OK(w);
  ExpectValues(*w, specs, DType::kF32);
  // The same where the filesystem cannot exchange two directories (two renames).
  FaultyFileSystem fs;
  fs.SetExchangeSupported(false);
  ASSERT_OK(
      ExportHf(dir, kConfig, specs, DType::kBF16, ValuesOf(specs), 5'000'000'000, {{"tokenizer.json", "{}"}}, &fs));
  EXPECT_EQ(Listing(dir), (std::vector<std::string>{"config.json", "model.safetensors", "tokenizer.json"}));
  EXPECT_EQ(Listing(root), (std::vector<std::string>{"m"}));
}

// A directory holding anything an export does not write is never replaced.
TEST(HfExportTest, RefusesToReplaceADirectoryThatIsNotAnExport) {
  const std::string dir = ScratchDir("hf");
  const std::vector<ModelParamSpec> specs = Specs();
  ASSERT_OK(WriteFileAtomic(dir + "/config.json", "{}"));
  ASSERT_OK(WriteFileAtomic(dir + "/notes.txt", "mine"));
  Status st = ExportHf(dir, kConfig, specs, DType::kBF16, ValuesOf(specs));
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(st.message(), AllOf(HasSubstr(dir), HasSubstr("'notes.txt'"), HasSubstr("refusing to replace")));
  EXPECT_EQ(Listing(dir), (std::vector<std::string>{"config.json", "notes.txt"}));
  EXPECT_THAT(ExportHf(dir + "/x", kConfig, specs, DType::kBF16, ValuesOf(specs), 100, {{"notes.txt", ""}}).message(),
              HasSubstr("extra file 'notes.txt'"));
}

// A write that fails midway (ENOSPC on the n-th append through the FileSystem, each in turn, and
// on each rename or exchange): the earlier export stays byte for byte, no partial new one is visible.
TEST(HfExportTest, AFailedWriteLeavesTheOldExportIntact) {
  const std::string root = ScratchDir("hf"), dir = root + "/m";
  const std::vector<ModelParamSpec> specs = Specs();
  const std::vector<ExportFile> tokenizer = {{"tokenizer.json", std::string(5000, 't')},
                                             {"tokenizer_config.json", "{}"}};
  ASSERT_OK(ExportHf(dir, kConfig, specs, DType::kBF16, ValuesOf(specs), 64, tokenizer));
  const std::map<std::string, std::string> before = Contents(dir);
  struct Fault {
    const char* op;
    int nth;
  };
  for (Fault f : std::vector<Fault>{{"Append", 1},
                                    {"Append", 2},
                                    {"Append", 3},
                                    {"Sync", 1},
                                    {"Sync", 3},
                                    {"Rename", 1},
                                    {"Rename", 3},
                                    {"Exchange", 1},
                                    {"SyncDirectory", 1}}) {
    SCOPED_TRACE(std::string(f.op) + " #" + std::to_string(f.nth));
    FaultyFileSystem fs;
    fs.FailNthCall(f.op, f.nth, ENOSPC);
    Status st = ExportHf(dir, kConfig, specs, DType::kF32, ValuesOf(specs), 5'000'000'000,
                         {{"tokenizer.json", "{}"}, {"tokenizer_config.json", "{\"new\": 1}"}}, &fs);
    ASSERT_FALSE(st.ok());
    EXPECT_THAT(st.message(), AllOf(HasSubstr("export to " + dir), HasSubstr("No space left on device")));
    EXPECT_TRUE(Contents(dir) == before);
    EXPECT_EQ(Listing(root), (std::vector<std::string>{"m"}));
  }
}

// A real short write: the file size limit (RLIMIT_FSIZE, what a full disk does to a write, without
// mounting anything) makes the large tokenizer.json fail with EFBIG in a child process. Before
// exports were staged and checked, the tokenizer was written with an unchecked ofstream and the
// export reported success with a truncated file.
TEST(HfExportTest, AShortWriteFailsAndLeavesTheOldExportIntact) {
  const std::string root = ScratchDir("hf"), dir = root + "/m";
  const std::vector<ModelParamSpec> specs = Specs();
  ASSERT_OK(ExportHf(dir, kConfig, specs, DType::kBF16, ValuesOf(specs), 5'000'000'000, {{"tokenizer.json", "{}"}}));
  const std::map<std::string, std::string> before = Contents(dir);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::signal(SIGXFSZ, SIG_IGN);
    struct rlimit lim = {64 * 1024, 64 * 1024};
    ::setrlimit(RLIMIT_FSIZE, &lim);
    Status st = ExportHf(dir, kConfig, specs, DType::kBF16, ValuesOf(specs), 5'000'000'000,
                         {{"tokenizer.json", std::string(200 * 1024, 'x')}});
    const bool named = st.message().find("tokenizer.json") != std::string::npos;
    ::_exit(st.ok() ? 1 : named ? 0 : 2);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "1: the export reported success; 2: its error did not name tokenizer.json";
  EXPECT_TRUE(Contents(dir) == before);
  EXPECT_EQ(Listing(root), (std::vector<std::string>{"m"}));
}

}  // namespace
}  // namespace zero::llm
