// The device GPT's backend on CUDA: every launch on one stream (the one the trainer hands the engine), a work-item
// kernel per layer (device/layers.hpp: one thread per item, no atomics), and the matmuls through cuBLASLt in fp32
// (CUBLAS_COMPUTE_32F: no TF32) with a fixed workspace and, per shape, the one algorithm its heuristic named first,
// chosen once and reused. cuBLAS gives the same bits run after run for the same algorithm and workspace on the same
// GPU model (the same SM count) with the same cuBLAS release, and the layer kernels have no atomics, so a training
// run repeats itself bit for bit there. Every buffer the matmuls see is 256-byte aligned (cudaMalloc's, the
// engine's, the widened copies' slices), so the algorithm depends on the shape alone.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <map>
#include <stdexcept>
#include <string>
#include <tuple>

#include "model_runner.hpp"

namespace gpt {
namespace device {
namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}
void check(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) throw std::runtime_error(std::string(what) + ": " + cublasLtGetStatusString(s));
}

template <class Item>
__global__ void each_kernel(size_t n, Item item) {
  const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) item(i);
}

// The largest power of two (up to 256) that divides the address: cuBLASLt picks only algorithms that accept it.
uint32_t alignment_of(const void* p) {
  uint32_t a = 256;
  while (a > 4 && reinterpret_cast<uintptr_t>(p) % a != 0) a /= 2;
  return a;
}

class CudaBackend {
 public:
  static constexpr size_t kWorkspaceBytes = size_t{32} << 20;  // what cuBLAS itself reserves on Hopper

  CudaBackend() {
    try {
      check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
      check(cublasLtCreate(&lt_), "cublasLtCreate");
      check(cudaMalloc(&workspace_, kWorkspaceBytes), "cudaMalloc (cuBLASLt workspace)");
    } catch (...) {
      free_all();
      throw;
    }
  }
  ~CudaBackend() { free_all(); }
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  template <class Item>
  void each(size_t n, const Item& item) {
    if (n == 0) return;
    constexpr unsigned kThreads = 256;
    each_kernel<<<static_cast<unsigned>((n + kThreads - 1) / kThreads), kThreads, 0, stream_>>>(n, item);
    check(cudaGetLastError(), "a layer kernel's launch");
  }

  void gemm(bool trans_a, bool trans_b, int m, int n, int k, const float* a, int lda, const float* b, int ldb,
            float beta, float* c, int ldc) {
    matmul(trans_a, trans_b, m, n, k, a, lda, b, ldb, beta, c, ldc, nullptr);
  }
  void matmul_bias(float* out, const float* inp, const float* w, const float* bias, int rows, int C, int OC) {
    matmul(false, true, rows, OC, C, inp, C, w, C, 0.0f, out, OC, bias);
  }

  template <class U>
  U* alloc(size_t n) {
    void* p = nullptr;
    check(cudaMalloc(&p, n * sizeof(U) + 1), "cudaMalloc (activations)");
    blocks_.push_back(p);
    bytes_ += n * sizeof(U);
    check(cudaMemsetAsync(p, 0, n * sizeof(U), stream_), "cudaMemsetAsync");
    return static_cast<U*>(p);
  }
  void zero(void* p, size_t bytes) { check(cudaMemsetAsync(p, 0, bytes, stream_), "cudaMemsetAsync"); }
  void copy(void* dst, const void* src, size_t bytes) {
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_), "cudaMemcpyAsync");
  }
  // From pageable memory: the call returns once the source has been read, so the caller may reuse it.
  void upload(void* dst, const void* src, size_t bytes) {
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_), "cudaMemcpyAsync (upload)");
  }
  void download(void* dst, const void* src, size_t bytes) {
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_), "cudaMemcpyAsync (download)");
    check(cudaStreamSynchronize(stream_), "the model's stream");
  }
  void* stream() { return stream_; }
  // Device memory of the model's own: its buffers and cuBLASLt's workspace.
  size_t bytes() const { return bytes_ + kWorkspaceBytes; }
  std::string describe() const {
    int device = 0;
    cudaDeviceProp prop{};
    cudaGetDevice(&device);
    cudaGetDeviceProperties(&prop, device);
    return std::string(prop.name) + " (CUDA kernels, cuBLASLt " + std::to_string(cublasLtGetVersion()) +
           " in fp32, a fixed algorithm per shape)";
  }

 private:
  // A row-major matmul is the column-major one of the transposes: C^T = op(B)^T . op(A)^T, so cuBLASLt gets B as
  // its A and A as its B, with the dimensions swapped.
  struct Plan {
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo{};
  };
  using Key = std::tuple<bool, bool, int, int, int, int, int, int, bool, uint32_t, uint32_t, uint32_t>;

  void free_all() {
    if (stream_) cudaStreamSynchronize(stream_);
    for (auto& [key, plan] : plans_) destroy(plan);
    plans_.clear();
    for (void* p : blocks_) cudaFree(p);
    blocks_.clear();
    if (workspace_) cudaFree(workspace_);
    if (lt_) cublasLtDestroy(lt_);
    if (stream_) cudaStreamDestroy(stream_);
    workspace_ = nullptr, lt_ = nullptr, stream_ = nullptr;
  }
  static void destroy(Plan& plan) {
    if (plan.op) cublasLtMatmulDescDestroy(plan.op);
    if (plan.a) cublasLtMatrixLayoutDestroy(plan.a);
    if (plan.b) cublasLtMatrixLayoutDestroy(plan.b);
    if (plan.c) cublasLtMatrixLayoutDestroy(plan.c);
    plan = Plan{};
  }

  void matmul(bool trans_a, bool trans_b, int m, int n, int k, const float* a, int lda, const float* b, int ldb,
              float beta, float* c, int ldc, const float* bias) {
    if (bias != nullptr && alignment_of(bias) < 16) {  // the bias epilogue wants 16 bytes: the bias rows, then +=
      each(static_cast<size_t>(m) * ldc, BiasRows<float>{c, bias, ldc});
      bias = nullptr, beta = 1.0f;
    }
    const uint32_t align_a = alignment_of(b), align_b = alignment_of(a), align_c = alignment_of(c);
    const Key key{trans_a, trans_b, m, n, k, lda, ldb, ldc, bias != nullptr, align_a, align_b, align_c};
    auto found = plans_.find(key);
    if (found == plans_.end()) found = plans_.emplace(key, make_plan(key)).first;
    Plan& plan = found->second;
    if (bias)
      check(cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)),
            "cuBLASLt bias pointer");
    const float alpha = 1.0f;
    check(cublasLtMatmul(lt_, plan.op, &alpha, b, plan.a, a, plan.b, &beta, c, plan.c, c, plan.c, &plan.algo,
                         workspace_, kWorkspaceBytes, stream_),
          "cublasLtMatmul");
  }

  Plan make_plan(const Key& key) {
    Plan plan;
    try {
      fill_plan(plan, key);
    } catch (...) {
      destroy(plan);
      throw;
    }
    return plan;
  }

  void fill_plan(Plan& plan, const Key& key) {
    const auto [trans_a, trans_b, m, n, k, lda, ldb, ldc, has_bias, align_a, align_b, align_c] = key;
    check(cublasLtMatmulDescCreate(&plan.op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
    const cublasOperation_t op_a = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, op_b = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    check(cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)), "TRANSA");
    check(cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)), "TRANSB");
    if (has_bias) {
      const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
      check(cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)),
            "EPILOGUE");
      const cudaDataType_t bias_type = CUDA_R_32F;
      check(cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof(bias_type)),
            "BIAS_DATA_TYPE");
    }
    // Stored shapes, column-major: cuBLASLt's A is our B (k x n row-major, or n x k transposed), its B our A.
    check(cublasLtMatrixLayoutCreate(&plan.a, CUDA_R_32F, trans_b ? k : n, trans_b ? n : k, ldb), "layout A");
    check(cublasLtMatrixLayoutCreate(&plan.b, CUDA_R_32F, trans_a ? m : k, trans_a ? k : m, lda), "layout B");
    check(cublasLtMatrixLayoutCreate(&plan.c, CUDA_R_32F, n, m, ldc), "layout C");
    cublasLtMatmulPreference_t pref = nullptr;
    check(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
    const uint64_t workspace = kWorkspaceBytes;
    cublasStatus_t s = CUBLAS_STATUS_SUCCESS;
    auto prefer = [&](cublasLtMatmulPreferenceAttributes_t attribute, const void* value, size_t size) {
      if (s == CUBLAS_STATUS_SUCCESS) s = cublasLtMatmulPreferenceSetAttribute(pref, attribute, value, size);
    };
    prefer(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace, sizeof(workspace));
    prefer(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a, sizeof(align_a));
    prefer(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b, sizeof(align_b));
    prefer(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_c, sizeof(align_c));
    prefer(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_c, sizeof(align_c));
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    if (s == CUBLAS_STATUS_SUCCESS)
      s = cublasLtMatmulAlgoGetHeuristic(lt_, plan.op, plan.a, plan.b, plan.c, plan.c, pref, 1, &result, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    check(s, "cublasLtMatmulAlgoGetHeuristic");
    if (found == 0)
      throw std::runtime_error("cuBLASLt has no algorithm for a " + std::to_string(m) + " x " + std::to_string(n) +
                               " x " + std::to_string(k) + " matmul");
    plan.algo = result.algo;
  }

  cudaStream_t stream_ = nullptr;
  cublasLtHandle_t lt_ = nullptr;
  void* workspace_ = nullptr;
  std::map<Key, Plan> plans_;
  std::vector<void*> blocks_;
  size_t bytes_ = 0;
};

}  // namespace

bool cuda_available(std::string* why) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    if (why) *why = e != cudaSuccess ? cudaGetErrorString(e) : "no device";
    return false;
  }
  return true;
}

std::unique_ptr<ModelRunner> make_cuda_runner(const ModelConfig& c, int batch, bool checkpointing) {
  std::string why;
  if (!cuda_available(&why)) throw std::runtime_error("no CUDA device: " + why);
  return std::make_unique<RunnerOn<CudaBackend>>(c, batch, checkpointing);
}

}  // namespace device
}  // namespace gpt
