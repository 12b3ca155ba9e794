#include "models/byte/byte_lm.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <sstream>
#include <type_traits>
#include <utility>

#include "models/cpu_gemm.h"
#include "runtime/hash.h"

namespace zero::examples {
namespace {

// ---- Dense kernels (row-major, contiguous rows): models/cpu_gemm.h's products. ------------------

using cpu_gemm::GemmNN;
using cpu_gemm::GemmNT;
using cpu_gemm::GemmTN;

template <typename T>
void AddBiasRows(int M, int N, const T* bias, T* C) {
  for (int i = 0; i < M; ++i) {
    T* __restrict c = C + static_cast<size_t>(i) * N;
    for (int j = 0; j < N; ++j) c[j] += bias[j];
  }
}

// out[N] = sum over rows of X[M,N]
template <typename T>
void ColumnSum(int M, int N, const T* X, T* out) {
  for (int j = 0; j < N; ++j) out[j] = T(0);
  for (int i = 0; i < M; ++i) {
    const T* __restrict x = X + static_cast<size_t>(i) * N;
    for (int j = 0; j < N; ++j) out[j] += x[j];
  }
}

template <typename T>
void LayerNormForward(int M, int N, T eps, const T* x, const T* gain, const T* bias, T* y, T* mean, T* rstd) {
  for (int i = 0; i < M; ++i) {
    const T* xr = x + static_cast<size_t>(i) * N;
    T* yr = y + static_cast<size_t>(i) * N;
    T s = 0;
    for (int j = 0; j < N; ++j) s += xr[j];
    const T mu = s / T(N);
    T v = 0;
    for (int j = 0; j < N; ++j) v += (xr[j] - mu) * (xr[j] - mu);
    const T r = T(1) / std::sqrt(v / T(N) + eps);
    for (int j = 0; j < N; ++j) yr[j] = (xr[j] - mu) * r * gain[j] + bias[j];
    mean[i] = mu;
    rstd[i] = r;
  }
}

// dx (= or +=) d LN(x) / dx applied to dy; dgain, dbias overwritten.
template <typename T>
void LayerNormBackward(int M, int N, const T* x, const T* mean, const T* rstd, const T* gain, const T* dy, T* dx,
                       bool accumulate, T* dgain, T* dbias) {
  for (int j = 0; j < N; ++j) dgain[j] = dbias[j] = T(0);
  for (int i = 0; i < M; ++i) {
    const T* xr = x + static_cast<size_t>(i) * N;
    const T* dyr = dy + static_cast<size_t>(i) * N;
    T* dxr = dx + static_cast<size_t>(i) * N;
    const T mu = mean[i], r = rstd[i];
    T m1 = 0, m2 = 0;
    for (int j = 0; j < N; ++j) {
      const T xhat = (xr[j] - mu) * r;
      const T dxhat = dyr[j] * gain[j];
      dgain[j] += dyr[j] * xhat;
      dbias[j] += dyr[j];
      m1 += dxhat;
      m2 += dxhat * xhat;
    }
    m1 /= T(N);
    m2 /= T(N);
    for (int j = 0; j < N; ++j) {
      const T xhat = (xr[j] - mu) * r;
      const T g = r * (dyr[j] * gain[j] - m1 - xhat * m2);
      dxr[j] = accumulate ? dxr[j] + g : g;
    }
  }
}

template <typename T>
T Gelu(T u) {
  return T(0.5) * u * (T(1) + std::erf(u * T(0.70710678118654752440)));
}

template <typename T>
T GeluGrad(T u) {
  const T cdf = T(0.5) * (T(1) + std::erf(u * T(0.70710678118654752440)));
  const T pdf = std::exp(T(-0.5) * u * u) * T(0.39894228040143267794);
  return cdf + u * pdf;
}

}  // namespace

// ---- Configuration and parameter list. ----------------------------------------------------------

Status ByteLmConfig::Validate() const {
  auto bad = [&](const char* what, int v) {
    return InvalidArgumentError(std::string("byte_lm.") + what + ": expected >= 1, got " + std::to_string(v));
  };
  if (context < 1) return bad("context", context);
  if (embed_dim < 1) return bad("embed_dim", embed_dim);
  if (hidden < 1) return bad("hidden", hidden);
  if (ffn < 1) return bad("ffn", ffn);
  if (layers < 0) return InvalidArgumentError("byte_lm.layers: expected >= 0, got " + std::to_string(layers));
  if (!(layer_norm_eps > 0.0f)) return InvalidArgumentError("byte_lm.layer_norm_eps: expected > 0");
  return OkStatus();
}

int64_t ByteLmConfig::NumParams() const {
  const int64_t k = context, d = embed_dim, h = hidden, f = ffn, L = layers;
  return 256 * d + (k * d + 1) * h + L * (2 * h * f + f + 3 * h) + 258 * h + 256;
}

std::string ByteLmConfig::ToString() const {
  std::ostringstream s;
  s << "k=" << context << " d=" << embed_dim << " h=" << hidden << " f=" << ffn << " L=" << layers;
  return s.str();
}

std::vector<ModelParamSpec> ByteLmParamSpecs(const ByteLmConfig& c) {
  const int64_t k = c.context, d = c.embed_dim, h = c.hidden, f = c.ffn;
  auto normal = [](std::string name, std::vector<int64_t> shape, std::string module, double std) {
    return ModelParamSpec{std::move(name), std::move(shape), std::move(module), InitKind::kNormal,
                          static_cast<float>(std)};
  };
  auto fill = [](std::string name, std::vector<int64_t> shape, std::string module, InitKind kind) {
    return ModelParamSpec{std::move(name), std::move(shape), std::move(module), kind, 0.0f};
  };
  std::vector<ModelParamSpec> p;
  p.push_back(normal("embed.table", {kByteVocab, d}, "embed", 1.0));
  p.push_back(normal("in_proj.weight", {k * d, h}, "in_proj", 1.0 / std::sqrt(double(k * d))));
  p.push_back(fill("in_proj.bias", {h}, "in_proj", InitKind::kZeros));
  const double residual_scale = 1.0 / std::sqrt(2.0 * std::max(1, c.layers));
  for (int l = 0; l < c.layers; ++l) {
    const std::string m = "block" + std::to_string(l);
    p.push_back(fill(m + ".ln.gain", {h}, m, InitKind::kOnes));
    p.push_back(fill(m + ".ln.bias", {h}, m, InitKind::kZeros));
    p.push_back(normal(m + ".fc1.weight", {h, f}, m, 1.0 / std::sqrt(double(h))));
    p.push_back(fill(m + ".fc1.bias", {f}, m, InitKind::kZeros));
    p.push_back(normal(m + ".fc2.weight", {f, h}, m, residual_scale / std::sqrt(double(f))));
    p.push_back(fill(m + ".fc2.bias", {h}, m, InitKind::kZeros));
  }
  p.push_back(fill("head.ln.gain", {h}, "head", InitKind::kOnes));
  p.push_back(fill("head.ln.bias", {h}, "head", InitKind::kZeros));
  p.push_back(normal("head.out.weight", {h, kByteVocab}, "head", 0.5 / std::sqrt(double(h))));
  p.push_back(fill("head.out.bias", {kByteVocab}, "head", InitKind::kZeros));
  return p;
}

// ---- Activations. ---------------------------------------------------------------------------------

template <typename T>
struct Acts {
  std::vector<T> x0;          // [B, k d]
  std::vector<T> resid;       // [L+1, B, h]: input of block l, and (l = L) of the head
  std::vector<T> ln;          // [L+1, B, h]: LayerNorm outputs
  std::vector<T> mean, rstd;  // [L+1, B]
  std::vector<T> pre, act;    // [L, B, f]: fc1 output before / after gelu
  std::vector<T> logits;      // [B, 256]
  std::vector<T> lse;         // [B]: log-sum-exp of each row
  // Backward scratch.
  std::vector<T> dresid, dln, dact, dlogits, dx0;
};

struct ByteLmActivations::State {
  int batch = 0;
  bool has_forward = false;
  double loss = 0.0;
  std::vector<uint8_t> tokens;  // [B, k+1]
  Acts<float> f;
  Acts<double> d;
  template <typename T>
  Acts<T>& Get();
};
template <>
Acts<float>& ByteLmActivations::State::Get<float>() {
  return f;
}
template <>
Acts<double>& ByteLmActivations::State::Get<double>() {
  return d;
}

ByteLmActivations::ByteLmActivations() : state_(std::make_unique<State>()) {}
ByteLmActivations::~ByteLmActivations() = default;
ByteLmActivations::ByteLmActivations(ByteLmActivations&&) noexcept = default;
ByteLmActivations& ByteLmActivations::operator=(ByteLmActivations&&) noexcept = default;
int ByteLmActivations::batch() const { return state_ ? state_->batch : 0; }
double ByteLmActivations::loss() const { return state_ ? state_->loss : 0.0; }

// ---- The math. ------------------------------------------------------------------------------------

class ByteLmCpu::Impl {
 public:
  virtual ~Impl() = default;
  virtual Status Forward(ParamProvider& params, const uint8_t* tokens, int batch, bool with_loss,
                         ByteLmActivations::State* st) = 0;
  virtual Status Backward(ParamProvider& params, ByteLmActivations::State* st, float loss_scale, GradSink& grads) = 0;
  // Row 0 of the last Forward's logits, as float.
  virtual std::vector<float> Logits0(ByteLmActivations::State* st) = 0;
};

namespace {

template <typename T>
class ModelT final : public ByteLmCpu::Impl {
 public:
  ModelT(const ByteLmConfig& c, const std::vector<ModelParamSpec>& specs, const std::vector<ModuleSpec>& modules)
      : c_(c), specs_(specs), modules_(modules) {
    int64_t max_module = 0;
    for (const ModuleSpec& m : modules_) {
      int64_t n = 0;
      for (int i : m.params) n += specs_[i].numel();
      max_module = std::max(max_module, n);
    }
    param_scratch_.resize(max_module);
    grad_scratch_.resize(max_module);
  }

  Status Forward(ParamProvider& params, const uint8_t* tokens, int B, bool with_loss,
                 ByteLmActivations::State* st) override {
    const int k = c_.context, d = c_.embed_dim, h = c_.hidden, f = c_.ffn, L = c_.layers;
    const int K0 = k * d, V = kByteVocab;
    const size_t Bh = static_cast<size_t>(B) * h, Bf = static_cast<size_t>(B) * f;
    st->has_forward = false;
    st->batch = B;
    st->tokens.assign(tokens, tokens + static_cast<size_t>(B) * (k + 1));
    Acts<T>& a = st->Get<T>();
    a.x0.resize(static_cast<size_t>(B) * K0);
    a.resid.resize((L + 1) * Bh);
    a.ln.resize((L + 1) * Bh);
    a.mean.resize(static_cast<size_t>(L + 1) * B);
    a.rstd.resize(static_cast<size_t>(L + 1) * B);
    a.pre.resize(L * Bf);
    a.act.resize(L * Bf);
    a.logits.resize(static_cast<size_t>(B) * V);
    a.lse.resize(B);

    {  // embed
      ModuleScope scope(params, modules_[0].name);
      std::vector<const T*> p;
      ZERO_RETURN_IF_ERROR(Load(scope, 0, &p));
      const T* table = p[0];
      for (int b = 0; b < B; ++b) {
        for (int j = 0; j < k; ++j) {
          const uint8_t tok = tokens[static_cast<size_t>(b) * (k + 1) + j];
          std::memcpy(&a.x0[static_cast<size_t>(b) * K0 + j * d], table + static_cast<size_t>(tok) * d, sizeof(T) * d);
        }
      }
      ZERO_RETURN_IF_ERROR(scope.Close());
    }
    {  // in_proj
      ModuleScope scope(params, modules_[1].name);
      std::vector<const T*> p;
      ZERO_RETURN_IF_ERROR(Load(scope, 1, &p));
      GemmNN(B, h, K0, a.x0.data(), p[0], a.resid.data());
      AddBiasRows(B, h, p[1], a.resid.data());
      ZERO_RETURN_IF_ERROR(scope.Close());
    }
    for (int l = 0; l < L; ++l) {
      ModuleScope scope(params, modules_[2 + l].name);
      std::vector<const T*> p;
      ZERO_RETURN_IF_ERROR(Load(scope, 2 + l, &p));
      const T* r = &a.resid[l * Bh];
      T* rn = &a.resid[(l + 1) * Bh];
      T* n = &a.ln[l * Bh];
      T* pre = &a.pre[l * Bf];
      T* act = &a.act[l * Bf];
      LayerNormForward(B, h, T(c_.layer_norm_eps), r, p[0], p[1], n, &a.mean[l * B], &a.rstd[l * B]);
      GemmNN(B, f, h, n, p[2], pre);
      AddBiasRows(B, f, p[3], pre);
      for (size_t i = 0; i < Bf; ++i) act[i] = Gelu(pre[i]);
      GemmNN(B, h, f, act, p[4], rn);
      AddBiasRows(B, h, p[5], rn);
      for (size_t i = 0; i < Bh; ++i) rn[i] += r[i];
      ZERO_RETURN_IF_ERROR(scope.Close());
    }
    {  // head
      ModuleScope scope(params, modules_[2 + L].name);
      std::vector<const T*> p;
      ZERO_RETURN_IF_ERROR(Load(scope, 2 + L, &p));
      T* n = &a.ln[L * Bh];
      LayerNormForward(B, h, T(c_.layer_norm_eps), &a.resid[L * Bh], p[0], p[1], n, &a.mean[L * B], &a.rstd[L * B]);
      GemmNN(B, V, h, n, p[2], a.logits.data());
      AddBiasRows(B, V, p[3], a.logits.data());
      ZERO_RETURN_IF_ERROR(scope.Close());
    }
    double loss = 0.0;
    for (int b = 0; b < B; ++b) {
      const T* z = &a.logits[static_cast<size_t>(b) * V];
      T mx = z[0];
      for (int v = 1; v < V; ++v) mx = std::max(mx, z[v]);
      T s = 0;
      for (int v = 0; v < V; ++v) s += std::exp(z[v] - mx);
      a.lse[b] = mx + std::log(s);
      if (with_loss) loss += double(a.lse[b] - z[tokens[static_cast<size_t>(b) * (k + 1) + k]]);
    }
    st->loss = with_loss ? loss / B : 0.0;
    st->has_forward = with_loss;
    return OkStatus();
  }

  Status Backward(ParamProvider& params, ByteLmActivations::State* st, float loss_scale, GradSink& grads) override {
    const int k = c_.context, d = c_.embed_dim, h = c_.hidden, f = c_.ffn, L = c_.layers;
    const int K0 = k * d, V = kByteVocab, B = st->batch;
    const size_t Bh = static_cast<size_t>(B) * h, Bf = static_cast<size_t>(B) * f;
    const uint8_t* tokens = st->tokens.data();
    Acts<T>& a = st->Get<T>();
    a.dresid.resize(Bh);
    a.dln.resize(Bh);
    a.dact.resize(Bf);
    a.dlogits.resize(static_cast<size_t>(B) * V);
    a.dx0.resize(static_cast<size_t>(B) * K0);

    // dL/dlogits of the mean loss, times loss_scale: (softmax - onehot) * loss_scale / B.
    const T coef = T(loss_scale) / T(B);
    for (int b = 0; b < B; ++b) {
      const T* z = &a.logits[static_cast<size_t>(b) * V];
      T* dz = &a.dlogits[static_cast<size_t>(b) * V];
      const int target = tokens[static_cast<size_t>(b) * (k + 1) + k];
      for (int v = 0; v < V; ++v) {
        dz[v] = (std::exp(z[v] - a.lse[b]) - (v == target ? T(1) : T(0))) * coef;
      }
    }

    {  // head: params ln.gain, ln.bias, out.weight, out.bias
      const int m = 2 + L;
      ModuleScope scope(params, modules_[m].name);
      std::vector<const T*> p;
      ZERO_RETURN_IF_ERROR(Load(scope, m, &p));
      std::vector<T*> g = GradSlots(m);
      GemmTN(h, V, B, &a.ln[L * Bh], a.dlogits.data(), g[2]);
      ZERO_RETURN_IF_ERROR(Emit(grads, m, 2, g[2]));
      ColumnSum(B, V, a.dlogits.data(), g[3]);
      ZERO_RETURN_IF_ERROR(Emit(grads, m, 3, g[3]));
      GemmNT(B, h, V, a.dlogits.data(), p[2], a.dln.data(), &transpose_);
      LayerNormBackward(B, h, &a.resid[L * Bh], &a.mean[L * B], &a.rstd[L * B], p[0], a.dln.data(), a.dresid.data(),
                        /*accumulate=*/false, g[0], g[1]);
      ZERO_RETURN_IF_ERROR(Emit(grads, m, 0, g[0]));
      ZERO_RETURN_IF_ERROR(Emit(grads, m, 1, g[1]));
      ZERO_RETURN_IF_ERROR(scope.Close());
    }
    for (int l = L - 1; l >= 0; --l) {
      // a.dresid holds dL/d r_{l+1}; it becomes dL/d r_l.
      const int m = 2 + l;
      ModuleScope scope(params, modules_[m].name);
      std::vector<const T*> p;
      ZERO_RETURN_IF_ERROR(Load(scope, m, &p));
      std::vector<T*> g = GradSlots(m);
      T* pre = &a.pre[l * Bf];
      const T* act = &a.act[l * Bf];
      GemmTN(f, h, B, act, a.dresid.data(), g[4]);
      ZERO_RETURN_IF_ERROR(Emit(grads, m, 4, g[4]));
      ColumnSum(B, h, a.dresid.data(), g[5]);
      ZERO_RETURN_IF_ERROR(Emit(grads, m, 5, g[5]));
      GemmNT(B, f, h, a.dresid.data(), p[4], a.dact.data(), &transpose_);
      for (size_t i = 0; i < Bf; ++i) a.dact[i] *= GeluGrad(pre[i]);
      GemmTN(h, f, B, &a.ln[l * Bh], a.dact.data(), g[2]);
      ZERO_RETURN_IF_ERROR(Emit(grads, m, 2, g[2]));
      ColumnSum(B, f, a.dact.data(), g[3]);
      ZERO_RETURN_IF_ERROR(Emit(grads, m, 3, g[3]));
      GemmNT(B, h, f, a.dact.data(), p[2], a.dln.data(), &transpose_);
      LayerNormBackward(B, h, &a.resid[l * Bh], &a.mean[l * B], &a.rstd[l * B], p[0], a.dln.data(), a.dresid.data(),
                        /*accumulate=*/true, g[0], g[1]);
      ZERO_RETURN_IF_ERROR(Emit(grads, m, 0, g[0]));
      ZERO_RETURN_IF_ERROR(Emit(grads, m, 1, g[1]));
      ZERO_RETURN_IF_ERROR(scope.Close());
    }
    {  // in_proj
      ModuleScope scope(params, modules_[1].name);
      std::vector<const T*> p;
      ZERO_RETURN_IF_ERROR(Load(scope, 1, &p));
      std::vector<T*> g = GradSlots(1);
      GemmTN(K0, h, B, a.x0.data(), a.dresid.data(), g[0]);
      ZERO_RETURN_IF_ERROR(Emit(grads, 1, 0, g[0]));
      ColumnSum(B, h, a.dresid.data(), g[1]);
      ZERO_RETURN_IF_ERROR(Emit(grads, 1, 1, g[1]));
      GemmNT(B, K0, h, a.dresid.data(), p[0], a.dx0.data(), &transpose_);
      ZERO_RETURN_IF_ERROR(scope.Close());
    }
    {  // embed: acquired like every module (uniform contract), though its gradient needs no values.
      ModuleScope scope(params, modules_[0].name);
      std::vector<const T*> p;
      ZERO_RETURN_IF_ERROR(Load(scope, 0, &p));
      std::vector<T*> g = GradSlots(0);
      T* dtable = g[0];
      std::fill(dtable, dtable + static_cast<size_t>(kByteVocab) * d, T(0));
      for (int b = 0; b < B; ++b) {
        for (int j = 0; j < k; ++j) {
          T* dst = dtable + static_cast<size_t>(tokens[static_cast<size_t>(b) * (k + 1) + j]) * d;
          const T* src = &a.dx0[static_cast<size_t>(b) * K0 + j * d];
          for (int c = 0; c < d; ++c) dst[c] += src[c];
        }
      }
      ZERO_RETURN_IF_ERROR(Emit(grads, 0, 0, dtable));
      ZERO_RETURN_IF_ERROR(scope.Close());
    }
    return OkStatus();
  }

  std::vector<float> Logits0(ByteLmActivations::State* st) override {
    const Acts<T>& a = st->Get<T>();
    return std::vector<float>(a.logits.begin(), a.logits.begin() + kByteVocab);
  }

 private:
  // Acquires module m and returns T pointers to its parameters: the provider's own memory when it
  // is already T, else converted copies in param_scratch_ (valid until the next Load).
  Status Load(ModuleScope& scope, int m, std::vector<const T*>* out) {
    const ModuleSpec& mod = modules_[m];
    ZERO_ASSIGN_OR_RETURN(std::vector<ParamView> views, scope.Acquire());
    if (views.size() != mod.params.size()) {
      return InvalidArgumentError("module " + mod.name + ": provider returned " + std::to_string(views.size()) +
                                  " views, expected " + std::to_string(mod.params.size()));
    }
    out->clear();
    size_t offset = 0;
    for (size_t j = 0; j < views.size(); ++j) {
      const ModelParamSpec& spec = specs_[mod.params[j]];
      const ParamView& v = views[j];
      if (v.data == nullptr) return InvalidArgumentError("parameter " + spec.name + ": null data");
      const int64_t n = spec.numel();
      if constexpr (std::is_same_v<T, float>) {
        if (v.dtype == DType::kF32) {
          out->push_back(static_cast<const float*>(v.data));
          continue;
        }
      }
      T* dst = &param_scratch_[offset];
      for (int64_t e = 0; e < n; ++e) dst[e] = T(LoadAsFloat(v.data, v.dtype, e));
      out->push_back(dst);
      offset += n;
    }
    return OkStatus();
  }

  // Gradient scratch for module m, one slot per parameter.
  std::vector<T*> GradSlots(int m) {
    std::vector<T*> slots;
    size_t offset = 0;
    for (int i : modules_[m].params) {
      slots.push_back(&grad_scratch_[offset]);
      offset += specs_[i].numel();
    }
    return slots;
  }

  // Writes the gradient of module m's j-th parameter into the sink's buffer and reports it ready.
  Status Emit(GradSink& sink, int m, int j, const T* g) {
    const int index = modules_[m].params[j];
    ZERO_ASSIGN_OR_RETURN(GradView view, sink.GradBuffer(index));
    if (view.data == nullptr) {
      return InvalidArgumentError("gradient of " + specs_[index].name + ": null buffer");
    }
    const int64_t n = specs_[index].numel();
    for (int64_t e = 0; e < n; ++e) StoreFromFloat(view.data, view.dtype, e, static_cast<float>(g[e]));
    return sink.GradReady(index);
  }

  const ByteLmConfig c_;
  const std::vector<ModelParamSpec>& specs_;
  const std::vector<ModuleSpec>& modules_;
  std::vector<T> param_scratch_;
  std::vector<T> grad_scratch_;
  std::vector<T> transpose_;
};

}  // namespace

// ---- Public API. ----------------------------------------------------------------------------------

ByteLmCpu::ByteLmCpu(const ByteLmConfig& config, CpuMath math)
    : config_(config), math_(math), specs_(ByteLmParamSpecs(config)), modules_(GroupByModule(specs_)) {
  ZERO_CHECK_MSG(config_.Validate().ok(), config_.Validate().ToString());
  if (math_ == CpuMath::kDouble) {
    impl_ = std::make_unique<ModelT<double>>(config_, specs_, modules_);
  } else {
    impl_ = std::make_unique<ModelT<float>>(config_, specs_, modules_);
  }
}

ByteLmCpu::~ByteLmCpu() = default;

Result<double> ByteLmCpu::Forward(ParamProvider& params, const uint8_t* tokens, int batch, ByteLmActivations* acts) {
  if (batch < 1) return InvalidArgumentError("byte_lm forward: batch must be >= 1");
  if (tokens == nullptr || acts == nullptr) return InvalidArgumentError("byte_lm forward: null argument");
  if (!acts->state_) acts->state_ = std::make_unique<ByteLmActivations::State>();
  ZERO_RETURN_IF_ERROR(impl_->Forward(params, tokens, batch, /*with_loss=*/true, acts->state_.get()));
  return acts->state_->loss;
}

Status ByteLmCpu::Backward(ParamProvider& params, ByteLmActivations* acts, float loss_scale, GradSink& grads) {
  if (acts == nullptr || !acts->state_ || !acts->state_->has_forward) {
    return FailedPreconditionError("byte_lm backward: no forward on these activations");
  }
  return impl_->Backward(params, acts->state_.get(), loss_scale, grads);
}

Result<std::string> ByteLmCpu::Sample(ParamProvider& params, std::string_view prompt, int n, float temperature,
                                      uint64_t seed) {
  const int k = config_.context;
  std::string text(prompt);
  if (static_cast<int>(text.size()) < k) text.insert(0, k - text.size(), ' ');
  const size_t start = text.size();
  ByteLmActivations acts;
  std::vector<uint8_t> row(k + 1, 0);
  uint64_t rng = seed;
  for (int t = 0; t < n; ++t) {
    std::memcpy(row.data(), text.data() + text.size() - k, k);
    ZERO_RETURN_IF_ERROR(impl_->Forward(params, row.data(), 1, /*with_loss=*/false, acts.state_.get()));
    std::vector<float> z = impl_->Logits0(acts.state_.get());
    int next = static_cast<int>(std::max_element(z.begin(), z.end()) - z.begin());
    if (temperature > 0.0f) {
      const float mx = z[next];
      double total = 0.0;
      std::vector<double> w(kByteVocab);
      for (int v = 0; v < kByteVocab; ++v) total += w[v] = std::exp(double(z[v] - mx) / temperature);
      double u = double(SplitMix64Next(&rng) >> 11) * (1.0 / 9007199254740992.0) * total;
      for (int v = 0; v < kByteVocab; ++v) {
        u -= w[v];
        if (u < 0.0) {
          next = v;
          break;
        }
      }
    }
    text.push_back(static_cast<char>(next));
  }
  return text.substr(start);
}

}  // namespace zero::examples
