#include "models/llama/cpu_model.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "models/llama/batch.h"
#include "models/llama/config.h"
#include "models/llama/params.h"
#include "models/model_api.h"
#include "models/model_api_testing.h"
#include "runtime/dtype.h"
#include "testing/status_matchers.h"

namespace zero::llm {
namespace {

using examples::GradBuffers;
using examples::GradSink;
using examples::GradView;
using examples::HostTensors;
using examples::InitKind;
using examples::InitParam;
using examples::ModelParamSpec;
using examples::ParamProvider;
using examples::ParamView;
using examples::RandomParams;
using examples::ResidentParams;
using examples::SameBits;

// A micro model: GQA with 4 query heads on 2 kv heads, head_dim 6 (so nh * hd = 24 != H = 8).
LlmConfig Micro(const char* arch, bool tied) {
  LlmConfig c;
  c.architecture = arch;
  c.vocab_size = 19;
  c.hidden_size = 8;
  c.intermediate_size = 12;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 6;
  c.max_position_embeddings = 16;
  c.rope_theta = 10000.0;
  c.rms_norm_eps = 1e-6;
  c.tie_word_embeddings = tied;
  EXPECT_OK(c.Validate());
  return c;
}

LlmConfig Tiny() {
  auto c = Preset("tiny");
  EXPECT_OK(c);
  return *c;
}

uint64_t Next(uint64_t* s) {
  *s = *s * 6364136223846793005ull + 1442695040888963407ull;
  return *s >> 33;
}

// Random ids; every 4th target (from position 1 of row 0 on) is ignored.
LlmBatch RandomBatch(const LlmConfig& c, int batch, int seq, uint64_t seed) {
  LlmBatch b;
  b.batch = batch;
  b.seq = seq;
  uint64_t s = seed;
  for (int i = 0; i < batch * seq; ++i) {
    b.inputs.push_back(static_cast<int32_t>(Next(&s) % c.vocab_size));
    b.targets.push_back(i % 4 == 1 ? kIgnoreIndex : static_cast<int32_t>(Next(&s) % c.vocab_size));
  }
  return b;
}

double Loss(LlmCpu& model, const HostTensors& params, const LlmBatch& batch) {
  ResidentParams provider(model.specs(), params.ParamViews());
  LlmActivations acts;
  auto loss = model.Forward(provider, batch, &acts);
  EXPECT_OK(loss);
  return loss.ok() ? *loss : 0.0;
}

double LossAndGrads(LlmCpu& model, const HostTensors& params, const LlmBatch& batch, float loss_scale,
                    HostTensors* grads) {
  ResidentParams provider(model.specs(), params.ParamViews());
  GradBuffers sink(grads->GradViews());
  LlmActivations acts;
  auto loss = model.Forward(provider, batch, &acts);
  EXPECT_OK(loss);
  Status st = model.Backward(provider, &acts, loss_scale, sink);
  EXPECT_OK(st);
  return loss.ok() ? *loss : 0.0;
}

struct Variant {
  const char* arch;
  bool tied;
};
const Variant kVariants[] = {
    {kQwen3Architecture, true}, {kQwen3Architecture, false}, {kLlamaArchitecture, true}, {kLlamaArchitecture, false}};

// An independent, direct reading of the contract's formulas (double, loops written for clarity,
// RoPE angles in double): catches layout errors a gradient check cannot see (head pairing, GQA
// mapping, the causal mask, the qk-norm placement, the score scale, which weight is the output).
double ReferenceLoss(const LlmConfig& c, const HostTensors& p, const LlmBatch& batch) {
  const int64_t H = c.hidden_size, I = c.intermediate_size, V = c.vocab_size, nh = c.num_attention_heads,
                nkv = c.num_key_value_heads, hd = c.head_dim, S = batch.seq;
  auto W = [&](int index, int64_t row, int64_t col, int64_t cols) { return double(p.Get(index, row * cols + col)); };
  auto rmsnorm = [&](const std::vector<double>& x, int index, int64_t offset, int64_t n) {
    double ss = 0;
    for (int64_t j = 0; j < n; ++j) ss += x[offset + j] * x[offset + j];
    const double r = 1.0 / std::sqrt(ss / n + c.rms_norm_eps);
    std::vector<double> y(n);
    for (int64_t j = 0; j < n; ++j) y[j] = x[offset + j] * r * p.Get(index, j);
    return y;
  };
  auto linear = [&](const std::vector<double>& x, int index, int64_t out, int64_t in) {
    std::vector<double> y(out, 0.0);
    for (int64_t o = 0; o < out; ++o) {
      for (int64_t k = 0; k < in; ++k) y[o] += W(index, o, k, in) * x[k];
    }
    return y;
  };
  auto rope = [&](std::vector<double>& v, int64_t offset, int64_t pos) {
    const int64_t half = hd / 2;
    for (int64_t i = 0; i < half; ++i) {
      const double angle = pos * std::pow(c.rope_theta, -2.0 * i / hd);
      const double a = v[offset + i], b = v[offset + i + half];
      v[offset + i] = a * std::cos(angle) - b * std::sin(angle);
      v[offset + i + half] = b * std::cos(angle) + a * std::sin(angle);
    }
  };
  double total = 0;
  int counted = 0;
  for (int b = 0; b < batch.batch; ++b) {
    std::vector<std::vector<double>> h(S, std::vector<double>(H));
    for (int64_t s = 0; s < S; ++s) {
      for (int64_t j = 0; j < H; ++j) h[s][j] = W(0, batch.inputs[b * S + s], j, H);
    }
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
      const LayerParamIndex x = LayerParams(c, l);
      std::vector<std::vector<double>> q(S), k(S), v(S);
      for (int64_t s = 0; s < S; ++s) {
        const std::vector<double> n = rmsnorm(h[s], x.input_norm, 0, H);
        q[s] = linear(n, x.q, nh * hd, H);
        k[s] = linear(n, x.k, nkv * hd, H);
        v[s] = linear(n, x.v, nkv * hd, H);
        if (c.qk_norm()) {
          for (int64_t j = 0; j < nh; ++j) {
            const std::vector<double> y = rmsnorm(q[s], x.q_norm, j * hd, hd);
            std::copy(y.begin(), y.end(), q[s].begin() + j * hd);
          }
          for (int64_t j = 0; j < nkv; ++j) {
            const std::vector<double> y = rmsnorm(k[s], x.k_norm, j * hd, hd);
            std::copy(y.begin(), y.end(), k[s].begin() + j * hd);
          }
        }
        for (int64_t j = 0; j < nh; ++j) rope(q[s], j * hd, s);
        for (int64_t j = 0; j < nkv; ++j) rope(k[s], j * hd, s);
      }
      for (int64_t s = 0; s < S; ++s) {
        std::vector<double> o(nh * hd, 0.0);
        for (int64_t j = 0; j < nh; ++j) {
          const int64_t kvh = j / (nh / nkv);
          std::vector<double> score(s + 1);
          double mx = -1e300;
          for (int64_t t = 0; t <= s; ++t) {
            double d = 0;
            for (int64_t e = 0; e < hd; ++e) d += q[s][j * hd + e] * k[t][kvh * hd + e];
            score[t] = d / std::sqrt(double(hd));
            mx = std::max(mx, score[t]);
          }
          double z = 0;
          for (double& e : score) z += (e = std::exp(e - mx));
          for (int64_t t = 0; t <= s; ++t) {
            for (int64_t e = 0; e < hd; ++e) o[j * hd + e] += score[t] / z * v[t][kvh * hd + e];
          }
        }
        const std::vector<double> a = linear(o, x.o, H, nh * hd);
        for (int64_t j = 0; j < H; ++j) h[s][j] += a[j];
      }
      for (int64_t s = 0; s < S; ++s) {
        const std::vector<double> n = rmsnorm(h[s], x.post_norm, 0, H);
        const std::vector<double> g = linear(n, x.gate, I, H), u = linear(n, x.up, I, H);
        std::vector<double> m(I);
        for (int64_t j = 0; j < I; ++j) m[j] = g[j] / (1.0 + std::exp(-g[j])) * u[j];
        const std::vector<double> d = linear(m, x.down, H, I);
        for (int64_t j = 0; j < H; ++j) h[s][j] += d[j];
      }
    }
    for (int64_t s = 0; s < S; ++s) {
      const int32_t target = batch.targets[b * S + s];
      if (target == kIgnoreIndex) continue;
      const std::vector<double> n = rmsnorm(h[s], FinalNormIndex(c), 0, H);
      const std::vector<double> z = linear(n, OutputWeightIndex(c), V, H);
      double mx = -1e300, sum = 0;
      for (double e : z) mx = std::max(mx, e);
      for (double e : z) sum += std::exp(e - mx);
      total += mx + std::log(sum) - z[target];
      ++counted;
    }
  }
  return counted > 0 ? total / counted : 0.0;
}

TEST(LlmCpuReferenceTest, LossMatchesADirectReadingOfTheFormulas) {
  for (const Variant& var : kVariants) {
    const LlmConfig c = Micro(var.arch, var.tied);
    LlmCpu model(c, CpuMath::kDouble);
    const LlmBatch batch = RandomBatch(c, 2, 9, 23);
    const HostTensors params = RandomParams(model.specs(), DType::kF32, 8);
    const double expected = ReferenceLoss(c, params, batch);
    // The model's RoPE angles are fp32 (the contract); the reference's are double: ~1e-7 apart.
    EXPECT_NEAR(Loss(model, params, batch), expected, 1e-6 * expected) << c.ToString();
    EXPECT_GT(expected, 0.5);
  }
}

// Analytic gradients (double math) against central differences of the double loss, for every
// element of every parameter, four variants (both architectures, tied and untied). Parameters are
// fp32, so the step actually taken is measured (fl(p + eps) - fl(p - eps)). Bound: |analytic -
// numeric| <= 1e-7 + 1e-5 |numeric| (truncation error ~eps^2 = 1e-8 relative, rounding of the
// double loss ~1e-12).
TEST(LlmCpuGradientTest, MatchesFiniteDifferencesForEveryParameter) {
  for (const Variant& var : kVariants) {
    const LlmConfig c = Micro(var.arch, var.tied);
    LlmCpu model(c, CpuMath::kDouble);
    const LlmBatch batch = RandomBatch(c, 2, 5, 17);
    HostTensors params = RandomParams(model.specs(), DType::kF32, 5);
    HostTensors grads(model.specs(), DType::kF32);
    const double loss = LossAndGrads(model, params, batch, 1.0f, &grads);
    EXPECT_GT(loss, 0.5);
    const float eps = 1e-4f;
    int64_t checked = 0;
    double worst = 0.0;
    for (int i = 0; i < params.size(); ++i) {
      double largest = 0.0;
      for (int64_t j = 0; j < params.numel(i); ++j) {
        const float p = params.Get(i, j);
        const float hi = p + eps, lo = p - eps;
        params.Set(i, j, hi);
        const double l_hi = Loss(model, params, batch);
        params.Set(i, j, lo);
        const double l_lo = Loss(model, params, batch);
        params.Set(i, j, p);
        const double numeric = (l_hi - l_lo) / (double(hi) - double(lo));
        const double analytic = grads.Get(i, j);
        const double err = std::abs(analytic - numeric);
        worst = std::max(worst, err / (1e-6 + std::abs(numeric)));
        largest = std::max(largest, std::abs(numeric));
        ASSERT_LE(err, 1e-7 + 1e-5 * std::abs(numeric)) << c.ToString() << " " << model.specs()[i].name << "[" << j
                                                        << "] analytic " << analytic << " numeric " << numeric;
        ++checked;
      }
      EXPECT_GT(largest, 1e-4) << model.specs()[i].name << ": a gradient that is all ~0 checks nothing";
    }
    EXPECT_EQ(checked, c.NumParams());
    char buf[64];
    std::snprintf(buf, sizeof(buf), "%.3g", worst);
    RecordProperty(std::string("worst_relative_error_") + var.arch + (var.tied ? "_tied" : "_untied"), buf);
  }
}

// The fp32 path computes the same function as the double path, to fp32 rounding.
TEST(LlmCpuGradientTest, FloatMathMatchesDouble) {
  for (const Variant& var : kVariants) {
    const LlmConfig c = Micro(var.arch, var.tied);
    LlmCpu model_f(c, CpuMath::kFloat), model_d(c, CpuMath::kDouble);
    const LlmBatch batch = RandomBatch(c, 3, 11, 4);
    HostTensors params = RandomParams(model_f.specs(), DType::kF32, 9);
    HostTensors gf(model_f.specs(), DType::kF32), gd(model_f.specs(), DType::kF32);
    const double lf = LossAndGrads(model_f, params, batch, 1.0f, &gf);
    const double ld = LossAndGrads(model_d, params, batch, 1.0f, &gd);
    EXPECT_NEAR(lf, ld, 1e-5 * ld);
    for (int i = 0; i < gf.size(); ++i) {
      float scale = 0;
      for (int64_t j = 0; j < gd.numel(i); ++j) scale = std::max(scale, std::abs(gd.Get(i, j)));
      for (int64_t j = 0; j < gd.numel(i); ++j) {
        ASSERT_NEAR(gf.Get(i, j), gd.Get(i, j), 2e-5f * scale + 1e-9f) << model_f.specs()[i].name << "[" << j << "]";
      }
    }
  }
}

// A provider and sink that log every call ("A:module", "R:module", "G:index") and check that each
// gradient is reported while its module is held.
class LoggingProvider : public ParamProvider {
 public:
  LoggingProvider(const std::vector<ModelParamSpec>& specs, std::vector<ParamView> views, std::vector<std::string>* log,
                  std::set<std::string>* held)
      : inner_(specs, std::move(views)), log_(log), held_(held) {}
  Result<std::vector<ParamView>> Acquire(const std::string& module) override {
    log_->push_back("A:" + module);
    auto v = inner_.Acquire(module);
    if (v.ok()) held_->insert(module);
    return v;
  }
  Status Release(const std::string& module) override {
    log_->push_back("R:" + module);
    held_->erase(module);
    return inner_.Release(module);
  }
  ResidentParams& inner() { return inner_; }

 private:
  ResidentParams inner_;
  std::vector<std::string>* log_;
  std::set<std::string>* held_;
};

class LoggingSink : public GradSink {
 public:
  LoggingSink(const std::vector<ModelParamSpec>& specs, std::vector<GradView> views, std::vector<std::string>* log,
              const std::set<std::string>* held)
      : specs_(specs), inner_(std::move(views)), log_(log), held_(held) {}
  Result<GradView> GradBuffer(int i) override { return inner_.GradBuffer(i); }
  Status GradReady(int i) override {
    log_->push_back("G:" + std::to_string(i));
    EXPECT_TRUE(held_->count(specs_[i].module)) << specs_[i].name << " ready while its module is not held";
    return inner_.GradReady(i);
  }
  GradBuffers& inner() { return inner_; }

 private:
  const std::vector<ModelParamSpec>& specs_;
  GradBuffers inner_;
  std::vector<std::string>* log_;
  const std::set<std::string>* held_;
};

// Removes the "G:" entries (checked separately) to compare the acquire/release sequence.
std::vector<std::string> ModuleEvents(const std::vector<std::string>& log) {
  std::vector<std::string> out;
  for (const std::string& e : log) {
    if (e[0] != 'G') out.push_back(e);
  }
  return out;
}

TEST(LlmCpuProtocolTest, ModuleOrderAndGradReadyFollowTheContract) {
  for (const Variant& var : kVariants) {
    const LlmConfig c = Micro(var.arch, var.tied);
    LlmCpu model(c);
    HostTensors params = RandomParams(model.specs(), DType::kF32, 1);
    HostTensors grads(model.specs(), DType::kF32);
    std::vector<std::string> log;
    std::set<std::string> held;
    LoggingProvider provider(model.specs(), params.ParamViews(), &log, &held);
    LoggingSink sink(model.specs(), grads.GradViews(), &log, &held);
    LlmActivations acts;
    ASSERT_OK(model.Forward(provider, RandomBatch(c, 2, 4, 3), &acts));
    const std::vector<std::string> forward_acquires = provider.inner().acquire_log();
    ASSERT_OK(model.Backward(provider, &acts, 1.0f, sink));

    std::vector<std::string> expected_acquires, expected_events;
    if (var.tied) {
      expected_acquires = {"embed", "layer0", "layer1", "head", "embed"};
      expected_events = {"A:embed",  "R:embed",  "A:layer0", "R:layer0", "A:layer1",
                         "R:layer1", "A:head",   "A:embed",  "R:embed",  "R:head",  // forward
                         "A:head",   "A:embed",  "R:embed",  "R:head",   "A:layer1",
                         "R:layer1", "A:layer0", "R:layer0", "A:embed",  "R:embed"};
    } else {
      expected_acquires = {"embed", "layer0", "layer1", "head"};
      expected_events = {"A:embed", "R:embed", "A:layer0", "R:layer0", "A:layer1", "R:layer1", "A:head",  "R:head",
                         "A:head",  "R:head",  "A:layer1", "R:layer1", "A:layer0", "R:layer0", "A:embed", "R:embed"};
    }
    EXPECT_EQ(forward_acquires, expected_acquires) << c.ToString();
    EXPECT_EQ(ModuleEvents(log), expected_events) << c.ToString();
    EXPECT_EQ(provider.inner().held(), 0);
    EXPECT_EQ(provider.inner().max_held(), var.tied ? 2 : 1);
    EXPECT_EQ(provider.inner().acquires(), provider.inner().releases());
    // Exactly once per parameter; the embedding's (tied: after the head's part) at the very end.
    EXPECT_EQ(sink.inner().ready_count(), std::vector<int>(model.specs().size(), 1)) << c.ToString();
    EXPECT_EQ(sink.inner().ready_order().back(), EmbedIndex());
  }
}

// A batch with head k >= 1 is the untied model whose lm_head is extra head k-1's weight: the same
// loss bits, the same gradient bits (the extra head's is the lm_head's), the lookup-only embedding
// gradient when tied, and no gradient for the model's own output weight or the unused extra head.
TEST(LlmCpuExtraHeadTest, AnExtraHeadIsTheUntiedModelWithItsWeightAsLmHead) {
  for (const Variant& var : kVariants) {
    LlmConfig c = Micro(var.arch, var.tied);
    c.extra_heads = 2;
    ASSERT_OK(c.Validate());
    const LlmConfig u = Micro(var.arch, /*tied=*/false);
    LlmCpu model(c), plain(u);
    HostTensors params = RandomParams(model.specs(), DType::kF32, 5);
    HostTensors plain_params(plain.specs(), DType::kF32);
    const int extra1 = ExtraHeadIndex(c, 1);
    ASSERT_EQ(model.specs()[extra1].name, "extra_heads.1.weight");
    ASSERT_EQ(model.specs()[extra1].module, "extra_head1");
    for (int i = 0; i <= FinalNormIndex(u); ++i) plain_params.SetAll(i, params.GetAll(i));
    plain_params.SetAll(LmHeadIndex(u), params.GetAll(extra1));

    LlmBatch batch = RandomBatch(c, 2, 5, 9);
    batch.head = 2;
    HostTensors grads(model.specs(), DType::kF32), plain_grads(plain.specs(), DType::kF32);
    std::vector<std::string> log;
    std::set<std::string> held;
    LoggingProvider provider(model.specs(), params.ParamViews(), &log, &held);
    LoggingSink sink(model.specs(), grads.GradViews(), &log, &held);
    LlmActivations acts;
    auto loss = model.Forward(provider, batch, &acts);
    ASSERT_OK(loss);
    ASSERT_OK(model.Backward(provider, &acts, 0.5f, sink));
    batch.head = 0;
    const double plain_loss = LossAndGrads(plain, plain_params, batch, 0.5f, &plain_grads);
    EXPECT_EQ(*loss, plain_loss) << c.ToString();
    for (int i = 0; i <= FinalNormIndex(u); ++i) {
      EXPECT_EQ(grads.GetAll(i), plain_grads.GetAll(i)) << model.specs()[i].name << " " << c.ToString();
    }
    EXPECT_EQ(grads.GetAll(extra1), plain_grads.GetAll(LmHeadIndex(u))) << c.ToString();

    std::vector<int> expected_ready(model.specs().size(), 1);
    expected_ready[ExtraHeadIndex(c, 0)] = 0;
    if (!var.tied) expected_ready[LmHeadIndex(c)] = 0;
    EXPECT_EQ(sink.inner().ready_count(), expected_ready) << c.ToString();
    const std::vector<std::string> expected_events = {
        "A:embed",  "R:embed",       "A:layer0",      "R:layer0",      "A:layer1",
        "R:layer1", "A:head",        "A:extra_head1", "R:extra_head1", "R:head",  // forward
        "A:head",   "A:extra_head1", "R:extra_head1", "R:head",        "A:layer1",
        "R:layer1", "A:layer0",      "R:layer0",      "A:embed",       "R:embed"};
    EXPECT_EQ(ModuleEvents(log), expected_events) << c.ToString();
    EXPECT_EQ(provider.inner().held(), 0);

    batch.head = 3;  // one past the last extra head
    LlmActivations bad;
    auto st = model.Forward(provider, batch, &bad);
    ASSERT_FALSE(st.ok());
    EXPECT_NE(st.status().message().find("head 3: expected 0 (the model's own) .. 2"), std::string::npos)
        << st.status().ToString();
    EXPECT_EQ(provider.inner().held(), 0);
  }
}

// A provider that fails one module's Acquire, and a sink that fails one GradReady: the model
// returns the error and leaves nothing acquired.
class FailingProvider : public ResidentParams {
 public:
  FailingProvider(const std::vector<ModelParamSpec>& specs, std::vector<ParamView> views, std::string fail, int on_call)
      : ResidentParams(specs, std::move(views)), fail_(std::move(fail)), on_call_(on_call) {}
  Result<std::vector<ParamView>> Acquire(const std::string& module) override {
    if (module == fail_ && ++calls_ == on_call_) return UnavailableError("injected: " + module);
    return ResidentParams::Acquire(module);
  }

 private:
  std::string fail_;
  int on_call_;
  int calls_ = 0;
};

class FailingSink : public GradBuffers {
 public:
  FailingSink(std::vector<GradView> views, int fail) : GradBuffers(std::move(views)), fail_(fail) {}
  Status GradReady(int i) override {
    if (i == fail_) return UnavailableError("injected ready " + std::to_string(i));
    return GradBuffers::GradReady(i);
  }

 private:
  int fail_;
};

TEST(LlmCpuProtocolTest, ErrorsReleaseEverything) {
  const LlmConfig c = Micro(kQwen3Architecture, true);
  LlmCpu model(c);
  HostTensors params = RandomParams(model.specs(), DType::kF32, 1);
  HostTensors grads(model.specs(), DType::kF32);
  const LlmBatch batch = RandomBatch(c, 1, 4, 2);
  // The second "embed" acquire is the tied head's in forward.
  for (const auto& [module, call] :
       std::vector<std::pair<std::string, int>>{{"layer1", 1}, {"embed", 2}, {"head", 1}}) {
    FailingProvider provider(model.specs(), params.ParamViews(), module, call);
    LlmActivations acts;
    auto loss = model.Forward(provider, batch, &acts);
    ASSERT_FALSE(loss.ok()) << module;
    EXPECT_NE(loss.status().message().find("injected"), std::string::npos);
    EXPECT_EQ(provider.held(), 0) << module;
    EXPECT_EQ(model.Backward(provider, &acts, 1.0f, *std::make_unique<GradBuffers>(grads.GradViews())).code(),
              StatusCode::kFailedPrecondition);
  }
  for (int fail : {FinalNormIndex(c), LayerParams(c, 0).q_norm, EmbedIndex()}) {
    ResidentParams provider(model.specs(), params.ParamViews());
    FailingSink sink(grads.GradViews(), fail);
    LlmActivations acts;
    ASSERT_OK(model.Forward(provider, batch, &acts));
    Status st = model.Backward(provider, &acts, 1.0f, sink);
    EXPECT_NE(st.message().find("injected ready"), std::string::npos) << st.ToString();
    EXPECT_EQ(provider.held(), 0) << fail;
  }
}

TEST(LlmCpuTest, UntrainedLossIsLogVocab) {
  const LlmConfig c = Tiny();
  LlmCpu model(c);
  HostTensors params(model.specs(), DType::kF32);
  params.Init(model.specs(), 42);
  const double loss = Loss(model, params, RandomBatch(c, 2, 64, 8));
  EXPECT_NEAR(loss, std::log(double(c.vocab_size)), 0.05) << loss;
}

TEST(LlmCpuTest, DeterministicAcrossRunsAndActivations) {
  const LlmConfig c = Micro(kQwen3Architecture, true);
  LlmCpu model(c);
  HostTensors params = RandomParams(model.specs(), DType::kF32, 3);
  const LlmBatch batch = RandomBatch(c, 3, 9, 5);
  ResidentParams provider(model.specs(), params.ParamViews());
  LlmActivations acts1, acts2;
  auto l1 = model.Forward(provider, batch, &acts1);
  auto l1_again = model.Forward(provider, batch, &acts1);
  auto l2 = model.Forward(provider, batch, &acts2);
  ASSERT_TRUE(l1.ok() && l1_again.ok() && l2.ok());
  EXPECT_EQ(std::memcmp(&*l1, &*l1_again, sizeof(double)), 0);
  EXPECT_EQ(std::memcmp(&*l1, &*l2, sizeof(double)), 0);
  HostTensors g1(model.specs(), DType::kF32), g2(model.specs(), DType::kF32), g3(model.specs(), DType::kF32);
  GradBuffers s1(g1.GradViews()), s2(g2.GradViews()), s3(g3.GradViews());
  ASSERT_OK(model.Backward(provider, &acts1, 1.0f, s1));
  ASSERT_OK(model.Backward(provider, &acts1, 1.0f, s2));  // not consumed
  ASSERT_OK(model.Backward(provider, &acts2, 1.0f, s3));
  EXPECT_TRUE(SameBits(g1, g2));
  EXPECT_TRUE(SameBits(g1, g3));
  EXPECT_EQ(acts1.counted_targets(), 27 - 7);  // positions 1, 5, 9, ... of 27 are ignored
  EXPECT_GT(acts1.bytes(), 0);

  // loss_scale multiplies every gradient (a power of two: exactly).
  HostTensors g4(model.specs(), DType::kF32);
  GradBuffers s4(g4.GradViews());
  ASSERT_OK(model.Backward(provider, &acts1, 1024.0f, s4));
  for (int i = 0; i < g1.size(); ++i) {
    for (int64_t j = 0; j < g1.numel(i); ++j) ASSERT_EQ(g4.Get(i, j), 1024.0f * g1.Get(i, j));
  }
}

// 16-bit parameters are converted on load and gradients rounded on store, nothing else: the result
// equals the fp32 model run on the rounded parameters, with its gradients rounded.
TEST(LlmCpuTest, SixteenBitParamsEqualRoundedFp32) {
  for (bool tied : {true, false}) {
    const LlmConfig c = Micro(kQwen3Architecture, tied);
    LlmCpu model(c);
    const LlmBatch batch = RandomBatch(c, 2, 7, 2);
    for (DType dt : {DType::kBF16, DType::kF16}) {
      HostTensors p16 = RandomParams(model.specs(), dt, 4);
      HostTensors p32(model.specs(), DType::kF32);
      for (int i = 0; i < p16.size(); ++i) p32.SetAll(i, p16.GetAll(i));
      HostTensors g16(model.specs(), dt), g32(model.specs(), DType::kF32);
      const double l16 = LossAndGrads(model, p16, batch, 1.0f, &g16);
      const double l32 = LossAndGrads(model, p32, batch, 1.0f, &g32);
      EXPECT_EQ(l16, l32) << DTypeName(dt);
      int64_t nonzero = 0;
      for (int i = 0; i < g16.size(); ++i) {
        for (int64_t j = 0; j < g16.numel(i); ++j) {
          float rounded = g32.Get(i, j);
          uint16_t bits = dt == DType::kBF16 ? FloatToBf16(rounded) : FloatToHalf(rounded);
          ASSERT_EQ(static_cast<const uint16_t*>(g16.data(i))[j], bits) << model.specs()[i].name << "[" << j << "]";
          nonzero += bits != 0;
        }
      }
      EXPECT_GT(nonzero, c.NumParams() / 2);
    }
  }
}

TEST(LlmCpuTest, AllTargetsIgnoredGivesZeroLossAndGradients) {
  const LlmConfig c = Micro(kLlamaArchitecture, true);
  LlmCpu model(c);
  HostTensors params = RandomParams(model.specs(), DType::kF32, 3);
  LlmBatch batch = RandomBatch(c, 2, 6, 1);
  batch.targets.assign(batch.targets.size(), kIgnoreIndex);
  HostTensors grads(model.specs(), DType::kF32);
  for (int i = 0; i < grads.size(); ++i) grads.SetAll(i, std::vector<float>(grads.numel(i), 7.0f));
  const double loss = LossAndGrads(model, params, batch, 1.0f, &grads);
  EXPECT_EQ(loss, 0.0);
  for (int i = 0; i < grads.size(); ++i) {
    for (int64_t j = 0; j < grads.numel(i); ++j) ASSERT_EQ(grads.Get(i, j), 0.0f) << model.specs()[i].name;
  }
}

TEST(LlmCpuTest, BadBatchesNameRowAndPosition) {
  const LlmConfig c = Micro(kQwen3Architecture, false);
  LlmCpu model(c);
  HostTensors params = RandomParams(model.specs(), DType::kF32, 3);
  ResidentParams provider(model.specs(), params.ParamViews());
  LlmActivations acts;

  LlmBatch b = RandomBatch(c, 2, 5, 1);
  b.inputs[1 * 5 + 3] = static_cast<int32_t>(c.vocab_size);
  auto r = model.Forward(provider, b, &acts);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("input id 19 at row 1, position 3"), std::string::npos) << r.status().message();

  b = RandomBatch(c, 2, 5, 1);
  b.targets[4] = -1;
  r = model.Forward(provider, b, &acts);
  EXPECT_NE(r.status().message().find("target id -1 at row 0, position 4"), std::string::npos) << r.status().message();

  b = RandomBatch(c, 1, 17, 1);
  r = model.Forward(provider, b, &acts);
  EXPECT_NE(r.status().message().find("seq 17 exceeds max_position_embeddings 16"), std::string::npos)
      << r.status().message();

  b = RandomBatch(c, 2, 5, 1);
  b.targets.pop_back();
  EXPECT_FALSE(model.Forward(provider, b, &acts).ok());
  EXPECT_EQ(provider.held(), 0);  // refused before anything was acquired
  EXPECT_EQ(provider.acquires(), 0);

  EXPECT_FALSE(model.Logits(provider, {}).ok());
  auto bad = model.Logits(provider, {1, 2, 99});
  EXPECT_NE(bad.status().message().find("row 0, position 2"), std::string::npos) << bad.status().message();
  EXPECT_FALSE(model.Logits(provider, std::vector<int32_t>(17, 1)).ok());

  // Backward needs a forward of this model's math.
  LlmActivations fresh;
  HostTensors grads(model.specs(), DType::kF32);
  GradBuffers sink(grads.GradViews());
  EXPECT_EQ(model.Backward(provider, &fresh, 1.0f, sink).code(), StatusCode::kFailedPrecondition);
  ASSERT_OK(model.Forward(provider, RandomBatch(c, 1, 4, 1), &acts));
  LlmCpu model_d(c, CpuMath::kDouble);
  EXPECT_EQ(model_d.Backward(provider, &acts, 1.0f, sink).code(), StatusCode::kFailedPrecondition);
}

// Logits() is the last position of a forward; the causal mask keeps later tokens out of earlier
// positions (bitwise: rows never mix).
TEST(LlmCpuTest, LogitsAndCausality) {
  for (const Variant& var : kVariants) {
    const LlmConfig c = Micro(var.arch, var.tied);
    LlmCpu model(c);
    HostTensors params = RandomParams(model.specs(), DType::kF32, 6);
    ResidentParams provider(model.specs(), params.ParamViews());
    const std::vector<int32_t> ids = {3, 1, 4, 1, 5, 9, 2};
    auto logits = model.Logits(provider, ids);
    ASSERT_OK(logits);
    ASSERT_EQ(logits->size(), static_cast<size_t>(c.vocab_size));
    // The loss of one counted target at the last position is lse - z[target].
    LlmBatch b;
    b.batch = 1;
    b.seq = static_cast<int>(ids.size());
    b.inputs = ids;
    b.targets.assign(ids.size(), kIgnoreIndex);
    b.targets.back() = 11;
    double mx = -1e30, s = 0;
    for (float z : *logits) mx = std::max(mx, double(z));
    for (float z : *logits) s += std::exp(double(z) - mx);
    const double expected = mx + std::log(s) - (*logits)[11];
    EXPECT_NEAR(Loss(model, params, b), expected, 1e-5 * expected);

    // Position 3's loss does not see tokens 4..6.
    b.targets.assign(ids.size(), kIgnoreIndex);
    b.targets[3] = 2;
    const double before = Loss(model, params, b);
    b.inputs[4] = 0;
    b.inputs[6] = 18;
    const double after = Loss(model, params, b);
    EXPECT_EQ(before, after);
    b.inputs[2] = 0;
    EXPECT_NE(Loss(model, params, b), before);
  }
}

// Llama 3.1's scaling (factor 8, low 1, high 4, original 8192, theta 500000, head_dim 128) against
// the published formula evaluated in double: frequencies of wavelength under 2048 unchanged (the
// bits of the default rope), over 8192 divided by 8 exactly, those between interpolated; fp32
// against double within 4 ulps of the value. The torch evaluation itself was not run here.
TEST(LlmRopeTest, Llama3ScalingFollowsTheFormula) {
  const int64_t hd = 128;
  const double theta = 500000.0;
  RopeScaling rs;
  rs.rope_type = "llama3";
  rs.factor = 8.0;
  rs.low_freq_factor = 1.0;
  rs.high_freq_factor = 4.0;
  rs.original_max_position_embeddings = 8192;
  const std::vector<float> plain = RopeInverseFrequencies(hd, theta);
  const std::vector<float> scaled = RopeInverseFrequencies(hd, theta, rs);
  int high = 0, low = 0, mid = 0;
  for (int64_t i = 0; i < hd / 2; ++i) {
    const double f = plain[i];
    const double wavelen = 2.0 * M_PI / f;
    double want;
    if (wavelen < 2048.0) {
      EXPECT_EQ(scaled[i], plain[i]) << i;
      want = f;
      ++high;
    } else if (wavelen > 8192.0) {
      EXPECT_EQ(scaled[i], plain[i] / 8.0f) << i;
      want = f / 8.0;
      ++low;
    } else {
      const double smooth = (8192.0 / wavelen - 1.0) / 3.0;
      want = (1.0 - smooth) * f / 8.0 + smooth * f;
      EXPECT_GT(scaled[i], plain[i] / 8.0f) << i;
      EXPECT_LT(scaled[i], plain[i]) << i;
      ++mid;
    }
    EXPECT_NEAR(scaled[i], want, 4 * 1.2e-7 * want) << i;
  }
  // Llama 3.1's 64 frequencies fall in all three bands.
  EXPECT_GT(high, 0);
  EXPECT_GT(low, 0);
  EXPECT_GT(mid, 0);
  std::printf("llama3 rope: %d unchanged, %d divided, %d interpolated\n", high, low, mid);
  // The tables use the scaled frequencies.
  std::vector<float> cos, sin;
  RopeTables(hd, theta, 3000, &cos, &sin, rs);
  const float angle = 2999.0f * scaled[40];
  EXPECT_EQ(cos[2999 * 64 + 40], static_cast<float>(std::cos(static_cast<double>(angle))));
}

TEST(LlmRopeTest, TablesAndRotationMatchTheFormula) {
  const int64_t hd = 16;
  const double theta = 10000.0;
  const int seq = 40;
  std::vector<float> cos, sin;
  RopeTables(hd, theta, seq, &cos, &sin);
  ASSERT_EQ(cos.size(), static_cast<size_t>(seq * hd / 2));
  const std::vector<float> inv = RopeInverseFrequencies(hd, theta);
  for (int64_t i = 0; i < hd / 2; ++i) {
    // 1 / theta^(2i/d) to fp32 rounding.
    EXPECT_NEAR(inv[i], std::pow(theta, -2.0 * i / hd), 2e-7 * std::pow(theta, -2.0 * i / hd)) << i;
  }
  for (int i = 0; i < hd / 2; ++i) {
    EXPECT_EQ(cos[i], 1.0f);
    EXPECT_EQ(sin[i], 0.0f);
  }
  // One vector at position 37 against the rotate-half formula, pair (i, i + 8).
  const int pos = 37;
  std::vector<float> x(hd), y(hd);
  for (int i = 0; i < hd; ++i) x[i] = 0.1f * float(i) - 0.7f;
  y = x;
  ApplyRope(hd, &cos[pos * hd / 2], &sin[pos * hd / 2], y.data());
  for (int i = 0; i < hd / 2; ++i) {
    const double angle = double(float(pos) * inv[i]);
    const double e0 = x[i] * std::cos(angle) - x[i + hd / 2] * std::sin(angle);
    const double e1 = x[i + hd / 2] * std::cos(angle) + x[i] * std::sin(angle);
    EXPECT_NEAR(y[i], e0, 1e-6) << i;
    EXPECT_NEAR(y[i + hd / 2], e1, 1e-6) << i;
  }
  // Relative positions: <rope(q, m), rope(k, n)> depends on m - n only.
  std::vector<float> q(hd), k(hd);
  for (int i = 0; i < hd; ++i) {
    q[i] = std::sin(1.3f * i);
    k[i] = std::cos(0.7f * i + 0.2f);
  }
  auto dot_at = [&](int m, int n) {
    std::vector<float> a = q, b = k;
    ApplyRope(hd, &cos[m * hd / 2], &sin[m * hd / 2], a.data());
    ApplyRope(hd, &cos[n * hd / 2], &sin[n * hd / 2], b.data());
    double d = 0;
    for (int i = 0; i < hd; ++i) d += double(a[i]) * b[i];
    return d;
  };
  EXPECT_NEAR(dot_at(9, 4), dot_at(30, 25), 1e-4);
  EXPECT_NEAR(dot_at(3, 3), dot_at(0, 0), 1e-4);
  EXPECT_GT(std::abs(dot_at(9, 4) - dot_at(9, 5)), 1e-3);
}

// The tiny preset at batch 8 x seq 128 (1024 tokens): forward + backward on one core.
TEST(LlmCpuTest, TinyPresetStepTime) {
  const LlmConfig c = Tiny();
  LlmCpu model(c);
  HostTensors params(model.specs(), DType::kF32);
  params.Init(model.specs(), 1);
  HostTensors grads(model.specs(), DType::kF32);
  const LlmBatch batch = RandomBatch(c, 8, 128, 3);
  ResidentParams provider(model.specs(), params.ParamViews());
  GradBuffers sink(grads.GradViews());
  LlmActivations acts;
  double best = 1e30;
  for (int rep = 0; rep < 3; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    ASSERT_OK(model.Forward(provider, batch, &acts));
    ASSERT_OK(model.Backward(provider, &acts, 1.0f, sink));
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.4f", best);
  RecordProperty("tiny_8x128_step_seconds", buf);
  std::printf("tiny preset, batch 8 x seq 128: forward+backward %.4f s, activations %.1f MiB\n", best,
              acts.bytes() / 1048576.0);
  EXPECT_LT(best, 1.0);
}

}  // namespace
}  // namespace zero::llm
