// The dense matrix products of the CPU models (models/llama's cpu_model, models/byte's byte_lm):
// row-major, contiguous rows, in float or double, single-threaded and deterministic.
//
// Every element of C sums its K products in increasing order of p, whatever the blocking, so a
// product's result depends only on its inputs (not on the block sizes or on how the compiler
// vectorizes the column loop). Header-only templates: each model compiles them with its own
// options (-O3, no FMA contraction on x86-64-v2). Owns nothing; thread-compatible.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace zero::cpu_gemm {

// C[M,N] = (or +=) A'[M,K] B[K,N] with A'(i,p) = A[i*sai + p*sap]. Four rows of C per pass over a
// column panel of B, so each B element loaded feeds four multiply-adds; the inner loop runs over
// contiguous columns and vectorizes.
template <typename T>
void GemmCore(int64_t M, int64_t N, int64_t K, const T* A, int64_t sai, int64_t sap, const T* B, int64_t ldb, T* C,
              int64_t ldc, bool accumulate) {
  constexpr int64_t kColBlock = 128;
  for (int64_t j0 = 0; j0 < N; j0 += kColBlock) {
    const int64_t nb = std::min(kColBlock, N - j0);
    int64_t i = 0;
    for (; i + 4 <= M; i += 4) {
      T* __restrict c0 = C + (i + 0) * ldc + j0;
      T* __restrict c1 = C + (i + 1) * ldc + j0;
      T* __restrict c2 = C + (i + 2) * ldc + j0;
      T* __restrict c3 = C + (i + 3) * ldc + j0;
      if (!accumulate) {
        for (int64_t j = 0; j < nb; ++j) c0[j] = c1[j] = c2[j] = c3[j] = T(0);
      }
      for (int64_t p = 0; p < K; ++p) {
        const T* __restrict b = B + p * ldb + j0;
        const T a0 = A[(i + 0) * sai + p * sap];
        const T a1 = A[(i + 1) * sai + p * sap];
        const T a2 = A[(i + 2) * sai + p * sap];
        const T a3 = A[(i + 3) * sai + p * sap];
        for (int64_t j = 0; j < nb; ++j) {
          const T bj = b[j];
          c0[j] += a0 * bj;
          c1[j] += a1 * bj;
          c2[j] += a2 * bj;
          c3[j] += a3 * bj;
        }
      }
    }
    for (; i < M; ++i) {
      T* __restrict c = C + i * ldc + j0;
      if (!accumulate) {
        for (int64_t j = 0; j < nb; ++j) c[j] = T(0);
      }
      for (int64_t p = 0; p < K; ++p) {
        const T* __restrict b = B + p * ldb + j0;
        const T a = A[i * sai + p * sap];
        for (int64_t j = 0; j < nb; ++j) c[j] += a * b[j];
      }
    }
  }
}

// C[M,N] (= or +=) A[M,K] B[K,N].
template <typename T>
void GemmNN(int64_t M, int64_t N, int64_t K, const T* A, const T* B, T* C, bool accumulate = false) {
  GemmCore(M, N, K, A, K, 1, B, N, C, N, accumulate);
}

// C[M,N] = A[K,M]^T B[K,N] (weight gradients: X^T dY).
template <typename T>
void GemmTN(int64_t M, int64_t N, int64_t K, const T* A, const T* B, T* C) {
  GemmCore(M, N, K, A, 1, M, B, N, C, N, false);
}

// C[M,N] = A[M,K] B[N,K]^T (a weight in [out, in] layout); B is transposed once into `scratch`
// (resized as needed) so the product runs with contiguous inner loops.
template <typename T>
void GemmNT(int64_t M, int64_t N, int64_t K, const T* A, const T* B, T* C, std::vector<T>* scratch) {
  scratch->resize(static_cast<size_t>(N) * K);
  T* bt = scratch->data();
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t k = 0; k < K; ++k) bt[k * N + n] = B[n * K + k];
  }
  GemmCore(M, N, K, A, K, 1, bt, N, C, N, false);
}

}  // namespace zero::cpu_gemm
