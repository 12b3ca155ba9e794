#include "examples/llm/llm_residual_gemm.h"

#include <cublasLt.h>

#include <climits>
#include <map>
#include <string>
#include <tuple>
#include <utility>

namespace zero::llm {
namespace {

Status LtError(cublasStatus_t s, const char* call) {
  return InternalError(std::string("cuBLASLt error: ") + call + ": " + cublasGetStatusString(s) + " (" +
                       cublasGetStatusName(s) + ")");
}

#define LT_RETURN_IF_ERROR(call)                                      \
  do {                                                                \
    cublasStatus_t _lt_s = (call);                                    \
    if (_lt_s != CUBLAS_STATUS_SUCCESS) return LtError(_lt_s, #call); \
  } while (0)

cudaDataType_t CudaTypeOf(DType t) {
  switch (t) {
    case DType::kBF16:
      return CUDA_R_16BF;
    case DType::kF16:
      return CUDA_R_16F;
    case DType::kF32:
      break;
  }
  return CUDA_R_32F;
}

struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool usable = false;
  ~Plan() {
    if (desc != nullptr) cublasLtMatmulDescDestroy(desc);
    for (cublasLtMatrixLayout_t l : {a, b, c}) {
      if (l != nullptr) cublasLtMatrixLayoutDestroy(l);
    }
  }
};

}  // namespace

struct LtResidualGemm::Impl {
  cublasLtHandle_t handle = nullptr;
  cudaStream_t stream = nullptr;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  std::map<std::tuple<int, int64_t, int64_t, int64_t>, std::unique_ptr<Plan>> plans;

  ~Impl() {
    plans.clear();
    if (handle != nullptr) cublasLtDestroy(handle);
  }

  // Column-major (cuBLAS's view of the row-major buffers): out^T [n, M] = W^T^T ... i.e.
  // D[n, M] = op_T(A)[n, k] B[k, M] + C[n, M], with A = W as stored ([k, n], ld k), B = x ([k, M],
  // ld k), C = res and D = out ([n, M], ld n).
  Result<Plan*> PlanFor(DType t, int64_t M, int64_t n, int64_t k) {
    auto key = std::make_tuple(static_cast<int>(t), M, n, k);
    auto it = plans.find(key);
    if (it != plans.end()) return it->second.get();
    auto plan = std::make_unique<Plan>();
    const cudaDataType_t in_t = CudaTypeOf(t);
    LT_RETURN_IF_ERROR(cublasLtMatmulDescCreate(&plan->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t trans_a = CUBLAS_OP_T, trans_b = CUBLAS_OP_N;
    LT_RETURN_IF_ERROR(
        cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, &trans_a, sizeof(trans_a)));
    LT_RETURN_IF_ERROR(
        cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, &trans_b, sizeof(trans_b)));
    LT_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&plan->a, in_t, k, n, k));
    LT_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&plan->b, in_t, k, M, k));
    LT_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&plan->c, CUDA_R_32F, n, M, n));
    cublasLtMatmulPreference_t pref = nullptr;
    LT_RETURN_IF_ERROR(cublasLtMatmulPreferenceCreate(&pref));
    const uint64_t ws = workspace_bytes;
    // Split-K partials reduced in place use atomics: excluded, so a product has the same bits on
    // every run.
    const uint32_t schemes = CUBLASLT_REDUCTION_SCHEME_MASK & ~CUBLASLT_REDUCTION_SCHEME_INPLACE;
    cublasStatus_t s =
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws));
    if (s == CUBLAS_STATUS_SUCCESS) {
      s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &schemes,
                                               sizeof(schemes));
    }
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    if (s == CUBLAS_STATUS_SUCCESS) {
      s = cublasLtMatmulAlgoGetHeuristic(handle, plan->desc, plan->a, plan->b, plan->c, plan->c, pref, 1, &result,
                                         &found);
    }
    cublasLtMatmulPreferenceDestroy(pref);
    if (s != CUBLAS_STATUS_SUCCESS && s != CUBLAS_STATUS_NOT_SUPPORTED)
      return LtError(s, "cublasLtMatmulAlgoGetHeuristic");
    plan->usable = s == CUBLAS_STATUS_SUCCESS && found > 0;
    if (plan->usable) plan->algo = result.algo;
    Plan* out = plan.get();
    plans.emplace(key, std::move(plan));
    return out;
  }
};

LtResidualGemm::LtResidualGemm(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
LtResidualGemm::~LtResidualGemm() = default;

Result<std::unique_ptr<LtResidualGemm>> LtResidualGemm::Create(cudaStream_t stream, void* workspace,
                                                               size_t workspace_bytes) {
  auto impl = std::make_unique<Impl>();
  LT_RETURN_IF_ERROR(cublasLtCreate(&impl->handle));
  impl->stream = stream;
  impl->workspace = workspace;
  impl->workspace_bytes = workspace_bytes;
  return std::unique_ptr<LtResidualGemm>(new LtResidualGemm(std::move(impl)));
}

Status LtResidualGemm::Run(DType t, const void* x, const void* w, int64_t M, int64_t n, int64_t k, const float* res,
                           float* out) {
  if (M <= 0 || n <= 0) return OkStatus();
  for (int64_t d : {M, n, k}) {
    if (d > INT_MAX) {
      return InvalidArgumentError("llm_cuda: matrix product dimension " + std::to_string(d) + " above 2^31 - 1");
    }
  }
  ZERO_ASSIGN_OR_RETURN(Plan * plan, impl_->PlanFor(t, M, n, k));
  if (!plan->usable) {
    return UnavailableError("cuBLASLt offers no algorithm for the residual product [" + std::to_string(M) + ", " +
                            std::to_string(k) + "] x [" + std::to_string(k) + ", " + std::to_string(n) + "]");
  }
  const float one = 1.0f;
  LT_RETURN_IF_ERROR(cublasLtMatmul(impl_->handle, plan->desc, &one, w, plan->a, x, plan->b, &one, res, plan->c, out,
                                    plan->c, &plan->algo, impl_->workspace, impl_->workspace_bytes, impl_->stream));
  return OkStatus();
}

}  // namespace zero::llm
