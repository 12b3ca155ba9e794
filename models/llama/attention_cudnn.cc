// CudnnAttention (contract in attention_cudnn.h): one forward and one backward graph of cuDNN's
// SDPA per shape, cached; without cuDNN in the build every call says so.
#include "models/llama/attention_cudnn.h"

#include <string>
#include <utility>
#include <vector>

#include "runtime/device.h"
#include "runtime/device_arena.h"

#if defined(ZERO_HAS_CUDNN)
#include <cudnn.h>

#include <cudnn_frontend.h>
#include <unordered_map>
#endif

namespace zero::llm {

std::string AttentionShape::ToString() const {
  return "batch " + std::to_string(batch) + " seq " + std::to_string(seq) + " heads " + std::to_string(heads) +
         " kv_heads " + std::to_string(kv_heads) + " head_dim " + std::to_string(head_dim);
}

#if defined(ZERO_HAS_CUDNN)

namespace fe = cudnn_frontend;

namespace {

// Tensor ids in the variant packs.
enum Uid : int64_t { kQ = 1, kK, kV, kO, kStats, kDO, kDQ, kDK, kDV };

Status FeStatus(fe::error_t e, const char* what, const AttentionShape& s) {
  return UnimplementedError(std::string("cuDNN attention ") + what + " for " + s.ToString() + ": " + e.get_message());
}

// [batch, seq, heads, head_dim] row-major seen as cuDNN's (b, h, s, d).
std::vector<int64_t> Dims(const AttentionShape& s, int heads) { return {s.batch, heads, s.seq, s.head_dim}; }
std::vector<int64_t> Strides(const AttentionShape& s, int heads) {
  return {int64_t{s.seq} * heads * s.head_dim, s.head_dim, int64_t{heads} * s.head_dim, 1};
}

}  // namespace

struct CudnnAttention::Impl {
  Device* device = nullptr;  // a CudaDevice: the workspace's
  cudaStream_t stream = nullptr;
  bool deterministic = true;
  cudnnHandle_t handle = nullptr;
  struct Plans {
    AttentionShape shape;
    Status status;  // Unimplemented when cuDNN has no plan
    std::shared_ptr<fe::graph::Graph> fwd, bwd;
  };
  std::vector<Plans> plans;
  DeviceArena workspace_arena{"workspace"};
  void* workspace = nullptr;
  int64_t workspace_bytes = 0;

  ~Impl() {
    // Enqueued work may still read the workspace, which workspace_arena frees after this body.
    if (workspace != nullptr) cudaStreamSynchronize(stream);
    if (handle != nullptr) cudnnDestroy(handle);
  }

  std::shared_ptr<fe::graph::Graph> NewGraph() {
    auto g = std::make_shared<fe::graph::Graph>();
    g->set_io_data_type(fe::DataType_t::BFLOAT16)
        .set_intermediate_data_type(fe::DataType_t::FLOAT)
        .set_compute_data_type(fe::DataType_t::FLOAT);
    return g;
  }

  std::shared_ptr<fe::graph::Tensor_attributes> Input(fe::graph::Graph& g, const char* name, Uid uid,
                                                      const AttentionShape& s, int heads) {
    return g.tensor(fe::graph::Tensor_attributes()
                        .set_name(name)
                        .set_uid(uid)
                        .set_dim(Dims(s, heads))
                        .set_stride(Strides(s, heads)));
  }
  std::shared_ptr<fe::graph::Tensor_attributes> StatsInput(fe::graph::Graph& g, const AttentionShape& s) {
    return g.tensor(fe::graph::Tensor_attributes()
                        .set_name("stats")
                        .set_uid(kStats)
                        .set_dim({s.batch, s.heads, s.seq, 1})
                        .set_stride({int64_t{s.heads} * s.seq, s.seq, 1, 1})
                        .set_data_type(fe::DataType_t::FLOAT));
  }

  Status Build(fe::graph::Graph& g, const AttentionShape& s, const char* what) {
    fe::error_t e = g.validate();
    if (e.is_good()) e = g.build_operation_graph(handle);
    if (e.is_good()) e = g.create_execution_plans({fe::HeurMode_t::A});
    if (e.is_good()) e = g.check_support(handle);
    if (e.is_good()) e = g.build_plans(handle);
    if (!e.is_good()) return FeStatus(e, what, s);
    int64_t bytes = 0;
    e = g.get_workspace_size(bytes);
    if (!e.is_good()) return FeStatus(e, what, s);
    if (bytes > workspace_bytes) {
      // The old workspace may be read by enqueued work.
      const cudaError_t ce = cudaStreamSynchronize(stream);
      if (ce != cudaSuccess) {
        cudaGetLastError();
        return InternalError("cuDNN attention: cudaStreamSynchronize before growing the workspace to " +
                             std::to_string(bytes) + " bytes for " + s.ToString() + ": " + cudaGetErrorString(ce));
      }
      workspace_arena.Clear();
      workspace = nullptr;
      workspace_bytes = 0;
      workspace_arena.ReserveBytes(&workspace, static_cast<size_t>(bytes), "cuDNN attention workspace");
      ZERO_RETURN_IF_ERROR(
          workspace_arena.Allocate(device).WithContext("cuDNN attention: workspace for " + s.ToString()));
      workspace_bytes = bytes;
    }
    return OkStatus();
  }

  Status BuildForward(Plans& p) {
    const AttentionShape& s = p.shape;
    p.fwd = NewGraph();
    fe::graph::Graph& g = *p.fwd;
    auto q = Input(g, "q", kQ, s, s.heads);
    auto k = Input(g, "k", kK, s, s.kv_heads);
    auto v = Input(g, "v", kV, s, s.kv_heads);
    auto options = fe::graph::SDPA_attributes()
                       .set_name("attention")
                       .set_generate_stats(true)
                       .set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT)
                       .set_diagonal_band_right_bound(0)
                       .set_attn_scale(s.scale);
    auto [o, stats] = g.sdpa(q, k, v, options);
    o->set_output(true).set_uid(kO).set_dim(Dims(s, s.heads)).set_stride(Strides(s, s.heads));
    stats->set_output(true)
        .set_uid(kStats)
        .set_data_type(fe::DataType_t::FLOAT)
        .set_dim({s.batch, s.heads, s.seq, 1})
        .set_stride({int64_t{s.heads} * s.seq, s.seq, 1, 1});
    return Build(g, s, "forward");
  }

  Status BuildBackward(Plans& p) {
    const AttentionShape& s = p.shape;
    p.bwd = NewGraph();
    fe::graph::Graph& g = *p.bwd;
    auto q = Input(g, "q", kQ, s, s.heads);
    auto k = Input(g, "k", kK, s, s.kv_heads);
    auto v = Input(g, "v", kV, s, s.kv_heads);
    auto o = Input(g, "o", kO, s, s.heads);
    auto dout = Input(g, "dout", kDO, s, s.heads);
    auto stats = StatsInput(g, s);
    auto options = fe::graph::SDPA_backward_attributes()
                       .set_name("attention_backward")
                       .set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT)
                       .set_diagonal_band_right_bound(0)
                       .set_attn_scale(s.scale)
                       .set_deterministic_algorithm(deterministic);
    auto [dq, dk, dv] = g.sdpa_backward(q, k, v, o, dout, stats, options);
    dq->set_output(true).set_uid(kDQ).set_dim(Dims(s, s.heads)).set_stride(Strides(s, s.heads));
    dk->set_output(true).set_uid(kDK).set_dim(Dims(s, s.kv_heads)).set_stride(Strides(s, s.kv_heads));
    dv->set_output(true).set_uid(kDV).set_dim(Dims(s, s.kv_heads)).set_stride(Strides(s, s.kv_heads));
    return Build(g, s, deterministic ? "backward (deterministic)" : "backward");
  }

  Result<Plans*> Find(const AttentionShape& s) {
    for (Plans& p : plans) {
      if (p.shape == s) {
        if (!p.status.ok()) return p.status;
        return &p;
      }
    }
    if (s.batch <= 0 || s.seq <= 0 || s.heads <= 0 || s.kv_heads <= 0 || s.head_dim <= 0 || s.heads % s.kv_heads != 0) {
      return InvalidArgumentError("cuDNN attention: invalid shape " + s.ToString());
    }
    plans.push_back(Plans{s, OkStatus(), nullptr, nullptr});
    Plans& p = plans.back();
    p.status = BuildForward(p);
    if (p.status.ok()) p.status = BuildBackward(p);
    if (!p.status.ok()) {
      p.fwd.reset();
      p.bwd.reset();
      return p.status;
    }
    return &p;
  }

  Status Execute(fe::graph::Graph& g, std::unordered_map<int64_t, void*>& pack, const AttentionShape& s,
                 const char* what) {
    fe::error_t e = g.execute(handle, pack, workspace);
    if (!e.is_good()) {
      return InternalError(std::string("cuDNN attention ") + what + " for " + s.ToString() + ": " + e.get_message());
    }
    return OkStatus();
  }
};

CudnnAttention::CudnnAttention(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CudnnAttention::~CudnnAttention() = default;

bool CudnnAttention::Built() { return true; }
long CudnnAttention::RuntimeVersion() { return static_cast<long>(cudnnGetVersion()); }

Result<std::unique_ptr<CudnnAttention>> CudnnAttention::Create(Device* device, cudaStream_t stream,
                                                               bool deterministic) {
  if (device == nullptr || device->AsCuda() == nullptr) {
    return InvalidArgumentError("cuDNN attention: device " +
                                (device == nullptr ? std::string("null") : device->name()) + " is not a CUDA device");
  }
  auto impl = std::make_unique<Impl>();
  impl->device = device;
  impl->stream = stream;
  impl->deterministic = deterministic;
  const cudnnStatus_t st = cudnnCreate(&impl->handle);
  if (st != CUDNN_STATUS_SUCCESS) {
    impl->handle = nullptr;
    return UnavailableError(std::string("cuDNN attention: cudnnCreate failed: ") + cudnnGetErrorString(st));
  }
  const cudnnStatus_t ss = cudnnSetStream(impl->handle, stream);
  if (ss != CUDNN_STATUS_SUCCESS) {
    return UnavailableError(std::string("cuDNN attention: cudnnSetStream failed: ") + cudnnGetErrorString(ss));
  }
  return std::unique_ptr<CudnnAttention>(new CudnnAttention(std::move(impl)));
}

Status CudnnAttention::Prepare(const AttentionShape& shape) { return impl_->Find(shape).status(); }

Status CudnnAttention::Forward(const AttentionShape& shape, const void* q, const void* k, const void* v, void* o,
                               float* stats) {
  ZERO_ASSIGN_OR_RETURN(Impl::Plans * p, impl_->Find(shape));
  std::unordered_map<int64_t, void*> pack = {
      {kQ, const_cast<void*>(q)}, {kK, const_cast<void*>(k)}, {kV, const_cast<void*>(v)}, {kO, o}, {kStats, stats}};
  return impl_->Execute(*p->fwd, pack, shape, "forward");
}

Status CudnnAttention::Backward(const AttentionShape& shape, const void* q, const void* k, const void* v, const void* o,
                                const void* dout, const float* stats, void* dq, void* dk, void* dv) {
  ZERO_ASSIGN_OR_RETURN(Impl::Plans * p, impl_->Find(shape));
  std::unordered_map<int64_t, void*> pack = {{kQ, const_cast<void*>(q)},
                                             {kK, const_cast<void*>(k)},
                                             {kV, const_cast<void*>(v)},
                                             {kO, const_cast<void*>(o)},
                                             {kDO, const_cast<void*>(dout)},
                                             {kStats, const_cast<float*>(stats)},
                                             {kDQ, dq},
                                             {kDK, dk},
                                             {kDV, dv}};
  return impl_->Execute(*p->bwd, pack, shape, "backward");
}

#else  // !ZERO_HAS_CUDNN

struct CudnnAttention::Impl {};

CudnnAttention::CudnnAttention(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CudnnAttention::~CudnnAttention() = default;

bool CudnnAttention::Built() { return false; }
long CudnnAttention::RuntimeVersion() { return 0; }

Result<std::unique_ptr<CudnnAttention>> CudnnAttention::Create(Device*, cudaStream_t, bool) {
  return UnavailableError(
      "cuDNN attention: this build has no cuDNN (tools/setup.sh fetches cuDNN's frontend headers; cudnn.h and "
      "libcudnn must be installed)");
}

Status CudnnAttention::Prepare(const AttentionShape&) { return UnavailableError("cuDNN attention: not built"); }
Status CudnnAttention::Forward(const AttentionShape&, const void*, const void*, const void*, void*, float*) {
  return UnavailableError("cuDNN attention: not built");
}
Status CudnnAttention::Backward(const AttentionShape&, const void*, const void*, const void*, const void*, const void*,
                                const float*, void*, void*, void*) {
  return UnavailableError("cuDNN attention: not built");
}

#endif

}  // namespace zero::llm
