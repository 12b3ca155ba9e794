#include "models/llama/cpu_model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <type_traits>
#include <utility>

#include "models/cpu_gemm.h"
#include "models/llama/params.h"
#include "runtime/dtype.h"

namespace zero::llm {

using examples::GradSink;
using examples::GradView;
using examples::ModelParamSpec;
using examples::ModuleScope;
using examples::ModuleSpec;
using examples::ParamProvider;
using examples::ParamView;

// ---- RoPE tables. ---------------------------------------------------------------------------------

std::vector<float> RopeInverseFrequencies(int64_t head_dim, double theta, const RopeScaling& scaling) {
  const int64_t half = head_dim / 2;
  std::vector<float> inv(half);
  const float base = static_cast<float>(theta);
  for (int64_t i = 0; i < half; ++i) {
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(head_dim);  // fp32, as HF
    // theta^exponent correctly rounded to fp32 (computed in double), then the fp32 reciprocal.
    const float power = static_cast<float>(std::pow(static_cast<double>(base), static_cast<double>(exponent)));
    inv[i] = 1.0f / power;
  }
  if (scaling.rope_type == "llama3") {
    const float factor = static_cast<float>(scaling.factor);
    const float low = static_cast<float>(scaling.low_freq_factor);
    const float old_len = static_cast<float>(scaling.original_max_position_embeddings);
    const double low_wavelen = static_cast<double>(scaling.original_max_position_embeddings) / scaling.low_freq_factor;
    const double high_wavelen =
        static_cast<double>(scaling.original_max_position_embeddings) / scaling.high_freq_factor;
    const float two_pi = static_cast<float>(2.0 * 3.14159265358979323846);
    const float span = static_cast<float>(scaling.high_freq_factor - scaling.low_freq_factor);
    for (int64_t i = 0; i < half; ++i) {
      const float f = inv[i];
      const float wavelen = (1.0f / f) * two_pi;  // torch: scalar / tensor is reciprocal() * scalar
      const float scaled = wavelen > low_wavelen ? f / factor : f;
      if (wavelen < high_wavelen || wavelen > low_wavelen) {
        inv[i] = scaled;
        continue;
      }
      const float smooth = ((1.0f / wavelen) * old_len - low) / span;
      inv[i] = (1.0f - smooth) * scaled / factor + smooth * scaled;
    }
  }
  return inv;
}

void RopeTables(int64_t head_dim, double theta, int seq, std::vector<float>* cos, std::vector<float>* sin,
                const RopeScaling& scaling) {
  const int64_t half = head_dim / 2;
  const std::vector<float> inv = RopeInverseFrequencies(head_dim, theta, scaling);
  cos->resize(static_cast<size_t>(seq) * half);
  sin->resize(static_cast<size_t>(seq) * half);
  for (int pos = 0; pos < seq; ++pos) {
    for (int64_t i = 0; i < half; ++i) {
      const float angle = static_cast<float>(pos) * inv[i];  // one fp32 product
      (*cos)[pos * half + i] = static_cast<float>(std::cos(static_cast<double>(angle)));
      (*sin)[pos * half + i] = static_cast<float>(std::sin(static_cast<double>(angle)));
    }
  }
}

namespace {

template <typename T>
void RopeForward(int64_t half, const T* c, const T* s, T* x) {
  for (int64_t i = 0; i < half; ++i) {
    const T a = x[i], b = x[i + half];
    x[i] = a * c[i] - b * s[i];
    x[i + half] = b * c[i] + a * s[i];
  }
}

// The transpose of the rotation (its inverse): applied to the gradient.
template <typename T>
void RopeBackward(int64_t half, const T* c, const T* s, T* g) {
  for (int64_t i = 0; i < half; ++i) {
    const T a = g[i], b = g[i + half];
    g[i] = a * c[i] + b * s[i];
    g[i + half] = b * c[i] - a * s[i];
  }
}

}  // namespace

void ApplyRope(int64_t head_dim, const float* cos_row, const float* sin_row, float* x) {
  RopeForward<float>(head_dim / 2, cos_row, sin_row, x);
}

namespace {

// ---- Dense kernels (row-major): models/cpu_gemm.h's products. --------------------------------------

// Y[M, out] = X[M, in] W^T for a weight in HF layout W[out, in] (transposed once into `scratch`).
template <typename T>
void LinearForward(int64_t M, int64_t out, int64_t in, const T* X, const T* W, T* Y, std::vector<T>* scratch) {
  cpu_gemm::GemmNT(M, out, in, X, W, Y, scratch);
}

// dX[M, in] (= or +=) dY[M, out] W[out, in].
template <typename T>
void LinearBackwardInput(int64_t M, int64_t out, int64_t in, const T* dY, const T* W, T* dX, bool accumulate) {
  cpu_gemm::GemmNN(M, in, out, dY, W, dX, accumulate);
}

// dW[out, in] = dY[M, out]^T X[M, in]: sums over the M rows in order.
template <typename T>
void LinearBackwardWeight(int64_t M, int64_t out, int64_t in, const T* dY, const T* X, T* dW) {
  cpu_gemm::GemmTN(out, in, M, dY, X, dW);
}

// y = x / sqrt(mean(x^2) + eps) * w over rows of width n; rstd saved per row.
template <typename T>
void RmsNormForward(int64_t rows, int64_t n, T eps, const T* x, const T* w, T* y, T* rstd) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * n;
    T* yr = y + r * n;
    T ss = 0;
    for (int64_t j = 0; j < n; ++j) ss += xr[j] * xr[j];
    const T rs = T(1) / std::sqrt(ss / T(n) + eps);
    for (int64_t j = 0; j < n; ++j) yr[j] = (xr[j] * rs) * w[j];
    rstd[r] = rs;
  }
}

// With xhat = x * rstd and g = dy * w: dx = rstd * (g - xhat * mean(g * xhat)), dw = sum_rows dy xhat.
// dx is written or (accumulate) added; dw is overwritten.
template <typename T>
void RmsNormBackward(int64_t rows, int64_t n, const T* x, const T* rstd, const T* w, const T* dy, T* dx,
                     bool accumulate, T* dw) {
  for (int64_t j = 0; j < n; ++j) dw[j] = T(0);
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * n;
    const T* dyr = dy + r * n;
    T* dxr = dx + r * n;
    const T rs = rstd[r];
    T m = 0;
    for (int64_t j = 0; j < n; ++j) {
      const T xhat = xr[j] * rs;
      dw[j] += dyr[j] * xhat;
      m += dyr[j] * w[j] * xhat;
    }
    m /= T(n);
    for (int64_t j = 0; j < n; ++j) {
      const T xhat = xr[j] * rs;
      const T g = rs * (dyr[j] * w[j] - xhat * m);
      dxr[j] = accumulate ? dxr[j] + g : g;
    }
  }
}

template <typename T>
T Sigmoid(T x) {
  return T(1) / (T(1) + std::exp(-x));
}

// ---- Saved activations. -------------------------------------------------------------------------------

template <typename T>
struct LayerActs {
  std::vector<T> resid_in;        // [N, H] the layer's input
  std::vector<T> rstd_in;         // [N]
  std::vector<T> x_in;            // [N, H] input_layernorm output: the q/k/v projections' input
  std::vector<T> q_raw, k_raw;    // qk_norm only: projections before the per-head norm
  std::vector<T> q_rstd, k_rstd;  // qk_norm only: [N nh], [N nkv]
  std::vector<T> q, k, v;         // [N, nh hd], [N, nkv hd], [N, nkv hd]: q and k after norm and RoPE
  std::vector<T> probs;           // [B, nh, S, S]: softmax rows, zero above the diagonal
  std::vector<T> attn;            // [N, nh hd]: o_proj's input
  std::vector<T> resid_mid;       // [N, H] after the attention residual
  std::vector<T> rstd_mid;        // [N]
  std::vector<T> x_mid;           // [N, H] post_attention_layernorm output
  std::vector<T> gate, up, act;   // [N, I]: projections and silu(gate) * up
};

template <typename T>
struct Acts {
  std::vector<LayerActs<T>> layers;
  std::vector<T> resid_final, rstd_final, x_final;  // [R, H], [R], [R, H]: R = N or (logits mode) B
  std::vector<T> logits;                            // [R, V]
  std::vector<T> lse;                               // [R]
  std::vector<T> rope_cos, rope_sin;                // [S, hd / 2]
  // Backward scratch.
  std::vector<T> dh, dx, dlogits, dq, dk, dv, dattn, dgate, dup;
  std::vector<T> tied_grad;  // [V, H]: the embedding gradient while it is being assembled

  int64_t Bytes() const {
    size_t n = 0;
    auto add = [&n](const std::vector<T>& v) { n += v.capacity(); };
    for (const LayerActs<T>& l : layers) {
      for (const auto* v : {&l.resid_in, &l.rstd_in, &l.x_in, &l.q_raw, &l.k_raw, &l.q_rstd, &l.k_rstd, &l.q, &l.k,
                            &l.v, &l.probs, &l.attn, &l.resid_mid, &l.rstd_mid, &l.x_mid, &l.gate, &l.up, &l.act}) {
        add(*v);
      }
    }
    for (const auto* v : {&resid_final, &rstd_final, &x_final, &logits, &lse, &rope_cos, &rope_sin, &dh, &dx, &dlogits,
                          &dq, &dk, &dv, &dattn, &dgate, &dup, &tied_grad}) {
      add(*v);
    }
    return static_cast<int64_t>(n * sizeof(T));
  }
};

}  // namespace

struct LlmActivations::State {
  int batch = 0;
  int seq = 0;
  bool has_forward = false;
  CpuMath math = CpuMath::kFloat;
  double loss = 0.0;
  int64_t counted = 0;
  std::vector<int32_t> inputs, targets;
  OutputHead out;  // the batch's output head (LlmBatch::head)
  Acts<float> f;
  Acts<double> d;
  template <typename T>
  Acts<T>& Get() {
    if constexpr (std::is_same_v<T, float>) {
      return f;
    } else {
      return d;
    }
  }
};

LlmActivations::LlmActivations() : state_(std::make_unique<State>()) {}
LlmActivations::~LlmActivations() = default;
LlmActivations::LlmActivations(LlmActivations&&) noexcept = default;
LlmActivations& LlmActivations::operator=(LlmActivations&&) noexcept = default;
int LlmActivations::batch() const { return state_ ? state_->batch : 0; }
int LlmActivations::seq() const { return state_ ? state_->seq : 0; }
double LlmActivations::loss() const { return state_ ? state_->loss : 0.0; }
int64_t LlmActivations::counted_targets() const { return state_ ? state_->counted : 0; }
int64_t LlmActivations::bytes() const { return state_ ? state_->f.Bytes() + state_->d.Bytes() : 0; }

// ---- The math. -------------------------------------------------------------------------------------------

class LlmCpu::Impl {
 public:
  virtual ~Impl() = default;
  // all_logits: logits of every position and the loss; else only each row's last position.
  virtual Status Forward(ParamProvider& params, bool all_logits, LlmActivations::State* st) = 0;
  virtual Status Backward(ParamProvider& params, LlmActivations::State* st, float loss_scale, GradSink& grads) = 0;
  virtual std::vector<float> LogitsRow(LlmActivations::State* st, int64_t row) = 0;
};

namespace {

template <typename T>
class ModelT final : public LlmCpu::Impl {
 public:
  ModelT(const LlmConfig& c, const std::vector<ModelParamSpec>& specs, const std::vector<ModuleSpec>& modules)
      : c_(c),
        specs_(specs),
        modules_(modules),
        H_(c.hidden_size),
        I_(c.intermediate_size),
        V_(c.vocab_size),
        L_(c.num_hidden_layers),
        nh_(c.num_attention_heads),
        nkv_(c.num_key_value_heads),
        hd_(c.head_dim),
        qd_(nh_ * hd_),
        kvd_(nkv_ * hd_),
        eps_(static_cast<T>(c.rms_norm_eps)) {
    head_module_ = static_cast<int>(L_) + 1;
    final_norm_ = FinalNormIndex(c);
  }

  Status Forward(ParamProvider& params, bool all_logits, LlmActivations::State* st) override {
    const int64_t B = st->batch, S = st->seq, N = B * S;
    st->has_forward = false;
    Acts<T>& a = st->Get<T>();
    a.layers.resize(L_);
    {
      std::vector<float> cs, sn;
      RopeTables(hd_, c_.rope_theta, static_cast<int>(S), &cs, &sn, c_.rope_scaling);
      a.rope_cos.assign(cs.begin(), cs.end());
      a.rope_sin.assign(sn.begin(), sn.end());
    }

    std::vector<T> h(static_cast<size_t>(N * H_));  // the residual stream
    {                                               // embed
      ModuleScope scope(params, kEmbedModule);
      std::vector<const T*> p;
      ZERO_RETURN_IF_ERROR(Load(scope, 0, &param_scratch_, &p));
      for (int64_t n = 0; n < N; ++n) {
        std::memcpy(&h[n * H_], p[0] + static_cast<int64_t>(st->inputs[n]) * H_, sizeof(T) * H_);
      }
      ZERO_RETURN_IF_ERROR(scope.Close());
    }
    for (int64_t l = 0; l < L_; ++l) {
      ModuleScope scope(params, LayerModule(l));
      std::vector<const T*> p;
      ZERO_RETURN_IF_ERROR(Load(scope, static_cast<int>(1 + l), &param_scratch_, &p));
      LayerForward(l, B, S, p, &h, &a);
      ZERO_RETURN_IF_ERROR(scope.Close());
    }
    // Rows that get logits: every position, or the last of each row.
    const int64_t R = all_logits ? N : B;
    a.resid_final.resize(R * H_);
    if (all_logits) {
      a.resid_final.swap(h);
    } else {
      for (int64_t b = 0; b < B; ++b) std::memcpy(&a.resid_final[b * H_], &h[(b * S + S - 1) * H_], sizeof(T) * H_);
    }
    a.rstd_final.resize(R);
    a.x_final.resize(R * H_);
    a.logits.resize(R * V_);
    a.lse.resize(R);
    {  // head (+ embed when tied, or the batch's extra head)
      ModuleScope head(params, kHeadModule);
      std::vector<const T*> p;
      ZERO_RETURN_IF_ERROR(Load(head, head_module_, &param_scratch_, &p));
      ModuleScope out(params, OutModuleName(st->out));
      ZERO_ASSIGN_OR_RETURN(const T* w_out, LoadOutput(st->out, out, p));
      RmsNormForward(R, H_, eps_, a.resid_final.data(), p[0], a.x_final.data(), a.rstd_final.data());
      LinearForward(R, V_, H_, a.x_final.data(), w_out, a.logits.data(), &transpose_);
      ZERO_RETURN_IF_ERROR(out.Close());
      ZERO_RETURN_IF_ERROR(head.Close());
    }
    double loss = 0.0;
    int64_t counted = 0;
    for (int64_t r = 0; r < R; ++r) {
      const T* z = &a.logits[r * V_];
      T mx = z[0];
      for (int64_t v = 1; v < V_; ++v) mx = std::max(mx, z[v]);
      T s = 0;
      for (int64_t v = 0; v < V_; ++v) s += std::exp(z[v] - mx);
      a.lse[r] = mx + std::log(s);
      if (all_logits && st->targets[r] != kIgnoreIndex) {
        loss += static_cast<double>(a.lse[r] - z[st->targets[r]]);
        ++counted;
      }
    }
    st->counted = counted;
    st->loss = counted > 0 ? loss / static_cast<double>(counted) : 0.0;
    st->has_forward = all_logits;
    return OkStatus();
  }

  Status Backward(ParamProvider& params, LlmActivations::State* st, float loss_scale, GradSink& grads) override {
    const int64_t B = st->batch, S = st->seq, N = B * S;
    Acts<T>& a = st->Get<T>();
    a.dh.resize(N * H_);
    a.dx.resize(N * H_);
    a.dlogits.resize(N * V_);

    // dL/dlogits of loss_scale * mean loss: (softmax - onehot) * loss_scale / counted; zero for
    // ignored positions and everywhere when nothing counts.
    const T coef = st->counted > 0 ? T(loss_scale) / T(st->counted) : T(0);
    for (int64_t n = 0; n < N; ++n) {
      T* dz = &a.dlogits[n * V_];
      const int32_t target = st->targets[n];
      if (target == kIgnoreIndex || coef == T(0)) {
        std::fill(dz, dz + V_, T(0));
        continue;
      }
      const T* z = &a.logits[n * V_];
      for (int64_t v = 0; v < V_; ++v) dz[v] = std::exp(z[v] - a.lse[n]) * coef;
      dz[target] -= coef;
    }

    {  // head (+ embed when tied, or the batch's extra head)
      ModuleScope head(params, kHeadModule);
      std::vector<const T*> p;
      ZERO_RETURN_IF_ERROR(Load(head, head_module_, &param_scratch_, &p));
      ModuleScope out(params, OutModuleName(st->out));
      ZERO_ASSIGN_OR_RETURN(const T* w_out, LoadOutput(st->out, out, p));
      if (st->out.tied) {
        a.tied_grad.resize(V_ * H_);
        LinearBackwardWeight(N, V_, H_, a.dlogits.data(), a.x_final.data(), a.tied_grad.data());
      } else {
        T* g = GradScratch(V_ * H_);
        LinearBackwardWeight(N, V_, H_, a.dlogits.data(), a.x_final.data(), g);
        ZERO_RETURN_IF_ERROR(Emit(grads, st->out.weight, g));
      }
      LinearBackwardInput(N, V_, H_, a.dlogits.data(), w_out, a.dx.data(), false);
      T* g = GradScratch(H_);
      RmsNormBackward(N, H_, a.resid_final.data(), a.rstd_final.data(), p[0], a.dx.data(), a.dh.data(), false, g);
      ZERO_RETURN_IF_ERROR(Emit(grads, final_norm_, g));
      ZERO_RETURN_IF_ERROR(out.Close());
      ZERO_RETURN_IF_ERROR(head.Close());
    }
    for (int64_t l = L_ - 1; l >= 0; --l) {
      ModuleScope scope(params, LayerModule(l));
      std::vector<const T*> p;
      ZERO_RETURN_IF_ERROR(Load(scope, static_cast<int>(1 + l), &param_scratch_, &p));
      ZERO_RETURN_IF_ERROR(LayerBackward(l, B, S, p, &a, grads));
      ZERO_RETURN_IF_ERROR(scope.Close());
    }
    {  // embed: the lookup's gradient is a scatter-add of dh by input id, in token order.
      ModuleScope scope(params, kEmbedModule);
      std::vector<const T*> p;
      ZERO_RETURN_IF_ERROR(Load(scope, 0, &param_scratch_, &p));
      T* g = nullptr;
      if (st->out.tied) {
        g = a.tied_grad.data();  // already holds the lm_head's part
      } else {
        g = GradScratch(V_ * H_);
        std::fill(g, g + V_ * H_, T(0));
      }
      for (int64_t n = 0; n < N; ++n) {
        T* dst = g + static_cast<int64_t>(st->inputs[n]) * H_;
        const T* src = &a.dh[n * H_];
        for (int64_t j = 0; j < H_; ++j) dst[j] += src[j];
      }
      ZERO_RETURN_IF_ERROR(Emit(grads, EmbedIndex(), g));
      ZERO_RETURN_IF_ERROR(scope.Close());
    }
    return OkStatus();
  }

  std::vector<float> LogitsRow(LlmActivations::State* st, int64_t row) override {
    const Acts<T>& a = st->Get<T>();
    return std::vector<float>(a.logits.begin() + row * V_, a.logits.begin() + (row + 1) * V_);
  }

 private:
  // Positions of a layer's parameters in its module's views.
  struct Local {
    int in_norm, q, k, v, o, q_norm, k_norm, post_norm, gate, up, down;
  };
  Local LocalIndex() const {
    const LayerParamIndex x = LayerParams(c_, 0);
    auto rel = [&](int i) { return i < 0 ? -1 : i - x.first; };
    return Local{rel(x.input_norm), rel(x.q),         rel(x.k),    rel(x.v),  rel(x.o),   rel(x.q_norm),
                 rel(x.k_norm),     rel(x.post_norm), rel(x.gate), rel(x.up), rel(x.down)};
  }

  void LayerForward(int64_t l, int64_t B, int64_t S, const std::vector<const T*>& p, std::vector<T>* h, Acts<T>* a) {
    const int64_t N = B * S, half = hd_ / 2;
    const Local w = LocalIndex();
    LayerActs<T>& s = a->layers[l];
    s.resid_in.swap(*h);  // the stream becomes this layer's saved input; h is refilled below
    s.rstd_in.resize(N);
    s.x_in.resize(N * H_);
    RmsNormForward(N, H_, eps_, s.resid_in.data(), p[w.in_norm], s.x_in.data(), s.rstd_in.data());

    s.q.resize(N * qd_);
    s.k.resize(N * kvd_);
    s.v.resize(N * kvd_);
    if (c_.qk_norm()) {
      s.q_raw.resize(N * qd_);
      s.k_raw.resize(N * kvd_);
      s.q_rstd.resize(N * nh_);
      s.k_rstd.resize(N * nkv_);
      LinearForward(N, qd_, H_, s.x_in.data(), p[w.q], s.q_raw.data(), &transpose_);
      LinearForward(N, kvd_, H_, s.x_in.data(), p[w.k], s.k_raw.data(), &transpose_);
      RmsNormForward(N * nh_, hd_, eps_, s.q_raw.data(), p[w.q_norm], s.q.data(), s.q_rstd.data());
      RmsNormForward(N * nkv_, hd_, eps_, s.k_raw.data(), p[w.k_norm], s.k.data(), s.k_rstd.data());
    } else {
      LinearForward(N, qd_, H_, s.x_in.data(), p[w.q], s.q.data(), &transpose_);
      LinearForward(N, kvd_, H_, s.x_in.data(), p[w.k], s.k.data(), &transpose_);
    }
    LinearForward(N, kvd_, H_, s.x_in.data(), p[w.v], s.v.data(), &transpose_);
    for (int64_t n = 0; n < N; ++n) {
      const int64_t pos = n % S;
      const T* cs = &a->rope_cos[pos * half];
      const T* sn = &a->rope_sin[pos * half];
      for (int64_t hh = 0; hh < nh_; ++hh) RopeForward(half, cs, sn, &s.q[n * qd_ + hh * hd_]);
      for (int64_t hh = 0; hh < nkv_; ++hh) RopeForward(half, cs, sn, &s.k[n * kvd_ + hh * hd_]);
    }

    s.probs.resize(B * nh_ * S * S);
    s.attn.resize(N * qd_);
    AttentionForward(B, S, s);

    // resid_mid = resid_in + attn Wo^T
    s.resid_mid.resize(N * H_);
    LinearForward(N, H_, qd_, s.attn.data(), p[w.o], s.resid_mid.data(), &transpose_);
    for (int64_t i = 0; i < N * H_; ++i) s.resid_mid[i] += s.resid_in[i];

    s.rstd_mid.resize(N);
    s.x_mid.resize(N * H_);
    RmsNormForward(N, H_, eps_, s.resid_mid.data(), p[w.post_norm], s.x_mid.data(), s.rstd_mid.data());
    s.gate.resize(N * I_);
    s.up.resize(N * I_);
    s.act.resize(N * I_);
    LinearForward(N, I_, H_, s.x_mid.data(), p[w.gate], s.gate.data(), &transpose_);
    LinearForward(N, I_, H_, s.x_mid.data(), p[w.up], s.up.data(), &transpose_);
    for (int64_t i = 0; i < N * I_; ++i) {
      const T g = s.gate[i];
      s.act[i] = (g / (T(1) + std::exp(-g))) * s.up[i];  // silu as torch writes it: x / (1 + e^-x)
    }
    h->resize(N * H_);
    LinearForward(N, H_, I_, s.act.data(), p[w.down], h->data(), &transpose_);
    for (int64_t i = 0; i < N * H_; ++i) (*h)[i] += s.resid_mid[i];
  }

  // Causal softmax attention of every (row, head), GQA: head j reads kv head j / (nh / nkv).
  void AttentionForward(int64_t B, int64_t S, LayerActs<T>& s) {
    const int64_t group = nh_ / nkv_;
    const T scale = T(1) / std::sqrt(T(hd_));
    qh_.resize(S * hd_);
    kt_.resize(hd_ * S);
    vh_.resize(S * hd_);
    oh_.resize(hd_);
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t hh = 0; hh < nh_; ++hh) {
        const int64_t kvh = hh / group;
        for (int64_t i = 0; i < S; ++i) {
          const int64_t n = b * S + i;
          std::memcpy(&qh_[i * hd_], &s.q[n * qd_ + hh * hd_], sizeof(T) * hd_);
          std::memcpy(&vh_[i * hd_], &s.v[n * kvd_ + kvh * hd_], sizeof(T) * hd_);
          for (int64_t d = 0; d < hd_; ++d) kt_[d * S + i] = s.k[n * kvd_ + kvh * hd_ + d];
        }
        T* P = &s.probs[(b * nh_ + hh) * S * S];
        for (int64_t i = 0; i < S; ++i) {
          T* __restrict pr = P + i * S;
          const int64_t len = i + 1;
          for (int64_t j = 0; j < S; ++j) pr[j] = T(0);
          for (int64_t d = 0; d < hd_; ++d) {
            const T qd = qh_[i * hd_ + d];
            const T* __restrict kr = &kt_[d * S];
            for (int64_t j = 0; j < len; ++j) pr[j] += qd * kr[j];
          }
          T mx = pr[0] * scale;
          for (int64_t j = 0; j < len; ++j) {
            pr[j] *= scale;
            mx = std::max(mx, pr[j]);
          }
          T sum = 0;
          for (int64_t j = 0; j < len; ++j) {
            pr[j] = std::exp(pr[j] - mx);
            sum += pr[j];
          }
          for (int64_t j = 0; j < len; ++j) pr[j] /= sum;
          T* __restrict o = oh_.data();
          for (int64_t d = 0; d < hd_; ++d) o[d] = T(0);
          for (int64_t j = 0; j < len; ++j) {
            const T pj = pr[j];
            const T* __restrict vr = &vh_[j * hd_];
            for (int64_t d = 0; d < hd_; ++d) o[d] += pj * vr[d];
          }
          std::memcpy(&s.attn[(b * S + i) * qd_ + hh * hd_], o, sizeof(T) * hd_);
        }
      }
    }
  }

  // From dattn (dL/d attention output) to dq, dk, dv (with respect to q and k after RoPE, and v).
  void AttentionBackward(int64_t B, int64_t S, const LayerActs<T>& s, Acts<T>* a) {
    const int64_t group = nh_ / nkv_;
    const T scale = T(1) / std::sqrt(T(hd_));
    const int64_t N = B * S;
    a->dq.resize(N * qd_);
    a->dk.assign(N * kvd_, T(0));
    a->dv.assign(N * kvd_, T(0));
    qh_.resize(S * hd_);
    kh_.resize(S * hd_);
    vt_.resize(hd_ * S);
    doh_.resize(S * hd_);
    dqh_.resize(hd_);
    dkh_.resize(S * hd_);
    dvh_.resize(S * hd_);
    dsr_.resize(S);
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t hh = 0; hh < nh_; ++hh) {
        const int64_t kvh = hh / group;
        for (int64_t i = 0; i < S; ++i) {
          const int64_t n = b * S + i;
          std::memcpy(&qh_[i * hd_], &s.q[n * qd_ + hh * hd_], sizeof(T) * hd_);
          std::memcpy(&kh_[i * hd_], &s.k[n * kvd_ + kvh * hd_], sizeof(T) * hd_);
          std::memcpy(&doh_[i * hd_], &a->dattn[n * qd_ + hh * hd_], sizeof(T) * hd_);
          for (int64_t d = 0; d < hd_; ++d) vt_[d * S + i] = s.v[n * kvd_ + kvh * hd_ + d];
        }
        std::fill(dkh_.begin(), dkh_.end(), T(0));
        std::fill(dvh_.begin(), dvh_.end(), T(0));
        const T* P = &s.probs[(b * nh_ + hh) * S * S];
        for (int64_t i = 0; i < S; ++i) {
          const T* __restrict pr = P + i * S;
          const int64_t len = i + 1;
          const T* __restrict dor = &doh_[i * hd_];
          // dP[i, j] = dO[i] . V[j]
          T* __restrict ds = dsr_.data();
          for (int64_t j = 0; j < len; ++j) ds[j] = T(0);
          for (int64_t d = 0; d < hd_; ++d) {
            const T g = dor[d];
            const T* __restrict vr = &vt_[d * S];
            for (int64_t j = 0; j < len; ++j) ds[j] += g * vr[j];
          }
          // dS = P * (dP - sum_j P dP), times the score scale.
          T dot = 0;
          for (int64_t j = 0; j < len; ++j) dot += pr[j] * ds[j];
          for (int64_t j = 0; j < len; ++j) ds[j] = pr[j] * (ds[j] - dot) * scale;
          // dQ[i] = sum_j dS[i, j] K[j]; dK[j] += dS[i, j] Q[i]; dV[j] += P[i, j] dO[i].
          T* __restrict dq = dqh_.data();
          for (int64_t d = 0; d < hd_; ++d) dq[d] = T(0);
          const T* __restrict qr = &qh_[i * hd_];
          for (int64_t j = 0; j < len; ++j) {
            const T dsj = ds[j], pj = pr[j];
            const T* __restrict kr = &kh_[j * hd_];
            T* __restrict dkr = &dkh_[j * hd_];
            T* __restrict dvr = &dvh_[j * hd_];
            for (int64_t d = 0; d < hd_; ++d) {
              dq[d] += dsj * kr[d];
              dkr[d] += dsj * qr[d];
              dvr[d] += pj * dor[d];
            }
          }
          std::memcpy(&a->dq[(b * S + i) * qd_ + hh * hd_], dq, sizeof(T) * hd_);
        }
        // The group's heads add into their shared kv head in head order.
        for (int64_t j = 0; j < S; ++j) {
          T* dk = &a->dk[(b * S + j) * kvd_ + kvh * hd_];
          T* dv = &a->dv[(b * S + j) * kvd_ + kvh * hd_];
          for (int64_t d = 0; d < hd_; ++d) {
            dk[d] += dkh_[j * hd_ + d];
            dv[d] += dvh_[j * hd_ + d];
          }
        }
      }
    }
  }

  // On entry a->dh holds dL/d(layer output); on return dL/d(layer input).
  Status LayerBackward(int64_t l, int64_t B, int64_t S, const std::vector<const T*>& p, Acts<T>* a, GradSink& grads) {
    const int64_t N = B * S, half = hd_ / 2;
    const Local w = LocalIndex();
    const LayerParamIndex gi = LayerParams(c_, l);
    const LayerActs<T>& s = a->layers[l];
    T* dh = a->dh.data();

    // MLP: out = resid_mid + (silu(gate) * up) Wd^T.
    a->dgate.resize(N * I_);
    a->dup.resize(N * I_);
    T* dact = a->dgate.data();  // dL/d act, turned into dL/d gate in place below
    LinearBackwardInput(N, H_, I_, dh, p[w.down], dact, false);
    {
      T* g = GradScratch(H_ * I_);
      LinearBackwardWeight(N, H_, I_, dh, s.act.data(), g);
      ZERO_RETURN_IF_ERROR(Emit(grads, gi.down, g));
    }
    for (int64_t i = 0; i < N * I_; ++i) {
      const T x = s.gate[i], sg = Sigmoid(x), da = dact[i];
      a->dup[i] = da * x * sg;
      a->dgate[i] = da * s.up[i] * sg * (T(1) + x * (T(1) - sg));
    }
    {
      T* g = GradScratch(I_ * H_);
      LinearBackwardWeight(N, I_, H_, a->dgate.data(), s.x_mid.data(), g);
      ZERO_RETURN_IF_ERROR(Emit(grads, gi.gate, g));
      LinearBackwardWeight(N, I_, H_, a->dup.data(), s.x_mid.data(), g);
      ZERO_RETURN_IF_ERROR(Emit(grads, gi.up, g));
    }
    LinearBackwardInput(N, I_, H_, a->dgate.data(), p[w.gate], a->dx.data(), false);
    LinearBackwardInput(N, I_, H_, a->dup.data(), p[w.up], a->dx.data(), true);
    {
      T* g = GradScratch(H_);
      RmsNormBackward(N, H_, s.resid_mid.data(), s.rstd_mid.data(), p[w.post_norm], a->dx.data(), dh, true, g);
      ZERO_RETURN_IF_ERROR(Emit(grads, gi.post_norm, g));
    }

    // Attention: resid_mid = resid_in + attn Wo^T.
    a->dattn.resize(N * qd_);
    LinearBackwardInput(N, H_, qd_, dh, p[w.o], a->dattn.data(), false);
    {
      T* g = GradScratch(H_ * qd_);
      LinearBackwardWeight(N, H_, qd_, dh, s.attn.data(), g);
      ZERO_RETURN_IF_ERROR(Emit(grads, gi.o, g));
    }
    AttentionBackward(B, S, s, a);
    {
      T* g = GradScratch(kvd_ * H_);
      LinearBackwardWeight(N, kvd_, H_, a->dv.data(), s.x_in.data(), g);
      ZERO_RETURN_IF_ERROR(Emit(grads, gi.v, g));
    }
    for (int64_t n = 0; n < N; ++n) {
      const int64_t pos = n % S;
      const T* cs = &a->rope_cos[pos * half];
      const T* sn = &a->rope_sin[pos * half];
      for (int64_t hh = 0; hh < nh_; ++hh) RopeBackward(half, cs, sn, &a->dq[n * qd_ + hh * hd_]);
      for (int64_t hh = 0; hh < nkv_; ++hh) RopeBackward(half, cs, sn, &a->dk[n * kvd_ + hh * hd_]);
    }
    if (c_.qk_norm()) {
      // dq, dk: with respect to the normed q, k; through the per-head norm to the projections.
      // The norm backward writes a separate buffer (it reads dy for every element of a row).
      dq_raw_.resize(N * qd_);
      dk_raw_.resize(N * kvd_);
      T* g = GradScratch(hd_);
      RmsNormBackward(N * nh_, hd_, s.q_raw.data(), s.q_rstd.data(), p[w.q_norm], a->dq.data(), dq_raw_.data(), false,
                      g);
      ZERO_RETURN_IF_ERROR(Emit(grads, gi.q_norm, g));
      RmsNormBackward(N * nkv_, hd_, s.k_raw.data(), s.k_rstd.data(), p[w.k_norm], a->dk.data(), dk_raw_.data(), false,
                      g);
      ZERO_RETURN_IF_ERROR(Emit(grads, gi.k_norm, g));
      a->dq.swap(dq_raw_);
      a->dk.swap(dk_raw_);
    }
    {
      T* g = GradScratch(qd_ * H_);
      LinearBackwardWeight(N, qd_, H_, a->dq.data(), s.x_in.data(), g);
      ZERO_RETURN_IF_ERROR(Emit(grads, gi.q, g));
      LinearBackwardWeight(N, kvd_, H_, a->dk.data(), s.x_in.data(), g);
      ZERO_RETURN_IF_ERROR(Emit(grads, gi.k, g));
    }
    LinearBackwardInput(N, qd_, H_, a->dq.data(), p[w.q], a->dx.data(), false);
    LinearBackwardInput(N, kvd_, H_, a->dk.data(), p[w.k], a->dx.data(), true);
    LinearBackwardInput(N, kvd_, H_, a->dv.data(), p[w.v], a->dx.data(), true);
    {
      T* g = GradScratch(H_);
      RmsNormBackward(N, H_, s.resid_in.data(), s.rstd_in.data(), p[w.in_norm], a->dx.data(), dh, true, g);
      ZERO_RETURN_IF_ERROR(Emit(grads, gi.input_norm, g));
    }
    return OkStatus();
  }

  // Acquires module m through `scope` and returns T pointers to its parameters: the provider's own
  // memory when it already is T, else converted copies in `scratch` (valid until its next use).
  Status Load(ModuleScope& scope, int m, std::vector<T>* scratch, std::vector<const T*>* out) {
    const ModuleSpec& mod = modules_[m];
    ZERO_ASSIGN_OR_RETURN(std::vector<ParamView> views, scope.Acquire());
    if (views.size() != mod.params.size()) {
      return InvalidArgumentError("module " + mod.name + ": provider returned " + std::to_string(views.size()) +
                                  " views, expected " + std::to_string(mod.params.size()));
    }
    int64_t total = 0;
    for (int i : mod.params) total += specs_[i].numel();
    bool convert = !std::is_same_v<T, float>;
    for (const ParamView& v : views) convert = convert || v.dtype != DType::kF32;
    if (convert && static_cast<int64_t>(scratch->size()) < total) scratch->resize(total);
    out->clear();
    int64_t offset = 0;
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
      T* dst = scratch->data() + offset;
      for (int64_t e = 0; e < n; ++e) dst[e] = T(LoadAsFloat(v.data, v.dtype, e));
      out->push_back(dst);
      offset += n;
    }
    return OkStatus();
  }

  // The module that holds the batch's output weight besides "head": "embed" when it is the tied
  // embedding, the extra head's, or "" (the untied lm_head sits in "head"; never acquired).
  static std::string OutModuleName(const OutputHead& out) { return out.tied ? kEmbedModule : out.module; }

  // The output weight: acquired through `scope` (OutModuleName's module), or the untied lm_head in
  // the head module's views `head`.
  Result<const T*> LoadOutput(const OutputHead& out, ModuleScope& scope, const std::vector<const T*>& head) {
    if (!out.tied && out.module.empty()) return head[1];
    int m = 0;
    if (!out.tied) {
      while (m < static_cast<int>(modules_.size()) && modules_[m].name != out.module) ++m;
      if (m == static_cast<int>(modules_.size())) return InternalError("no module " + out.module);
    }
    std::vector<const T*> e;
    ZERO_RETURN_IF_ERROR(Load(scope, m, &embed_scratch_, &e));
    return e[0];
  }

  T* GradScratch(int64_t n) {
    if (static_cast<int64_t>(grad_scratch_.size()) < n) grad_scratch_.resize(n);
    return grad_scratch_.data();
  }

  // Writes gradient `index` into the sink's buffer (rounded to its dtype) and reports it ready.
  Status Emit(GradSink& sink, int index, const T* g) {
    ZERO_ASSIGN_OR_RETURN(GradView view, sink.GradBuffer(index));
    if (view.data == nullptr) return InvalidArgumentError("gradient of " + specs_[index].name + ": null buffer");
    const int64_t n = specs_[index].numel();
    if (view.dtype == DType::kF32) {
      float* dst = static_cast<float*>(view.data);
      for (int64_t e = 0; e < n; ++e) dst[e] = static_cast<float>(g[e]);
    } else {
      for (int64_t e = 0; e < n; ++e) StoreFromFloat(view.data, view.dtype, e, static_cast<float>(g[e]));
    }
    return sink.GradReady(index);
  }

  const LlmConfig c_;
  const std::vector<ModelParamSpec>& specs_;
  const std::vector<ModuleSpec>& modules_;
  const int64_t H_, I_, V_, L_, nh_, nkv_, hd_, qd_, kvd_;
  const T eps_;
  int head_module_ = 0;
  int final_norm_ = 0;
  std::vector<T> param_scratch_, embed_scratch_, grad_scratch_, transpose_;
  // Attention scratch of one (row, head).
  std::vector<T> qh_, kh_, kt_, vh_, vt_, oh_, doh_, dqh_, dkh_, dvh_, dsr_;
  std::vector<T> dq_raw_, dk_raw_;
};

}  // namespace

// ---- Public API. -------------------------------------------------------------------------------------------

LlmCpu::LlmCpu(const LlmConfig& config, CpuMath math)
    : config_(config), math_(math), specs_(LlmParamSpecs(config)), modules_(examples::GroupByModule(specs_)) {
  ZERO_CHECK_MSG(config_.Validate().ok(), config_.Validate().ToString());
  if (math_ == CpuMath::kDouble) {
    impl_ = std::make_unique<ModelT<double>>(config_, specs_, modules_);
  } else {
    impl_ = std::make_unique<ModelT<float>>(config_, specs_, modules_);
  }
}

LlmCpu::~LlmCpu() = default;

Result<double> LlmCpu::Forward(ParamProvider& params, const LlmBatch& batch, LlmActivations* acts) {
  if (acts == nullptr) return InvalidArgumentError("llm forward: null activations");
  ZERO_RETURN_IF_ERROR(batch.Validate(config_.vocab_size, config_.max_position_embeddings));
  if (!acts->state_) acts->state_ = std::make_unique<LlmActivations::State>();
  LlmActivations::State* st = acts->state_.get();
  st->has_forward = false;
  st->batch = batch.batch;
  st->seq = batch.seq;
  st->math = math_;
  st->inputs = batch.inputs;
  st->targets = batch.targets;
  ZERO_ASSIGN_OR_RETURN(st->out, SelectOutputHead(config_, batch.head));
  ZERO_RETURN_IF_ERROR(impl_->Forward(params, /*all_logits=*/true, st));
  return st->loss;
}

Status LlmCpu::Backward(ParamProvider& params, LlmActivations* acts, float loss_scale, GradSink& grads) {
  if (acts == nullptr || !acts->state_ || !acts->state_->has_forward) {
    return FailedPreconditionError("llm backward: no forward on these activations");
  }
  LlmActivations::State* st = acts->state_.get();
  const size_t layers = math_ == CpuMath::kFloat ? st->f.layers.size() : st->d.layers.size();
  if (st->math != math_ || layers != static_cast<size_t>(config_.num_hidden_layers)) {
    return FailedPreconditionError("llm backward: the activations come from a forward of another model");
  }
  return impl_->Backward(params, st, loss_scale, grads);
}

Result<std::vector<float>> LlmCpu::Logits(ParamProvider& params, const std::vector<int32_t>& ids) {
  if (ids.empty()) return InvalidArgumentError("llm logits: expected at least one id, got none");
  if (ids.size() > static_cast<size_t>(config_.max_position_embeddings)) {
    return InvalidArgumentError("llm logits: " + std::to_string(ids.size()) + " ids exceed max_position_embeddings " +
                                std::to_string(config_.max_position_embeddings));
  }
  LlmBatch batch;
  batch.batch = 1;
  batch.seq = static_cast<int>(ids.size());
  batch.inputs = ids;
  batch.targets.assign(ids.size(), kIgnoreIndex);
  ZERO_RETURN_IF_ERROR(batch.Validate(config_.vocab_size, config_.max_position_embeddings));
  LlmActivations acts;
  LlmActivations::State* st = acts.state_.get();
  st->batch = 1;
  st->seq = batch.seq;
  st->math = math_;
  st->inputs = std::move(batch.inputs);
  st->targets = std::move(batch.targets);
  ZERO_ASSIGN_OR_RETURN(st->out, SelectOutputHead(config_, 0));
  ZERO_RETURN_IF_ERROR(impl_->Forward(params, /*all_logits=*/false, st));
  return impl_->LogitsRow(st, 0);
}

}  // namespace zero::llm
