#include "models/byte/byte_lm.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "models/model_api.h"
#include "models/model_api_testing.h"
#include "testing/status_matchers.h"

namespace zero::examples {
namespace {

ByteLmConfig TinyConfig() {
  ByteLmConfig c;
  c.context = 3;
  c.embed_dim = 4;
  c.hidden = 8;
  c.ffn = 12;
  c.layers = 2;
  return c;
}

// Random bytes drawn from a small alphabet so that tokens repeat (the embedding scatter-add then
// sums several rows).
std::vector<uint8_t> RandomTokens(int batch, int context, uint64_t seed) {
  std::vector<uint8_t> t(static_cast<size_t>(batch) * (context + 1));
  uint64_t s = seed;
  for (auto& b : t) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    b = static_cast<uint8_t>('a' + (s >> 59) % 7);
  }
  return t;
}

double Loss(ByteLmCpu& model, const HostTensors& params, const std::vector<uint8_t>& tokens, int batch) {
  ResidentParams provider(model.specs(), params.ParamViews());
  ByteLmActivations acts;
  auto loss = model.Forward(provider, tokens.data(), batch, &acts);
  EXPECT_OK(loss);
  return loss.ok() ? *loss : 0.0;
}

// Forward + Backward; returns the loss and fills `grads`.
double LossAndGrads(ByteLmCpu& model, const HostTensors& params, const std::vector<uint8_t>& tokens, int batch,
                    float loss_scale, HostTensors* grads) {
  ResidentParams provider(model.specs(), params.ParamViews());
  GradBuffers sink(grads->GradViews());
  ByteLmActivations acts;
  auto loss = model.Forward(provider, tokens.data(), batch, &acts);
  EXPECT_OK(loss);
  Status st = model.Backward(provider, &acts, loss_scale, sink);
  EXPECT_OK(st);
  return loss.ok() ? *loss : 0.0;
}

TEST(ByteLmConfigTest, ParamCountFormulaMatchesSpecs) {
  for (ByteLmConfig c : {ByteLmConfig{}, TinyConfig()}) {
    EXPECT_EQ(c.NumParams(), TotalNumel(ByteLmParamSpecs(c))) << c.ToString();
  }
  ByteLmConfig c;
  c.layers = 0;
  EXPECT_EQ(c.NumParams(), TotalNumel(ByteLmParamSpecs(c)));
  EXPECT_EQ(ByteLmConfig{}.NumParams(), 338304);
}

TEST(ByteLmConfigTest, ModulesInForwardOrder) {
  ByteLmConfig c;
  c.layers = 3;
  std::vector<ModuleSpec> m = GroupByModule(ByteLmParamSpecs(c));
  std::vector<std::string> names;
  for (const auto& x : m) names.push_back(x.name);
  EXPECT_EQ(names, (std::vector<std::string>{"embed", "in_proj", "block0", "block1", "block2", "head"}));
  EXPECT_EQ(m[2].params, (std::vector<int>{3, 4, 5, 6, 7, 8}));
  EXPECT_EQ(m.back().params, (std::vector<int>{21, 22, 23, 24}));
}

TEST(ByteLmConfigTest, RejectsBadValues) {
  ByteLmConfig c;
  c.hidden = 0;
  EXPECT_EQ(c.Validate().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(c.Validate().message().find("byte_lm.hidden"), std::string::npos);
}

TEST(InitTest, SlicesEqualTheWholeAndSeedsDiffer) {
  ModelParamSpec spec{"w", {100, 37}, "m", InitKind::kNormal, 0.5f};
  std::vector<float> all = InitParam(spec, 7);
  std::vector<float> part(1000);
  InitParamSlice(spec, 7, 1234, 1000, part.data());
  for (int j = 0; j < 1000; ++j) ASSERT_EQ(part[j], all[1234 + j]);
  EXPECT_NE(InitParam(spec, 8), all);
  double sum = 0, sq = 0;
  for (float v : all) {
    sum += v;
    sq += double(v) * v;
  }
  const double mean = sum / all.size(), stddev = std::sqrt(sq / all.size() - mean * mean);
  EXPECT_NEAR(mean, 0.0, 0.03);
  EXPECT_NEAR(stddev, 0.5, 0.03);
  ModelParamSpec ones{"g", {5}, "m", InitKind::kOnes, 0.0f};
  EXPECT_EQ(InitParam(ones, 1), std::vector<float>(5, 1.0f));
}

TEST(InitTest, ThreadedSlicesEqualSmallOnes) {
  // 5M elements: filled by several threads where the machine has them; each 4096-element slice
  // below is filled on one thread.
  ModelParamSpec spec{"big", {5000, 1000}, "m", InitKind::kNormal, 0.02f};
  std::vector<float> all = InitParam(spec, 3);
  std::vector<float> part(4096);
  for (int64_t at : {int64_t{0}, int64_t{1} << 20, int64_t{2500000}, spec.numel() - 4096}) {
    InitParamSlice(spec, 3, at, 4096, part.data());
    for (int j = 0; j < 4096; ++j) ASSERT_EQ(part[j], all[at + j]) << "element " << at + j;
  }
}

// Analytic gradients (double math) against central differences of the double loss, for every
// element of every parameter. Parameters are fp32, so the step actually taken is measured
// (fl(p + eps) - fl(p - eps)) rather than assumed.
TEST(ByteLmGradientTest, MatchesFiniteDifferencesForEveryParameter) {
  const ByteLmConfig c = TinyConfig();
  ByteLmCpu model(c, CpuMath::kDouble);
  const int batch = 6;
  const auto tokens = RandomTokens(batch, c.context, 11);
  HostTensors params = RandomParams(model.specs(), DType::kF32, 3);
  HostTensors grads(model.specs(), DType::kF32);
  LossAndGrads(model, params, tokens, batch, 1.0f, &grads);

  const float eps = 1e-4f;
  int checked = 0;
  double worst = 0.0;
  for (int i = 0; i < params.size(); ++i) {
    for (int64_t j = 0; j < params.numel(i); ++j) {
      const float p = params.Get(i, j);
      const float hi = p + eps, lo = p - eps;
      params.Set(i, j, hi);
      const double l_hi = Loss(model, params, tokens, batch);
      params.Set(i, j, lo);
      const double l_lo = Loss(model, params, tokens, batch);
      params.Set(i, j, p);
      const double numeric = (l_hi - l_lo) / (double(hi) - double(lo));
      const double analytic = grads.Get(i, j);
      const double err = std::abs(analytic - numeric);
      worst = std::max(worst, err / (1e-4 + std::abs(numeric)));
      ASSERT_LE(err, 1e-7 + 1e-5 * std::abs(numeric))
          << model.specs()[i].name << "[" << j << "] analytic " << analytic << " numeric " << numeric;
      ++checked;
    }
  }
  EXPECT_EQ(checked, c.NumParams());
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.3g", worst);
  RecordProperty("worst_relative_error", buf);
}

// The fp32 path computes the same function as the double path, to fp32 rounding.
TEST(ByteLmGradientTest, FloatMathMatchesDouble) {
  ByteLmConfig c = TinyConfig();
  c.hidden = 16;
  c.ffn = 40;
  ByteLmCpu model_f(c, CpuMath::kFloat), model_d(c, CpuMath::kDouble);
  const int batch = 33;
  const auto tokens = RandomTokens(batch, c.context, 5);
  HostTensors params = RandomParams(model_f.specs(), DType::kF32, 9);
  HostTensors gf(model_f.specs(), DType::kF32), gd(model_f.specs(), DType::kF32);
  const double lf = LossAndGrads(model_f, params, tokens, batch, 1.0f, &gf);
  const double ld = LossAndGrads(model_d, params, tokens, batch, 1.0f, &gd);
  EXPECT_NEAR(lf, ld, 1e-5 * ld);
  for (int i = 0; i < gf.size(); ++i) {
    float scale = 0;
    for (int64_t j = 0; j < gd.numel(i); ++j) scale = std::max(scale, std::abs(gd.Get(i, j)));
    for (int64_t j = 0; j < gd.numel(i); ++j) {
      ASSERT_NEAR(gf.Get(i, j), gd.Get(i, j), 1e-5f * scale + 1e-9f) << model_f.specs()[i].name << "[" << j << "]";
    }
  }
}

// 16-bit parameters are converted on load and gradients rounded on store, nothing else: the result
// equals the fp32 model run on the rounded parameters, with its gradients rounded.
TEST(ByteLmMixedPrecisionTest, SixteenBitEqualsRoundedFp32) {
  const ByteLmConfig c = TinyConfig();
  ByteLmCpu model(c);
  const int batch = 9;
  const auto tokens = RandomTokens(batch, c.context, 2);
  for (DType dt : {DType::kBF16, DType::kF16}) {
    HostTensors p16 = RandomParams(model.specs(), dt, 4);
    HostTensors p32(model.specs(), DType::kF32);
    for (int i = 0; i < p16.size(); ++i) p32.SetAll(i, p16.GetAll(i));
    HostTensors g16(model.specs(), dt), g32(model.specs(), DType::kF32);
    const double l16 = LossAndGrads(model, p16, tokens, batch, 1.0f, &g16);
    const double l32 = LossAndGrads(model, p32, tokens, batch, 1.0f, &g32);
    EXPECT_EQ(l16, l32) << DTypeName(dt);
    for (int i = 0; i < g16.size(); ++i) {
      for (int64_t j = 0; j < g16.numel(i); ++j) {
        uint16_t want = dt == DType::kBF16 ? FloatToBf16(g32.Get(i, j)) : FloatToHalf(g32.Get(i, j));
        uint16_t got;
        std::memcpy(&got, static_cast<const uint16_t*>(g16.data(i)) + j, 2);
        ASSERT_EQ(got, want) << DTypeName(dt) << " " << model.specs()[i].name << "[" << j << "]";
      }
    }
  }
}

// The loss scale enters once, at dL/dlogits; everything after is linear in it, and a power of two
// commutes with rounding, so the gradients scale exactly.
TEST(ByteLmMixedPrecisionTest, LossScaleMultipliesGradientsExactly) {
  const ByteLmConfig c = TinyConfig();
  ByteLmCpu model(c);
  const int batch = 7;
  const auto tokens = RandomTokens(batch, c.context, 8);
  HostTensors params = RandomParams(model.specs(), DType::kF32, 1);
  HostTensors g1(model.specs(), DType::kF32), g1024(model.specs(), DType::kF32);
  LossAndGrads(model, params, tokens, batch, 1.0f, &g1);
  LossAndGrads(model, params, tokens, batch, 1024.0f, &g1024);
  for (int i = 0; i < g1.size(); ++i) {
    for (int64_t j = 0; j < g1.numel(i); ++j) ASSERT_EQ(g1024.Get(i, j), 1024.0f * g1.Get(i, j));
  }
}

TEST(ByteLmCallbackTest, EachGradReadyOnceInReverseModuleOrderAndScopesBalanced) {
  ByteLmConfig c = TinyConfig();
  c.layers = 3;
  ByteLmCpu model(c);
  const int batch = 4;
  const auto tokens = RandomTokens(batch, c.context, 1);
  HostTensors params = RandomParams(model.specs(), DType::kBF16, 1);
  HostTensors grads(model.specs(), DType::kF32);
  ResidentParams provider(model.specs(), params.ParamViews());
  std::vector<int> held_when_ready;
  GradBuffers sink(grads.GradViews(), [&](int) { held_when_ready.push_back(provider.held()); });
  ByteLmActivations acts;
  ASSERT_OK(model.Forward(provider, tokens.data(), batch, &acts));
  EXPECT_EQ(provider.acquires(), 6);
  EXPECT_EQ(provider.held(), 0);
  ASSERT_OK(model.Backward(provider, &acts, 1.0f, sink));

  EXPECT_EQ(provider.acquires(), provider.releases());
  EXPECT_EQ(provider.held(), 0);
  EXPECT_EQ(provider.max_held(), 1);
  EXPECT_EQ(provider.acquire_log(),
            (std::vector<std::string>{"embed", "in_proj", "block0", "block1", "block2", "head", "head", "block2",
                                      "block1", "block0", "in_proj", "embed"}));
  for (int i = 0; i < static_cast<int>(model.specs().size()); ++i) {
    EXPECT_EQ(sink.ready_count()[i], 1) << model.specs()[i].name;
  }
  // Every gradient is reported while its module is held, modules in reverse order.
  EXPECT_EQ(held_when_ready, std::vector<int>(model.specs().size(), 1));
  std::vector<std::string> module_order;
  for (int i : sink.ready_order()) {
    const std::string& m = model.specs()[i].module;
    if (module_order.empty() || module_order.back() != m) module_order.push_back(m);
  }
  EXPECT_EQ(module_order, (std::vector<std::string>{"head", "block2", "block1", "block0", "in_proj", "embed"}));
}

TEST(ByteLmCallbackTest, BackwardOverwritesGradientBuffers) {
  const ByteLmConfig c = TinyConfig();
  ByteLmCpu model(c);
  const int batch = 5;
  const auto tokens = RandomTokens(batch, c.context, 4);
  HostTensors params = RandomParams(model.specs(), DType::kF32, 2);
  HostTensors clean(model.specs(), DType::kF32), dirty(model.specs(), DType::kF32);
  for (int i = 0; i < dirty.size(); ++i) {
    for (int64_t j = 0; j < dirty.numel(i); ++j) dirty.Set(i, j, std::numeric_limits<float>::quiet_NaN());
  }
  LossAndGrads(model, params, tokens, batch, 1.0f, &clean);
  LossAndGrads(model, params, tokens, batch, 1.0f, &dirty);
  for (int i = 0; i < clean.size(); ++i) EXPECT_EQ(clean.GetAll(i), dirty.GetAll(i));
}

// A provider that fails to acquire one module.
class FailingParams : public ParamProvider {
 public:
  FailingParams(ResidentParams* inner, std::string fail) : inner_(inner), fail_(std::move(fail)) {}
  Result<std::vector<ParamView>> Acquire(const std::string& m) override {
    if (m == fail_) return UnavailableError("gather of " + m + " failed");
    return inner_->Acquire(m);
  }
  Status Release(const std::string& m) override { return inner_->Release(m); }

 private:
  ResidentParams* inner_;
  std::string fail_;
};

TEST(ByteLmErrorTest, ProviderErrorPropagatesAndScopesStayBalanced) {
  const ByteLmConfig c = TinyConfig();
  ByteLmCpu model(c);
  const auto tokens = RandomTokens(2, c.context, 4);
  HostTensors params = RandomParams(model.specs(), DType::kF32, 2);
  ResidentParams inner(model.specs(), params.ParamViews());
  FailingParams failing(&inner, "block1");
  ByteLmActivations acts;
  auto loss = model.Forward(failing, tokens.data(), 2, &acts);
  ASSERT_FALSE(loss.ok());
  EXPECT_EQ(loss.status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(inner.held(), 0);
  EXPECT_EQ(inner.acquires(), inner.releases());

  HostTensors grads(model.specs(), DType::kF32);
  GradBuffers sink(grads.GradViews());
  EXPECT_EQ(model.Backward(inner, &acts, 1.0f, sink).code(), StatusCode::kFailedPrecondition);
}

const char kText[] =
    "It is a truth universally acknowledged, that a single man in possession of a good fortune, "
    "must be in want of a wife. However little known the feelings or views of such a man may be on "
    "his first entering a neighbourhood, this truth is so well fixed in the minds of the surrounding "
    "families, that he is considered the rightful property of some one or other of their daughters. ";

TEST(ByteLmTrainingTest, PlainSgdReducesTheLoss) {
  ByteLmConfig c;
  c.context = 4;
  c.embed_dim = 8;
  c.hidden = 32;
  c.ffn = 64;
  c.layers = 1;
  ByteLmCpu model(c);
  HostTensors params(model.specs(), DType::kF32);
  params.Init(model.specs(), 42);
  HostTensors grads(model.specs(), DType::kF32);
  ResidentParams provider(model.specs(), params.ParamViews());
  GradBuffers sink(grads.GradViews());
  ByteLmActivations acts;

  const std::string text = kText;
  const int batch = 32, steps = 60;
  std::vector<uint8_t> tokens(batch * (c.context + 1));
  uint64_t rng = 1;
  double first = 0, last = 0;
  for (int step = 0; step < steps; ++step) {
    for (int b = 0; b < batch; ++b) {
      rng = rng * 6364136223846793005ull + 1442695040888963407ull;
      const size_t start = (rng >> 33) % (text.size() - c.context);
      std::memcpy(&tokens[b * (c.context + 1)], text.data() + start, c.context + 1);
    }
    auto loss = model.Forward(provider, tokens.data(), batch, &acts);
    ASSERT_OK(loss);
    ASSERT_OK(model.Backward(provider, &acts, 1.0f, sink));
    for (int i = 0; i < params.size(); ++i) {
      float* p = static_cast<float*>(params.data(i));
      const float* g = static_cast<const float*>(grads.data(i));
      for (int64_t j = 0; j < params.numel(i); ++j) p[j] -= 0.5f * g[j];
    }
    if (step == 0) first = *loss;
    if (step >= steps - 5) last += *loss / 5;
  }
  EXPECT_NEAR(first, std::log(256.0), 0.5);
  EXPECT_LT(last, first - 2.0) << "first " << first << " last " << last;
}

TEST(ByteLmSampleTest, DeterministicForASeedAndGreedyAtZeroTemperature) {
  const ByteLmConfig c = TinyConfig();
  ByteLmCpu model(c);
  HostTensors params = RandomParams(model.specs(), DType::kF32, 5);
  ResidentParams provider(model.specs(), params.ParamViews());
  auto a = model.Sample(provider, "ab", 20, 1.0f, 3);
  auto b = model.Sample(provider, "ab", 20, 1.0f, 3);
  auto g1 = model.Sample(provider, "hello", 10, 0.0f, 1);
  auto g2 = model.Sample(provider, "hello", 10, 0.0f, 2);
  ASSERT_TRUE(a.ok() && b.ok() && g1.ok() && g2.ok());
  EXPECT_EQ(a->size(), 20u);
  EXPECT_EQ(*a, *b);
  EXPECT_EQ(*g1, *g2);
  EXPECT_EQ(provider.held(), 0);
}

}  // namespace
}  // namespace zero::examples
