#include "tests/equivalence/test_model.h"

#include <cmath>

#include "runtime/hash.h"

namespace zero::equivalence {
namespace {

// Uniform in [-1, 1), 24 random bits: a pure function of (a, b, c, d).
float Uniform(uint64_t a, uint64_t b, uint64_t c, uint64_t d) {
  uint64_t h = SplitMix64(SplitMix64(SplitMix64(SplitMix64(a) ^ b) ^ c) ^ d);
  return static_cast<float>(h >> 40) * (1.0f / 8388608.0f) - 1.0f;
}

}  // namespace

std::vector<ParamSpec> ModelParams(const ModelDims& d) {
  return {
      {"embed.weight", {d.d_in, d.hidden}, "embed"},
      {"embed.bias", {d.hidden}, "embed"},
      {"block.weight", {d.hidden, d.hidden}, "block"},
      {"block.bias", {d.hidden}, "block"},
      {"head_a.weight", {d.hidden, d.out}, "head_a"},
      {"head_b.weight", {d.hidden, d.out}, "head_b"},
      {"gain", {}, "gain"},
  };
}

std::vector<ModuleInfo> ModelModules() {
  return {{"embed", {kEmbedW, kEmbedB}},
          {"block", {kBlockW, kBlockB}},
          {"head_a", {kHeadAW}},
          {"head_b", {kHeadBW}},
          {"gain", {kGain}}};
}

int64_t Numel(const ParamSpec& spec) {
  int64_t n = 1;
  for (int64_t s : spec.shape) n *= s;
  return n;
}

void InitValues(const ModelDims& d, int index, float* out) {
  const ParamSpec spec = ModelParams(d)[index];
  const int64_t n = Numel(spec);
  float scale = 0.1f;
  switch (index) {
    case kEmbedW:
      scale = 1.0f / std::sqrt(static_cast<float>(d.d_in));
      break;
    case kBlockW:
    case kHeadAW:
    case kHeadBW:
      scale = 1.0f / std::sqrt(static_cast<float>(d.hidden));
      break;
    default:
      break;
  }
  for (int64_t i = 0; i < n; ++i) out[i] = scale * Uniform(1000 + index, static_cast<uint64_t>(i), 7, 11);
  if (index == kGain) out[0] = 0.8f;  // not representable in bf16/fp16
}

Batch MakeBatch(const ModelDims& d, int rank, int window, int micro, float target_scale) {
  Batch b;
  b.x.resize(static_cast<size_t>(d.batch) * d.d_in);
  b.target.resize(static_cast<size_t>(d.batch) * d.out);
  for (size_t i = 0; i < b.x.size(); ++i) b.x[i] = Uniform(rank + 1, window + 1, micro + 1, 2 * i);
  for (size_t i = 0; i < b.target.size(); ++i) {
    b.target[i] = target_scale * Uniform(rank + 1, window + 1, micro + 1, 2 * i + 1);
  }
  return b;
}

bool ParamUsed(int index, Heads heads) {
  if (index == kHeadAW) return heads.a;
  if (index == kHeadBW) return heads.b;
  return true;
}

float ForwardBackward(const ModelDims& d, const std::vector<std::vector<float>>& p, const Batch& batch, Heads heads,
                      float seed, std::vector<std::vector<float>>* grads) {
  const int B = d.batch, I = d.d_in, H = d.hidden, O = d.out;
  const std::vector<float>& W0 = p[kEmbedW];
  const std::vector<float>& b0 = p[kEmbedB];
  const std::vector<float>& W1 = p[kBlockW];
  const std::vector<float>& b1 = p[kBlockB];
  const std::vector<float>& Wa = p[kHeadAW];
  const std::vector<float>& Wb = p[kHeadBW];
  const float g = p[kGain][0];

  std::vector<float> a0(B * H), a1(B * H), t1(B * H), u(B * O, 0.0f), y(B * O);
  for (int n = 0; n < B; ++n) {
    for (int j = 0; j < H; ++j) {
      float z = b0[j];
      for (int i = 0; i < I; ++i) z += batch.x[n * I + i] * W0[i * H + j];
      a0[n * H + j] = std::tanh(z);
    }
    for (int j = 0; j < H; ++j) {
      float z = b1[j];
      for (int i = 0; i < H; ++i) z += a0[n * H + i] * W1[i * H + j];
      t1[n * H + j] = std::tanh(z);
      a1[n * H + j] = t1[n * H + j] + a0[n * H + j];
    }
    for (int k = 0; k < O; ++k) {
      float s = 0.0f;
      if (heads.a) {
        for (int j = 0; j < H; ++j) s += a1[n * H + j] * Wa[j * O + k];
      }
      if (heads.b) {
        for (int j = 0; j < H; ++j) s += a1[n * H + j] * Wb[j * O + k];
      }
      u[n * O + k] = s;
      y[n * O + k] = g * s;
    }
  }
  float loss = 0.0f;
  for (int i = 0; i < B * O; ++i) {
    float e = y[i] - batch.target[i];
    loss += e * e;
  }
  loss = loss / static_cast<float>(B * O);

  // Backward, seeded with `seed` (the loss scale divided by the user's loss divisor).
  const float coef = (2.0f / static_cast<float>(B * O)) * seed;
  std::vector<float> dy(B * O), du(B * O);
  float dg = 0.0f;
  for (int i = 0; i < B * O; ++i) {
    dy[i] = (y[i] - batch.target[i]) * coef;
    dg += dy[i] * u[i];
    du[i] = g * dy[i];
  }
  grads->assign(kNumParams, {});
  std::vector<std::vector<float>>& G = *grads;
  for (int i = 0; i < kNumParams; ++i) {
    if (ParamUsed(i, heads)) G[i].assign(p[i].size(), 0.0f);
  }
  G[kGain][0] = dg;
  std::vector<float> da1(B * H, 0.0f);
  for (int n = 0; n < B; ++n) {
    for (int j = 0; j < H; ++j) {
      float s = 0.0f;
      for (int k = 0; k < O; ++k) {
        if (heads.a) s += du[n * O + k] * Wa[j * O + k];
        if (heads.b) s += du[n * O + k] * Wb[j * O + k];
      }
      da1[n * H + j] = s;
    }
  }
  for (int j = 0; j < H; ++j) {
    for (int k = 0; k < O; ++k) {
      float s = 0.0f;
      for (int n = 0; n < B; ++n) s += a1[n * H + j] * du[n * O + k];
      if (heads.a) G[kHeadAW][j * O + k] = s;
      if (heads.b) G[kHeadBW][j * O + k] = s;
    }
  }
  std::vector<float> dz1(B * H), da0(B * H), dz0(B * H);
  for (int n = 0; n < B; ++n) {
    for (int j = 0; j < H; ++j) {
      float t = t1[n * H + j];
      dz1[n * H + j] = da1[n * H + j] * (1.0f - t * t);
    }
  }
  for (int i = 0; i < H; ++i) {
    for (int j = 0; j < H; ++j) {
      float s = 0.0f;
      for (int n = 0; n < B; ++n) s += a0[n * H + i] * dz1[n * H + j];
      G[kBlockW][i * H + j] = s;
    }
  }
  for (int j = 0; j < H; ++j) {
    float s = 0.0f;
    for (int n = 0; n < B; ++n) s += dz1[n * H + j];
    G[kBlockB][j] = s;
  }
  for (int n = 0; n < B; ++n) {
    for (int i = 0; i < H; ++i) {
      float s = da1[n * H + i];  // residual
      for (int j = 0; j < H; ++j) s += dz1[n * H + j] * W1[i * H + j];
      da0[n * H + i] = s;
      float a = a0[n * H + i];
      dz0[n * H + i] = s * (1.0f - a * a);
    }
  }
  for (int i = 0; i < I; ++i) {
    for (int j = 0; j < H; ++j) {
      float s = 0.0f;
      for (int n = 0; n < B; ++n) s += batch.x[n * I + i] * dz0[n * H + j];
      G[kEmbedW][i * H + j] = s;
    }
  }
  for (int j = 0; j < H; ++j) {
    float s = 0.0f;
    for (int n = 0; n < B; ++n) s += dz0[n * H + j];
    G[kEmbedB][j] = s;
  }
  return loss;
}

}  // namespace zero::equivalence
