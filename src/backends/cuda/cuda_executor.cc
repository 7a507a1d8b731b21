// The cuda and cuda-sparse schedules: the specialized graph on the first CUDA device, op by op
// on one stream, through NVIDIA's libraries, for comparison with the CPU schedules.
//
// - Conv: cuDNN (legacy v7-style API, still in cuDNN 9), the algorithm chosen by
//   cudnnFindConvolutionForwardAlgorithm at build. Bias, a residual Add and Relu fuse into
//   cudnnConvolutionBiasActivationForward (y = relu(conv(x) + z + bias), the only activations it
//   takes are Relu and identity); whatever is left of the epilogue runs as one element-wise pass.
// - MatMul / Gemm: cuBLASLt, row-major operands passed as their column-major transposes
//   (D^T = B^T A^T), batched with strided offsets (a broadcast operand has stride 0), a constant
//   2-D weight folding the batch into M. Bias, one residual Add (as C with beta = 1) and Relu
//   fuse into the matmul epilogue. cuBLASLt's GELU epilogue is the tanh approximation, the
//   models' is the erf form: GELU runs in the element-wise pass.
// - cuda-sparse: Conv (as im2col + GEMM) and MatMul/Gemm whose constant weight has at least
//   Options::sparse_threshold zeros (kDefaultSparseThreshold when unset) run as cuSPARSE SpMM
//   with the weight in CSR (32-bit indices), so that the comparison shows what unstructured
//   sparsity buys on a GPU.
// - Pooling and Softmax: cuDNN. LayerNorm, element-wise ops, epilogues, transposes, im2col: the
//   small kernels of cuda_kernels.cu. Concat: strided 2-D copies. Reshapes: aliases, no copy.
// - Anything else (Gather, Cast, int64 ops, a broadcast or padding the libraries do not take)
//   runs its reference op on the host: inputs copied into pinned staging, the op run by
//   cudaLaunchHostFunc, outputs copied back, all ordered on the stream (so it also works inside
//   a CUDA Graph). Slow but correct; `layers()` and SPARSECOL_VERBOSE=1 say which nodes and why.
//   Refusing such models instead would make the comparison unavailable exactly where a user
//   wants it.
//
// Weights are uploaded once, at build. Activations live in one device arena planned with
// plan_memory (plan/memory_plan.h) like the layerwise executor's; library workspaces share one
// buffer sized for the largest step (steps run one after another on the stream).
// Precision: kFp32 keeps every library on FP32 FMA math (cuDNN CUDNN_FMA_MATH, cuBLASLt
// CUBLAS_COMPUTE_32F), kTf32 allows TF32 tensor cores, kFp16 allows FP16 tensor-core compute on
// the FP32 tensors (storage stays FP32); the implementation strings say which.
#include <cuda_runtime.h>
#include <cudnn.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <tuple>
#include <type_traits>

#include <fmt/format.h>

#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/cuda_kernels.h"
#include "backends/cuda/cuda_libraries.h"
#include "graph/op_params.h"
#include "plan/memory_plan.h"
#include "runtime/epilogue.h"
#include "runtime/executor.h"
#include "runtime/layerwise/steps.h"
#include "runtime/reference/reference_ops.h"

namespace sparsecol::runtime {

namespace {

using Dims = std::vector<int64_t>;

// Weights with at least this fraction of zeros go to cuSPARSE in the cuda-sparse schedule
// unless Options::sparse_threshold says otherwise. Not measured yet (no GPU was available when
// this was written, see docs/GPU.md): published cuSPARSE SpMM figures put the break-even against
// dense cuBLAS FP32 between 70 and 95% sparsity depending on shape.
constexpr double kDefaultSparseThreshold = 0.7;
// cuBLASLt workspace: NVIDIA recommends 32 MiB on Hopper.
constexpr std::size_t kLtWorkspaceBytes = std::size_t{32} << 20;
// A convolution algorithm needing more workspace than this is skipped.
constexpr std::size_t kMaxConvWorkspaceBytes = std::size_t{1} << 30;
// Arena offsets: 256 bytes, the alignment cuBLASLt and cuDNN's fastest kernels assume.
constexpr int64_t kArenaAlignment = 256;

// ---- errors ----

// A node the device path cannot take: it runs on the host instead (the reason is reported).
struct Unmapped {
  std::string reason;
};

// The dlopen'ed cuBLASLt and cuSPARSE (cuda_libraries.h); loaded before any executor exists.
const cuda::Libraries& lib() { return cuda::libraries(); }

std::string status_string(cudaError_t e) { return cudaGetErrorString(e); }
std::string status_string(cudnnStatus_t s) { return cudnnGetErrorString(s); }
std::string status_string(cublasStatus_t s) { return lib().cublasLtGetStatusString(s); }
std::string status_string(cusparseStatus_t s) { return lib().cusparseGetErrorString(s); }
bool ok(cudaError_t e) { return e == cudaSuccess; }
bool ok(cudnnStatus_t s) { return s == CUDNN_STATUS_SUCCESS; }
bool ok(cublasStatus_t s) { return s == CUBLAS_STATUS_SUCCESS; }
bool ok(cusparseStatus_t s) { return s == CUSPARSE_STATUS_SUCCESS; }

template <typename Status>
void check(Status status, const char* call) {
  if (ok(status)) return;
  if constexpr (std::is_same_v<Status, cudaError_t>) {
    if (status == cudaErrorMemoryAllocation) {
      throw Error(ErrorCode::kOutOfMemory,
                  fmt::format("cuda: {}: {}", call, status_string(status)));
    }
  }
  throw Error(ErrorCode::kInternal,
              fmt::format("cuda: {} failed: {}", call, status_string(status)));
}
#define SPARSECOL_CUDA_CHECK(call) check((call), #call)

// ---- owned handles ----

template <auto Destroy>
struct Destroyer {
  template <typename T>
  void operator()(T* handle) const {
    (void)Destroy(handle);
  }
};
template <typename Handle, auto Destroy>
using Owned = std::unique_ptr<std::remove_pointer_t<Handle>, Destroyer<Destroy>>;

using TensorDesc = Owned<cudnnTensorDescriptor_t, cudnnDestroyTensorDescriptor>;
using FilterDesc = Owned<cudnnFilterDescriptor_t, cudnnDestroyFilterDescriptor>;
using ConvDesc = Owned<cudnnConvolutionDescriptor_t, cudnnDestroyConvolutionDescriptor>;
using PoolDesc = Owned<cudnnPoolingDescriptor_t, cudnnDestroyPoolingDescriptor>;
using ActivationDesc = Owned<cudnnActivationDescriptor_t, cudnnDestroyActivationDescriptor>;
// Handles of the dlopen'ed libraries, destroyed through their function pointers.
template <auto Member>
struct LibraryDestroyer {
  template <typename T>
  void operator()(T* handle) const {
    (void)(lib().*Member)(handle);
  }
};
template <typename Handle, auto Member>
using LibraryOwned = std::unique_ptr<std::remove_pointer_t<Handle>, LibraryDestroyer<Member>>;
using LtHandle = LibraryOwned<cublasLtHandle_t, &cuda::Libraries::cublasLtDestroy>;
using LtDesc = LibraryOwned<cublasLtMatmulDesc_t, &cuda::Libraries::cublasLtMatmulDescDestroy>;
using LtLayout =
    LibraryOwned<cublasLtMatrixLayout_t, &cuda::Libraries::cublasLtMatrixLayoutDestroy>;
using LtPreference =
    LibraryOwned<cublasLtMatmulPreference_t, &cuda::Libraries::cublasLtMatmulPreferenceDestroy>;
using SparseHandle = LibraryOwned<cusparseHandle_t, &cuda::Libraries::cusparseDestroy>;
using SpMat = LibraryOwned<cusparseSpMatDescr_t, &cuda::Libraries::cusparseDestroySpMat>;
using DnMat = LibraryOwned<cusparseDnMatDescr_t, &cuda::Libraries::cusparseDestroyDnMat>;
using DeviceMemory = Owned<void*, cudaFree>;
using PinnedMemory = Owned<void*, cudaFreeHost>;

template <typename Handle, auto Create, auto Destroy>
Owned<Handle, Destroy> create(const char* what) {
  Handle handle{};
  check(Create(&handle), what);
  return Owned<Handle, Destroy>(handle);
}

DeviceMemory device_alloc(std::size_t bytes) {
  void* p = nullptr;
  if (bytes > 0) check(cudaMalloc(&p, bytes), "cudaMalloc");
  return DeviceMemory(p);
}

int to_int(int64_t v, const char* what) {
  if (v < 0 || v > INT_MAX) throw Unmapped{fmt::format("{} {} does not fit a 32-bit int", what, v)};
  return static_cast<int>(v);
}

// The product of dims[from, to).
int64_t product(const Dims& dims, std::size_t from = 0) {
  return std::accumulate(dims.begin() + static_cast<std::ptrdiff_t>(std::min(from, dims.size())),
                         dims.end(), int64_t{1}, std::multiplies<>());
}
int64_t product_before(const Dims& dims, std::size_t to) {
  return std::accumulate(dims.begin(),
                         dims.begin() + static_cast<std::ptrdiff_t>(std::min(to, dims.size())),
                         int64_t{1}, std::multiplies<>());
}

Dims row_major_strides(const Dims& dims) {
  Dims strides(dims.size(), 1);
  for (std::size_t i = dims.size(); i-- > 1;) strides[i - 1] = strides[i] * dims[i];
  return strides;
}

// `dims` right-aligned to `rank` (numpy broadcasting), leading 1s stripped when too long.
Dims align_rank(Dims dims, std::size_t rank) {
  while (dims.size() > rank && dims.front() == 1) dims.erase(dims.begin());
  if (dims.size() > rank) throw Unmapped{"an operand of higher rank than the output"};
  dims.insert(dims.begin(), rank - dims.size(), 1);
  return dims;
}

TensorDesc tensor_desc(const Dims& nchw) {
  TensorDesc desc =
      create<cudnnTensorDescriptor_t, cudnnCreateTensorDescriptor, cudnnDestroyTensorDescriptor>(
          "cudnnCreateTensorDescriptor");
  SPARSECOL_CUDA_CHECK(cudnnSetTensor4dDescriptor(
      desc.get(), CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, to_int(nchw[0], "batch"),
      to_int(nchw[1], "channels"), to_int(nchw[2], "height"), to_int(nchw[3], "width")));
  return desc;
}

// N, C and spatial dims as cuDNN's 4-D NCHW: a 1-D spatial axis becomes W with H = 1.
Dims as_nchw(const Dims& dims) {
  if (dims.size() == 3) return {dims[0], dims[1], 1, dims[2]};
  if (dims.size() == 4) return dims;
  throw Unmapped{fmt::format("rank {} (cuDNN path takes 1-D and 2-D spatial only)", dims.size())};
}

const char* precision_name(GpuPrecision p) {
  switch (p) {
    case GpuPrecision::kFp32:
      return "fp32";
    case GpuPrecision::kTf32:
      return "tf32";
    case GpuPrecision::kFp16:
      return "fp16";
  }
  return "?";
}

bool verbose_from_env() {
  const char* v = std::getenv("SPARSECOL_VERBOSE");
  return v != nullptr && *v != '\0' && std::strcmp(v, "0") != 0;
}

// A weight in CSR, 32-bit indices (cuSPARSE's fastest), built on the host from a row-major
// matrix whose element (r, c) is at data[r * row_stride + c * col_stride], scaled by `scale`.
struct HostCsr {
  std::vector<int32_t> row_offsets{0};
  std::vector<int32_t> columns;
  std::vector<float> values;
  int64_t rows = 0, cols = 0;
  int64_t bytes() const {
    return static_cast<int64_t>((row_offsets.size() + columns.size()) * sizeof(int32_t) +
                                values.size() * sizeof(float));
  }
};

HostCsr make_csr(const float* data, int64_t rows, int64_t cols, int64_t row_stride,
                 int64_t col_stride, float scale) {
  HostCsr csr;
  csr.rows = rows;
  csr.cols = cols;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const float v = data[r * row_stride + c * col_stride];
      if (v != 0.0f) {
        csr.columns.push_back(static_cast<int32_t>(c));
        csr.values.push_back(v * scale);
      }
    }
    if (csr.columns.size() > static_cast<std::size_t>(INT32_MAX)) throw Unmapped{"nnz >= 2^31"};
    csr.row_offsets.push_back(static_cast<int32_t>(csr.columns.size()));
  }
  return csr;
}

double zero_fraction(const Tensor& t) {
  if (t.dtype() != DType::kFloat32 || t.numel() == 0) return 0.0;
  const float* p = t.data<float>();
  return static_cast<double>(std::count(p, p + t.numel(), 0.0f)) / static_cast<double>(t.numel());
}

// One node as it runs: a closure over prebuilt descriptors and fixed device pointers, so a run
// (or a CUDA Graph capture) only launches. Views have no launch.
struct Step {
  std::function<void()> launch;
  std::string implementation;
  std::string weight_format;
  int64_t packed_bytes = 0;
};

// The host side of a fallback node: pinned copies of its inputs and outputs.
struct HostFallback {
  const graph::Graph* graph = nullptr;
  const graph::Node* node = nullptr;
  const RefOp* op = nullptr;
  std::vector<Tensor> inputs;   // per node input: a host constant or a view of pinned staging
  std::vector<Tensor> outputs;  // views of pinned staging
  std::vector<PinnedMemory> staging;
  std::string* error = nullptr;  // the executor's: the first failure of a run

  static void CUDART_CB run(void* self) { static_cast<HostFallback*>(self)->execute(); }
  void execute() {
    if (!error->empty()) return;
    try {
      std::vector<const Tensor*> in;
      for (const Tensor& t : inputs) in.push_back(t.empty() ? nullptr : &t);
      RefOpContext ctx{*graph, *node, {}, {}};
      ctx.inputs.assign(in.begin(),
                        in.begin() + static_cast<std::ptrdiff_t>(node->own_input_count()));
      for (Tensor& t : outputs) {
        std::memset(t.raw_data(), 0, t.nbytes());  // reference ops expect zero-filled outputs
        ctx.outputs.push_back(&t);
      }
      op->run(ctx);
      if (!node->epilogue.empty()) apply_epilogue(*graph, *node, in, outputs.at(0));
    } catch (const std::exception& e) {
      *error = e.what();
    }
  }
};

class CudaExecutor final : public Executor {
 public:
  CudaExecutor(graph::Graph graph, const Options& options)
      : graph_(std::move(graph)),
        options_(options),
        sparse_(options.schedule == Schedule::kCudaSparse),
        verbose_(options.verbose || verbose_from_env()) {
    SPARSECOL_CUDA_CHECK(cudaSetDevice(0));
    cudaStream_t stream = nullptr;
    SPARSECOL_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    stream_.reset(stream);
    cudnn_ = create<cudnnHandle_t, cudnnCreate, cudnnDestroy>("cudnnCreate");
    SPARSECOL_CUDA_CHECK(cudnnSetStream(cudnn_.get(), stream_.get()));
    cublasLtHandle_t lt = nullptr;
    SPARSECOL_CUDA_CHECK(lib().cublasLtCreate(&lt));
    lt_.reset(lt);
    cusparseHandle_t sparse = nullptr;
    SPARSECOL_CUDA_CHECK(lib().cusparseCreate(&sparse));
    cusparse_.reset(sparse);
    SPARSECOL_CUDA_CHECK(lib().cusparseSetStream(cusparse_.get(), stream_.get()));
    plan_buffers();
    for (std::size_t n = 0; n < graph_.nodes.size(); ++n) build_node(n);
    workspace_ = device_alloc(workspace_bytes_);
  }

  ~CudaExecutor() override {
    // Work in flight reads our buffers: let it finish before they are freed.
    if (stream_) (void)cudaStreamSynchronize(stream_.get());
  }

  NamedTensors run(const NamedTensors& inputs) override {
    SPARSECOL_CUDA_CHECK(cudaSetDevice(0));
    cudaStream_t stream = stream_.get();
    for (int v : graph_.inputs) {
      const Tensor& t = inputs.at(value(v).name);
      if (t.nbytes() > 0) {
        SPARSECOL_CUDA_CHECK(cudaMemcpyAsync(device_ptr(v), t.raw_data(), t.nbytes(),
                                             cudaMemcpyHostToDevice, stream));
      }
    }
    host_error_.clear();
    if (profiler_ != nullptr) {
      // Per-layer times need a synchronization after each step: profiled runs are slower.
      profiler_->begin_run(1);
      for (std::size_t n = 0; n < steps_.size(); ++n) {
        Profiler::Scope timed(profiler_, 0, graph_.nodes[n]);
        if (steps_[n].launch) steps_[n].launch();
        SPARSECOL_CUDA_CHECK(cudaStreamSynchronize(stream));
      }
    } else if (graph_exec_) {
      SPARSECOL_CUDA_CHECK(cudaGraphLaunch(graph_exec_.get(), stream));
    } else {
      launch_all();
      // The first run is eager (libraries load their kernels lazily, outside any capture);
      // later runs replay its capture.
      if (options_.cuda_graphs) capture();
    }
    NamedTensors outputs;
    for (int v : graph_.outputs) {
      const graph::Value& val = value(v);
      if (val.constant) {
        outputs[val.name] = val.constant->clone();
        continue;
      }
      Tensor out = Tensor::zeros(val.dtype, dims_[static_cast<std::size_t>(v)]);
      if (out.nbytes() > 0) {
        SPARSECOL_CUDA_CHECK(cudaMemcpyAsync(out.raw_data(), device_ptr(v), out.nbytes(),
                                             cudaMemcpyDeviceToHost, stream));
      }
      outputs[val.name] = std::move(out);
    }
    SPARSECOL_CUDA_CHECK(cudaStreamSynchronize(stream));
    if (!host_error_.empty()) {
      throw Error(ErrorCode::kInternal, fmt::format("cuda: host fallback: {}", host_error_));
    }
    return outputs;
  }

  std::vector<LayerInfo> layers() const override {
    std::vector<LayerInfo> infos;
    for (std::size_t n = 0; n < graph_.nodes.size(); ++n) {
      LayerInfo info = describe_node(graph_, graph_.nodes[n]);
      info.implementation = steps_[n].implementation;
      if (!steps_[n].weight_format.empty()) {
        info.weight_format = steps_[n].weight_format;
        info.packed_bytes = steps_[n].packed_bytes;
      }
      infos.push_back(std::move(info));
    }
    return infos;
  }

 private:
  using GraphExec = Owned<cudaGraphExec_t, cudaGraphExecDestroy>;
  using CudaGraph = Owned<cudaGraph_t, cudaGraphDestroy>;
  using Stream = Owned<cudaStream_t, cudaStreamDestroy>;

  const graph::Value& value(int id) const { return graph_.values[static_cast<std::size_t>(id)]; }
  const Dims& dims(int id) const { return dims_[static_cast<std::size_t>(id)]; }
  bool is_constant(int id) const { return id >= 0 && value(id).constant.has_value(); }
  std::string precision() const { return precision_name(options_.gpu_precision); }

  void launch_all() {
    for (Step& step : steps_) {
      if (step.launch) step.launch();
    }
  }

  void capture() {
    cudaStream_t stream = stream_.get();
    SPARSECOL_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    try {
      launch_all();
    } catch (...) {
      cudaGraph_t broken = nullptr;
      (void)cudaStreamEndCapture(stream, &broken);
      if (broken != nullptr) (void)cudaGraphDestroy(broken);
      throw;
    }
    cudaGraph_t captured = nullptr;
    SPARSECOL_CUDA_CHECK(cudaStreamEndCapture(stream, &captured));
    CudaGraph owned(captured);
    cudaGraphExec_t exec = nullptr;
    SPARSECOL_CUDA_CHECK(cudaGraphInstantiate(&exec, captured, 0));
    graph_exec_.reset(exec);
  }

  // ---- buffers ----

  // Concrete dims of every value, which buffer each value lives in (a view shares its input's),
  // and one arena for all of them plus the sparse convolutions' scratch, planned like the
  // layerwise executor's: a buffer lives from its producer to its last reader.
  void plan_buffers() {
    const std::size_t count = graph_.values.size();
    dims_.resize(count);
    root_.assign(count, -1);
    for (std::size_t v = 0; v < count; ++v) {
      const graph::Value& val = graph_.values[v];
      auto d = val.shape ? graph::concrete(*val.shape) : std::nullopt;
      if (d) dims_[v] = *d;
      const bool needed =
          val.producer >= 0 || std::count(graph_.inputs.begin(), graph_.inputs.end(), int(v)) > 0;
      if (needed && !val.constant && (!d || !val.dtype_known)) {
        throw Error(ErrorCode::kInternal,
                    fmt::format("cuda: value '{}' has no concrete shape", val.name));
      }
    }
    for (int v : graph_.inputs) root_[static_cast<std::size_t>(v)] = v;
    std::vector<plan::BufferRequest> requests;
    std::vector<int> request_root;  // value id, or -1 - node index for scratch
    scratch_offsets_.resize(graph_.nodes.size());
    for (std::size_t n = 0; n < graph_.nodes.size(); ++n) {
      const graph::Node& node = graph_.nodes[n];
      if (layerwise::is_view_op(graph_, node) && !is_constant(node.input(0))) {
        root_[static_cast<std::size_t>(node.outputs[0])] =
            root_[static_cast<std::size_t>(node.input(0))];
        continue;
      }
      for (int o : node.outputs) {
        if (o >= 0 && !is_constant(o)) root_[static_cast<std::size_t>(o)] = o;
      }
      for (int64_t bytes : sparse_conv_scratch(node)) {
        requests.push_back({bytes, static_cast<int>(n), static_cast<int>(n)});
        request_root.push_back(-1 - static_cast<int>(n));
      }
    }
    std::vector<int> request_of(count, -1);
    for (std::size_t v = 0; v < count; ++v) {
      if (root_[v] != static_cast<int>(v)) continue;
      const int producer = graph_.values[v].producer;
      request_of[v] = static_cast<int>(requests.size());
      requests.push_back(
          {checked_numel(dims_[v]) * static_cast<int64_t>(dtype_size(graph_.values[v].dtype)),
           std::max(producer, 0), std::max(producer, 0)});
      request_root.push_back(static_cast<int>(v));
    }
    auto extend = [&](int v, int step) {
      if (v < 0 || root_[static_cast<std::size_t>(v)] < 0) return;
      plan::BufferRequest& r = requests[static_cast<std::size_t>(
          request_of[static_cast<std::size_t>(root_[static_cast<std::size_t>(v)])])];
      r.last_step = std::max(r.last_step, step);
    };
    for (std::size_t n = 0; n < graph_.nodes.size(); ++n) {
      for (int v : graph_.nodes[n].inputs) extend(v, static_cast<int>(n));
    }
    for (int v : graph_.outputs) extend(v, static_cast<int>(graph_.nodes.size()));
    const plan::MemoryPlan plan = plan::plan_memory(requests, kArenaAlignment);
    arena_ = device_alloc(static_cast<std::size_t>(plan.arena_size));
    offsets_.assign(count, -1);
    for (std::size_t r = 0; r < requests.size(); ++r) {
      if (request_root[r] >= 0) {
        offsets_[static_cast<std::size_t>(request_root[r])] = plan.offsets[r];
      } else {
        scratch_offsets_[static_cast<std::size_t>(-1 - request_root[r])].push_back(plan.offsets[r]);
      }
    }
    if (verbose_) {
      fmt::print(stderr, "sparsecol cuda: arena {:.1f} MiB for {} buffers\n",
                 static_cast<double>(plan.arena_size) / (1 << 20), requests.size());
    }
  }

  // The device address of a value: its arena place, or its uploaded constant.
  void* device_ptr(int v) {
    if (is_constant(v)) return const_cast<void*>(device_constant(v));
    const int root = root_.at(static_cast<std::size_t>(v));
    if (root < 0) throw Error(ErrorCode::kInternal, "cuda: value without a device buffer");
    return static_cast<std::byte*>(arena_.get()) + offsets_[static_cast<std::size_t>(root)];
  }
  float* fptr(int v) { return static_cast<float*>(device_ptr(v)); }
  float* scratch(std::size_t node, std::size_t i) {
    return reinterpret_cast<float*>(static_cast<std::byte*>(arena_.get()) +
                                    scratch_offsets_[node].at(i));
  }

  const void* upload(const void* data, std::size_t bytes) {
    weights_.push_back(device_alloc(bytes));
    if (bytes > 0) {
      SPARSECOL_CUDA_CHECK(cudaMemcpy(weights_.back().get(), data, bytes, cudaMemcpyHostToDevice));
    }
    return weights_.back().get();
  }
  const float* upload(const std::vector<float>& v) {
    return static_cast<const float*>(upload(v.data(), v.size() * sizeof(float)));
  }

  // A constant on the device, uploaded at its first use (weights a sparse layer replaces by its
  // CSR are never uploaded).
  const void* device_constant(int v) {
    auto it = constants_.find(v);
    if (it != constants_.end()) return it->second;
    const Tensor& t = *value(v).constant;
    return constants_[v] = upload(t.raw_data(), t.nbytes());
  }

  // ---- building ----

  void build_node(std::size_t n) {
    const graph::Node& node = graph_.nodes[n];
    Step step;
    if (layerwise::is_view_op(graph_, node) && !is_constant(node.input(0))) {
      step.implementation = "view (no copy)";
    } else {
      try {
        step = map_node(n, node);
      } catch (const Unmapped& u) {
        step = host_fallback(node, u.reason);
      } catch (const Error& e) {
        // A library refused this node's configuration at build (a bad-parameter or
        // not-supported status): run it on the host rather than refuse the model.
        if (e.code() != ErrorCode::kInternal) throw;
        step = host_fallback(node, e.what());
      }
    }
    if (verbose_) {
      fmt::print(stderr, "sparsecol cuda: {}: {}\n", graph_.where(node), step.implementation);
    }
    steps_.push_back(std::move(step));
  }

  Step map_node(std::size_t n, const graph::Node& node) {
    if (!node.domain.empty()) throw Unmapped{"custom domain"};
    for (int v : node.inputs) {
      if (v >= 0 && value(v).dtype != DType::kFloat32) throw Unmapped{"a non-float input"};
      if (v >= 0 && product(dims(v)) == 0) throw Unmapped{"an empty tensor"};
    }
    for (int v : node.outputs) {
      if (v >= 0 && value(v).dtype != DType::kFloat32) throw Unmapped{"a non-float output"};
    }
    const std::string& op = node.op_type;
    if (op == "Conv") return map_conv(n, node);
    if (op == "MatMul" || op == "Gemm") return map_gemm(node);
    if (op == "MaxPool" || op == "AveragePool" || op == "GlobalAveragePool" ||
        op == "GlobalMaxPool") {
      return map_pool(node);
    }
    if (op == "Softmax" || op == "LogSoftmax") return map_softmax(node);
    if (op == "LayerNormalization") return map_layer_norm(node);
    if (op == "Transpose") return map_transpose(node);
    if (op == "Concat") return map_concat(node);
    return map_elementwise(node);
  }

  // A graph input or constant as an element-wise operand over `out_dims`.
  cuda::Operand operand(int v, const Dims& out_dims) {
    if (out_dims.size() > static_cast<std::size_t>(cuda::kMaxRank)) {
      throw Unmapped{fmt::format("rank {} > {}", out_dims.size(), cuda::kMaxRank)};
    }
    cuda::Operand o;
    o.data = fptr(v);
    const Dims aligned = align_rank(dims(v), out_dims.size());
    const Dims strides = row_major_strides(aligned);
    for (std::size_t d = 0; d < out_dims.size(); ++d) {
      if (aligned[d] != out_dims[d] && aligned[d] != 1)
        throw Unmapped{"operand does not broadcast"};
      o.strides[d] = aligned[d] == 1 && out_dims[d] != 1 ? 0 : strides[d];
    }
    o.contiguous = aligned == out_dims;
    return o;
  }

  cuda::ElementwiseParams elementwise_over(const Dims& out_dims) {
    if (out_dims.size() > static_cast<std::size_t>(cuda::kMaxRank)) {
      throw Unmapped{fmt::format("rank {} > {}", out_dims.size(), cuda::kMaxRank)};
    }
    cuda::ElementwiseParams p;
    p.rank = static_cast<int>(out_dims.size());
    std::copy(out_dims.begin(), out_dims.end(), p.dims);
    return p;
  }

  // The node's epilogue from `first` on, appended to `p` as post-ops over the node's output.
  void add_post_ops(const graph::Node& node, std::size_t first, cuda::ElementwiseParams& p) {
    const Dims& out_dims = dims(node.outputs[0]);
    for (std::size_t i = first; i < node.epilogue.size(); ++i) {
      if (p.post_count == cuda::kMaxPostOps) throw Unmapped{"epilogue too long"};
      const graph::EpilogueOp& e = node.epilogue[i];
      cuda::PostOp& post = p.post[p.post_count++];
      switch (e.kind) {
        case graph::EpilogueOp::Kind::kRelu:
          post.op = cuda::ElementOp::kRelu;
          break;
        case graph::EpilogueOp::Kind::kGelu:
          post.op = cuda::ElementOp::kGelu;
          break;
        case graph::EpilogueOp::Kind::kClip:
          post.op = cuda::ElementOp::kClip;
          post.alpha = e.min;
          post.beta = e.max;
          break;
        case graph::EpilogueOp::Kind::kAdd:
          post.op = cuda::ElementOp::kAdd;
          post.operand = operand(node.inputs.at(static_cast<std::size_t>(e.input)), out_dims);
          break;
      }
    }
  }

  // A launch of `p` into `dst` (nothing when `p` would copy a buffer onto itself).
  std::function<void()> elementwise_launch(const cuda::ElementwiseParams& p, float* dst) {
    if (p.op == cuda::ElementOp::kCopy && p.post_count == 0 && p.a.data == dst && p.a.contiguous) {
      return {};
    }
    cudaStream_t stream = stream_.get();
    return [p, dst, stream] { SPARSECOL_CUDA_CHECK(cuda::launch_elementwise(p, dst, stream)); };
  }

  // The rest of a node's epilogue, in place on its output.
  std::function<void()> epilogue_launch(const graph::Node& node, std::size_t first) {
    const int out = node.outputs[0];
    cuda::ElementwiseParams p = elementwise_over(dims(out));
    p.a = operand(out, dims(out));
    add_post_ops(node, first, p);
    return elementwise_launch(p, fptr(out));
  }

  static std::function<void()> chain(std::function<void()> first, std::function<void()> second) {
    if (!second) return first;
    return [first = std::move(first), second = std::move(second)] {
      first();
      second();
    };
  }

  bool is_full_size_add(const graph::Node& node, std::size_t i) const {
    if (i >= node.epilogue.size() || node.epilogue[i].kind != graph::EpilogueOp::Kind::kAdd) {
      return false;
    }
    const int v = node.inputs.at(static_cast<std::size_t>(node.epilogue[i].input));
    return dims(v) == dims(node.outputs[0]);
  }

  // ---- Conv ----

  Step map_conv(std::size_t n, const graph::Node& node) {
    const int x = node.input(0), w = node.input(1), b = node.input(2), y = node.outputs[0];
    if (!is_constant(w) || (b >= 0 && !is_constant(b)))
      throw Unmapped{"weight or bias not constant"};
    std::optional<Dims> b_shape;
    if (b >= 0) b_shape = dims(b);
    const graph::ConvParams p = graph::parse_conv(graph_, node, dims(x), dims(w), b_shape);
    const graph::WindowParams& win = p.window;
    if (sparse_conv_eligible(node)) return map_sparse_conv(n, node, p);
    if (win.rank() > 2) throw Unmapped{"3-D convolution"};
    if (win.pads_begin != win.pads_end) throw Unmapped{"asymmetric padding"};

    // 1-D convolutions run as 2-D with a height of 1.
    auto hw = [&](const std::vector<int64_t>& v, int64_t fill) {
      return v.size() == 1 ? Dims{fill, v[0]} : Dims{v[0], v[1]};
    };
    const Dims kernel = hw(win.kernel, 1), stride = hw(win.strides, 1), pad = hw(win.pads_begin, 0),
               dilation = hw(win.dilations, 1);
    auto conv = std::make_shared<ConvState>();
    conv->x = tensor_desc(as_nchw(dims(x)));
    conv->y = tensor_desc(as_nchw(dims(y)));
    conv->bias = tensor_desc({1, p.out_channels, 1, 1});
    conv->w =
        create<cudnnFilterDescriptor_t, cudnnCreateFilterDescriptor, cudnnDestroyFilterDescriptor>(
            "cudnnCreateFilterDescriptor");
    SPARSECOL_CUDA_CHECK(cudnnSetFilter4dDescriptor(
        conv->w.get(), CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, to_int(p.out_channels, "channels"),
        to_int(p.in_channels / p.group, "channels"), to_int(kernel[0], "kernel"),
        to_int(kernel[1], "kernel")));
    conv->conv = create<cudnnConvolutionDescriptor_t, cudnnCreateConvolutionDescriptor,
                        cudnnDestroyConvolutionDescriptor>("cudnnCreateConvolutionDescriptor");
    SPARSECOL_CUDA_CHECK(cudnnSetConvolution2dDescriptor(
        conv->conv.get(), to_int(pad[0], "pad"), to_int(pad[1], "pad"), to_int(stride[0], "stride"),
        to_int(stride[1], "stride"), to_int(dilation[0], "dilation"),
        to_int(dilation[1], "dilation"), CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
    SPARSECOL_CUDA_CHECK(cudnnSetConvolutionGroupCount(conv->conv.get(), to_int(p.group, "group")));
    const cudnnMathType_t math = options_.gpu_precision == GpuPrecision::kFp32 ? CUDNN_FMA_MATH
                                 : options_.gpu_precision == GpuPrecision::kTf32
                                     ? CUDNN_DEFAULT_MATH
                                     : CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION;
    SPARSECOL_CUDA_CHECK(cudnnSetConvolutionMathType(conv->conv.get(), math));
    int on, oc, oh, ow;
    SPARSECOL_CUDA_CHECK(cudnnGetConvolution2dForwardOutputDim(conv->conv.get(), conv->x.get(),
                                                               conv->w.get(), &on, &oc, &oh, &ow));
    if (Dims{on, oc, oh, ow} != as_nchw(dims(y))) throw Unmapped{"cuDNN output shape differs"};

    // Fusion: y = relu(conv(x) + z + bias), z the first full-size residual Add.
    std::size_t consumed = 0;
    const float* z = nullptr;
    if (is_full_size_add(node, 0)) {
      z = fptr(node.inputs.at(static_cast<std::size_t>(node.epilogue[0].input)));
      consumed = 1;
    }
    const bool relu = consumed < node.epilogue.size() &&
                      node.epilogue[consumed].kind == graph::EpilogueOp::Kind::kRelu;
    if (relu) ++consumed;
    const bool fused = relu || z != nullptr;
    // Without Relu the fused call takes only the implicit-precomputed-GEMM algorithm (cuDNN
    // documentation of cudnnConvolutionBiasActivationForward).
    const cudnnConvolutionFwdAlgoPerf_t algo =
        choose_conv_algo(*conv, math, fused && !relu, dims(x), dims(y));
    SPARSECOL_CUDA_CHECK(cudnnSetConvolutionMathType(conv->conv.get(), algo.mathType));
    workspace_bytes_ = std::max(workspace_bytes_, algo.memory);

    const float* xp = fptr(x);
    const float* wp = static_cast<const float*>(device_constant(w));
    float* yp = fptr(y);
    const float* bias = b >= 0 ? static_cast<const float*>(device_constant(b)) : nullptr;
    Step step;
    step.weight_format = "dense";
    step.packed_bytes = value(w).constant->nbytes() + (b >= 0 ? value(b).constant->nbytes() : 0);
    cudnnHandle_t handle = cudnn_.get();
    const cudnnConvolutionFwdAlgo_t a = algo.algo;
    if (fused) {
      if (bias == nullptr)
        bias = upload(std::vector<float>(static_cast<std::size_t>(p.out_channels)));
      conv->activation =
          create<cudnnActivationDescriptor_t, cudnnCreateActivationDescriptor,
                 cudnnDestroyActivationDescriptor>("cudnnCreateActivationDescriptor");
      SPARSECOL_CUDA_CHECK(cudnnSetActivationDescriptor(
          conv->activation.get(), relu ? CUDNN_ACTIVATION_RELU : CUDNN_ACTIVATION_IDENTITY,
          CUDNN_NOT_PROPAGATE_NAN, 0.0));
      const float alpha2 = z != nullptr ? 1.0f : 0.0f;
      const float* zp = z != nullptr ? z : yp;  // not read when alpha2 is 0
      step.launch = [this, conv, handle, a, xp, wp, yp, zp, bias, alpha2] {
        const float one = 1.0f;
        SPARSECOL_CUDA_CHECK(cudnnConvolutionBiasActivationForward(
            handle, &one, conv->x.get(), xp, conv->w.get(), wp, conv->conv.get(), a,
            workspace_.get(), workspace_bytes_, &alpha2, conv->y.get(), zp, conv->bias.get(), bias,
            conv->activation.get(), conv->y.get(), yp));
      };
      step.launch = chain(std::move(step.launch), epilogue_launch(node, consumed));
    } else {
      step.launch = [this, conv, handle, a, xp, wp, yp] {
        const float one = 1.0f, zero = 0.0f;
        SPARSECOL_CUDA_CHECK(cudnnConvolutionForward(handle, &one, conv->x.get(), xp, conv->w.get(),
                                                     wp, conv->conv.get(), a, workspace_.get(),
                                                     workspace_bytes_, &zero, conv->y.get(), yp));
      };
      // Bias and the whole epilogue in one element-wise pass.
      cuda::ElementwiseParams post = elementwise_over(dims(y));
      post.a = operand(y, dims(y));
      if (bias != nullptr) {
        cuda::PostOp& add = post.post[post.post_count++];
        add.op = cuda::ElementOp::kAdd;
        add.operand = channel_operand(bias);
      }
      add_post_ops(node, 0, post);
      step.launch = chain(std::move(step.launch), elementwise_launch(post, yp));
    }
    step.implementation = fmt::format("cudnn conv{}{} algo {} [{}{}]", fused ? "+bias" : "",
                                      relu ? "+relu" : "", static_cast<int>(a), precision(),
                                      algo.mathType == CUDNN_FMA_MATH ? "" : " tensor ops");
    return step;
  }

  struct ConvState {
    TensorDesc x, y, bias;
    FilterDesc w;
    ConvDesc conv;
    ActivationDesc activation;
  };

  // A per-channel vector ([C]) as an operand over [N, C, spatial...].
  static cuda::Operand channel_operand(const float* data) {
    cuda::Operand o;
    o.data = data;
    o.strides[1] = 1;
    return o;
  }

  // The fastest algorithm cudnnFind measures within the workspace limit, preferring one that
  // fits the precision (kFp32: FMA math only); if cuDNN offers none, the fastest of the others
  // (its implementation string then says "tensor ops").
  cudnnConvolutionFwdAlgoPerf_t choose_conv_algo(const ConvState& conv, cudnnMathType_t math,
                                                 bool implicit_precomp_only, const Dims& x_dims,
                                                 const Dims& y_dims) {
    cudnnConvolutionFwdAlgoPerf_t results[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
    int returned = 0;
    SPARSECOL_CUDA_CHECK(cudnnFindConvolutionForwardAlgorithm(
        cudnn_.get(), conv.x.get(), conv.w.get(), conv.conv.get(), conv.y.get(),
        CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &returned, results));
    for (bool strict_math : {true, false}) {
      for (int i = 0; i < returned; ++i) {  // sorted by measured time
        const cudnnConvolutionFwdAlgoPerf_t& r = results[i];
        if (r.status != CUDNN_STATUS_SUCCESS || r.memory > kMaxConvWorkspaceBytes) continue;
        if (strict_math && math == CUDNN_FMA_MATH && r.mathType != CUDNN_FMA_MATH) continue;
        if (implicit_precomp_only && r.algo != CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM) {
          continue;
        }
        return r;
      }
    }
    throw Unmapped{fmt::format("cuDNN has no algorithm ({} requested) for x {} y {}",
                               precision_name(options_.gpu_precision), shape_string(x_dims),
                               shape_string(y_dims))};
  }

  // ---- sparse Conv (cuda-sparse): im2col + cuSPARSE SpMM ----

  double sparse_threshold() const {
    return options_.sparse_threshold >= 0.0 ? options_.sparse_threshold : kDefaultSparseThreshold;
  }

  bool sparse_conv_eligible(const graph::Node& node) const {
    if (!sparse_ || node.op_type != "Conv" || node.input(1) < 0 || !is_constant(node.input(1))) {
      return false;
    }
    const Dims& w = dims(node.input(1));
    return node.attr_int("group", 1) == 1 && (w.size() == 3 || w.size() == 4) &&
           zero_fraction(*value(node.input(1)).constant) >= sparse_threshold();
  }

  // The arena scratch a sparse convolution needs at its step: the column matrix (unless the
  // input already is one: a 1x1, stride-1, unpadded convolution of one image) and the SpMM
  // result in [M, N, pixels] order (unless N is 1, when that is the output's own order).
  std::vector<int64_t> sparse_conv_scratch(const graph::Node& node) const {
    if (!sparse_conv_eligible(node)) return {};
    const Dims& w = dims(node.input(1));
    const Dims& y = dims(node.outputs[0]);
    std::vector<int64_t> bytes;
    const int64_t pixels = product(y, 2), batch = y[0];
    if (!is_pointwise_unpadded(node) || batch != 1) {
      bytes.push_back(product(w, 1) * batch * pixels * 4);
    }
    if (batch != 1) bytes.push_back(w[0] * batch * pixels * 4);
    return bytes;
  }

  bool is_pointwise_unpadded(const graph::Node& node) const {
    const Dims& w = dims(node.input(1));
    const auto ones = [](const std::vector<int64_t>& v) {
      return std::all_of(v.begin(), v.end(), [](int64_t e) { return e == 1; });
    };
    const auto zeros = [](const std::vector<int64_t>& v) {
      return std::all_of(v.begin(), v.end(), [](int64_t e) { return e == 0; });
    };
    return product(w, 2) == 1 && ones(node.attr_ints("strides")) && zeros(node.attr_ints("pads")) &&
           node.attr_string("auto_pad", "NOTSET") == "NOTSET";
  }

  struct SpmmState {
    SpMat a;
    DnMat b, c;
    cusparseSpMMAlg_t algorithm = CUSPARSE_SPMM_ALG_DEFAULT;
  };

  // The launch of C = A B, A the CSR uploaded now (rows x cols), B and C dense as described;
  // C has `c_elements` floats at `c`. An all-zero weight only clears C (cuSPARSE is not asked
  // about nnz = 0).
  std::function<void()> spmm(const HostCsr& csr, DnMat b, DnMat c, float* c_data,
                             int64_t c_elements) {
    cudaStream_t stream = stream_.get();
    if (csr.values.empty()) {
      return [stream, c_data, c_elements] {
        SPARSECOL_CUDA_CHECK(
            cudaMemsetAsync(c_data, 0, static_cast<std::size_t>(c_elements) * 4, stream));
      };
    }
    auto state = std::make_shared<SpmmState>();
    const void* offsets = upload(csr.row_offsets.data(), csr.row_offsets.size() * sizeof(int32_t));
    const void* columns = upload(csr.columns.data(), csr.columns.size() * sizeof(int32_t));
    const void* values = upload(csr.values.data(), csr.values.size() * sizeof(float));
    cusparseSpMatDescr_t a = nullptr;
    SPARSECOL_CUDA_CHECK(lib().cusparseCreateCsr(
        &a, csr.rows, csr.cols, static_cast<int64_t>(csr.values.size()), const_cast<void*>(offsets),
        const_cast<void*>(columns), const_cast<void*>(values), CUSPARSE_INDEX_32I,
        CUSPARSE_INDEX_32I, CUSPARSE_INDEX_BASE_ZERO, CUDA_R_32F));
    state->a.reset(a);
    state->b = std::move(b);
    state->c = std::move(c);
    const float one = 1.0f, zero = 0.0f;
    std::size_t bytes = 0;
    SPARSECOL_CUDA_CHECK(lib().cusparseSpMM_bufferSize(
        cusparse_.get(), CUSPARSE_OPERATION_NON_TRANSPOSE, CUSPARSE_OPERATION_NON_TRANSPOSE, &one,
        state->a.get(), state->b.get(), &zero, state->c.get(), CUDA_R_32F, state->algorithm,
        &bytes));
    workspace_bytes_ = std::max(workspace_bytes_, bytes);
    cusparseHandle_t handle = cusparse_.get();
    return [this, state, handle] {
      const float one = 1.0f, zero = 0.0f;
      SPARSECOL_CUDA_CHECK(lib().cusparseSpMM(handle, CUSPARSE_OPERATION_NON_TRANSPOSE,
                                              CUSPARSE_OPERATION_NON_TRANSPOSE, &one,
                                              state->a.get(), state->b.get(), &zero, state->c.get(),
                                              CUDA_R_32F, state->algorithm, workspace_.get()));
    };
  }

  static DnMat dense_matrix(int64_t rows, int64_t cols, int64_t ld, float* data,
                            cusparseOrder_t order) {
    cusparseDnMatDescr_t m = nullptr;
    SPARSECOL_CUDA_CHECK(lib().cusparseCreateDnMat(&m, rows, cols, ld, data, CUDA_R_32F, order));
    return DnMat(m);
  }

  Step map_sparse_conv(std::size_t n, const graph::Node& node, const graph::ConvParams& p) {
    const int x = node.input(0), w = node.input(1), b = node.input(2), y = node.outputs[0];
    const Dims& y_dims = dims(y);
    const int64_t batch = p.batch, pixels = product(y_dims, 2), m = p.out_channels;
    const int64_t k = product(dims(w), 1);
    const Tensor& weight = *value(w).constant;
    const HostCsr csr = make_csr(weight.data<float>(), m, k, k, 1, 1.0f);
    std::size_t next_scratch = 0;
    Step step;
    // B: the column matrix [K, N * pixels].
    const float* cols = fptr(x);
    if (!is_pointwise_unpadded(node) || batch != 1) {
      float* col_buffer = scratch(n, next_scratch++);
      const graph::WindowParams& win = p.window;
      const bool one_d = win.rank() == 1;
      cuda::Im2ColParams ip;
      ip.batch = batch;
      ip.channels = p.in_channels;
      ip.in_h = one_d ? 1 : win.in_size[0];
      ip.in_w = win.in_size.back();
      ip.out_h = one_d ? 1 : win.out_size[0];
      ip.out_w = win.out_size.back();
      ip.kernel_h = one_d ? 1 : win.kernel[0];
      ip.kernel_w = win.kernel.back();
      ip.stride_h = one_d ? 1 : win.strides[0];
      ip.stride_w = win.strides.back();
      ip.pad_top = one_d ? 0 : win.pads_begin[0];
      ip.pad_left = win.pads_begin.back();
      ip.dilation_h = one_d ? 1 : win.dilations[0];
      ip.dilation_w = win.dilations.back();
      const float* xp = fptr(x);
      cudaStream_t stream = stream_.get();
      step.launch = [ip, xp, col_buffer, stream] {
        SPARSECOL_CUDA_CHECK(cuda::launch_im2col(ip, xp, col_buffer, stream));
      };
      cols = col_buffer;
    }
    // C: [M, N * pixels]; with one image that is the output itself.
    float* product_buffer = batch == 1 ? fptr(y) : scratch(n, next_scratch++);
    auto product =
        spmm(csr,
             dense_matrix(k, batch * pixels, batch * pixels, const_cast<float*>(cols),
                          CUSPARSE_ORDER_ROW),
             dense_matrix(m, batch * pixels, batch * pixels, product_buffer, CUSPARSE_ORDER_ROW),
             product_buffer, m * batch * pixels);
    step.launch =
        step.launch ? chain(std::move(step.launch), std::move(product)) : std::move(product);
    // [M, N, pixels] -> [N, M, pixels], with the bias and the epilogue, in one pass.
    cuda::ElementwiseParams post = elementwise_over(y_dims);
    post.a.data = product_buffer;
    const Dims spatial_strides = row_major_strides(Dims(y_dims.begin() + 2, y_dims.end()));
    post.a.strides[0] = pixels;
    post.a.strides[1] = batch * pixels;
    for (std::size_t d = 2; d < y_dims.size(); ++d) post.a.strides[d] = spatial_strides[d - 2];
    post.a.contiguous = batch == 1;
    if (b >= 0) {
      cuda::PostOp& add = post.post[post.post_count++];
      add.op = cuda::ElementOp::kAdd;
      add.operand = channel_operand(static_cast<const float*>(device_constant(b)));
    }
    add_post_ops(node, 0, post);
    step.launch = chain(std::move(step.launch), elementwise_launch(post, fptr(y)));
    step.implementation =
        fmt::format("cusparse spmm conv{} [fp32, {:.0f}% zeros]",
                    is_pointwise_unpadded(node) ? "" : " (im2col)", 100.0 * zero_fraction(weight));
    step.weight_format = "sparse-csr";
    step.packed_bytes = csr.bytes() + (b >= 0 ? value(b).constant->nbytes() : 0);
    return step;
  }

  // ---- MatMul / Gemm ----

  struct LtState {
    LtDesc desc;
    LtLayout a, b, c, d;
    cublasLtMatmulAlgo_t algo{};
    std::size_t workspace = 0;
    float alpha = 1.0f, beta = 0.0f;
  };

  // A row-major product D[M,N] = alpha op(A)[M,K] op(B)[K,N] (+ beta C) (+ bias[N]) (relu), in
  // `batch` strided slices, as cuBLASLt sees it: column-major D^T = op(B)^T op(A)^T.
  struct Product {
    int64_t m = 0, n = 0, k = 0, batch = 1;
    bool trans_a = false, trans_b = false;
    int64_t stride_a = 0, stride_b = 0;  // elements between slices, 0 to broadcast
    const float* a = nullptr;
    const float* b = nullptr;
    const float* c = nullptr;  // null: no C
    float* d = nullptr;
    const float* bias = nullptr;
    bool relu = false;
    float alpha = 1.0f, beta = 0.0f;
  };

  static uint32_t alignment_of(const void* p, std::initializer_list<int64_t> element_strides) {
    uint32_t align = 256;
    auto address = reinterpret_cast<uintptr_t>(p);
    while (align > 4 && (address % align) != 0) align /= 2;
    for (int64_t s : element_strides) {
      while (align > 4 && (s * 4) % align != 0) align /= 2;
    }
    return align;
  }

  LtLayout lt_layout(int64_t rows, int64_t cols, int64_t ld, int64_t batch, int64_t stride) {
    cublasLtMatrixLayout_t layout = nullptr;
    SPARSECOL_CUDA_CHECK(lib().cublasLtMatrixLayoutCreate(
        &layout, CUDA_R_32F, static_cast<uint64_t>(rows), static_cast<uint64_t>(cols), ld));
    LtLayout owned(layout);
    if (batch > 1) {
      const int32_t count = to_int(batch, "batch");
      SPARSECOL_CUDA_CHECK(lib().cublasLtMatrixLayoutSetAttribute(
          layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)));
      SPARSECOL_CUDA_CHECK(lib().cublasLtMatrixLayoutSetAttribute(
          layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride)));
    }
    return owned;
  }

  std::function<void()> lt_matmul(const Product& pr, std::string* label) {
    auto lt = std::make_shared<LtState>();
    const cublasComputeType_t compute =
        options_.gpu_precision == GpuPrecision::kFp32   ? CUBLAS_COMPUTE_32F
        : options_.gpu_precision == GpuPrecision::kTf32 ? CUBLAS_COMPUTE_32F_FAST_TF32
                                                        : CUBLAS_COMPUTE_32F_FAST_16F;
    cublasLtMatmulDesc_t desc = nullptr;
    SPARSECOL_CUDA_CHECK(lib().cublasLtMatmulDescCreate(&desc, compute, CUDA_R_32F));
    lt->desc.reset(desc);
    // cuBLASLt's A is our B, its B our A (the column-major transposes).
    const cublasOperation_t op_a = pr.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t op_b = pr.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    SPARSECOL_CUDA_CHECK(lib().cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA,
                                                              &op_a, sizeof(op_a)));
    SPARSECOL_CUDA_CHECK(lib().cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB,
                                                              &op_b, sizeof(op_b)));
    cublasLtEpilogue_t epilogue =
        pr.bias != nullptr ? (pr.relu ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_BIAS)
                           : (pr.relu ? CUBLASLT_EPILOGUE_RELU : CUBLASLT_EPILOGUE_DEFAULT);
    SPARSECOL_CUDA_CHECK(lib().cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE,
                                                              &epilogue, sizeof(epilogue)));
    if (pr.bias != nullptr) {
      SPARSECOL_CUDA_CHECK(lib().cublasLtMatmulDescSetAttribute(
          desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &pr.bias, sizeof(pr.bias)));
    }
    // Stored shapes (before op): B is [K,N] row-major = [N,K] column-major (ld N), or [N,K]
    // row-major with trans_b = [K,N] column-major (ld K); likewise A.
    const int64_t lda = pr.trans_b ? pr.k : pr.n;
    const int64_t ldb = pr.trans_a ? pr.m : pr.k;
    lt->a = pr.trans_b ? lt_layout(pr.k, pr.n, lda, pr.batch, pr.stride_b)
                       : lt_layout(pr.n, pr.k, lda, pr.batch, pr.stride_b);
    lt->b = pr.trans_a ? lt_layout(pr.m, pr.k, ldb, pr.batch, pr.stride_a)
                       : lt_layout(pr.k, pr.m, ldb, pr.batch, pr.stride_a);
    lt->c = lt_layout(pr.n, pr.m, pr.n, pr.batch, pr.m * pr.n);
    lt->d = lt_layout(pr.n, pr.m, pr.n, pr.batch, pr.m * pr.n);
    lt->alpha = pr.alpha;
    lt->beta = pr.c != nullptr ? pr.beta : 0.0f;

    cublasLtMatmulPreference_t pref = nullptr;
    SPARSECOL_CUDA_CHECK(lib().cublasLtMatmulPreferenceCreate(&pref));
    LtPreference owned_pref(pref);
    const uint64_t max_workspace = kLtWorkspaceBytes;
    SPARSECOL_CUDA_CHECK(lib().cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &max_workspace, sizeof(max_workspace)));
    const float* c = pr.c != nullptr ? pr.c : pr.d;
    const uint32_t align[4] = {
        alignment_of(pr.b, {lda, pr.stride_b}), alignment_of(pr.a, {ldb, pr.stride_a}),
        alignment_of(c, {pr.n, pr.m * pr.n}), alignment_of(pr.d, {pr.n, pr.m * pr.n})};
    const cublasLtMatmulPreferenceAttributes_t align_attrs[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    for (int i = 0; i < 4; ++i) {
      SPARSECOL_CUDA_CHECK(lib().cublasLtMatmulPreferenceSetAttribute(pref, align_attrs[i],
                                                                      &align[i], sizeof(align[i])));
    }
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    const cublasStatus_t status =
        lib().cublasLtMatmulAlgoGetHeuristic(lt_.get(), desc, lt->a.get(), lt->b.get(), lt->c.get(),
                                             lt->d.get(), pref, 1, &result, &found);
    if (status != CUBLAS_STATUS_SUCCESS || found == 0) {
      throw Unmapped{fmt::format("cuBLASLt has no algorithm ({})", status_string(status))};
    }
    lt->algo = result.algo;
    lt->workspace = result.workspaceSize;
    workspace_bytes_ = std::max(workspace_bytes_, result.workspaceSize);
    *label = fmt::format("cublaslt {}gemm{}{}{} [{}]", pr.batch > 1 ? "batched " : "",
                         pr.bias != nullptr ? "+bias" : "", pr.c != nullptr ? "+residual" : "",
                         pr.relu ? "+relu" : "", precision());
    cublasLtHandle_t handle = lt_.get();
    cudaStream_t stream = stream_.get();
    const Product p = pr;
    return [this, lt, handle, stream, p, c] {
      SPARSECOL_CUDA_CHECK(lib().cublasLtMatmul(
          handle, lt->desc.get(), &lt->alpha, p.b, lt->a.get(), p.a, lt->b.get(), &lt->beta, c,
          lt->c.get(), p.d, lt->d.get(), &lt->algo, workspace_.get(), lt->workspace, stream));
    };
  }

  // The [N] vector a constant broadcasts to, scaled, if it is one (ONNX Gemm's C, a bias Add).
  std::optional<std::vector<float>> row_vector(int v, int64_t n, float scale) const {
    if (!is_constant(v)) return std::nullopt;
    Dims d = dims(v);
    while (!d.empty() && d.front() == 1) d.erase(d.begin());
    if (d != Dims{n}) return std::nullopt;
    const float* data = value(v).constant->data<float>();
    std::vector<float> out(data, data + n);
    for (float& e : out) e *= scale;
    return out;
  }

  Step map_gemm(const graph::Node& node) {
    const int a = node.input(0), b = node.input(1), y = node.outputs[0];
    const bool gemm = node.op_type == "Gemm";
    Product pr;
    int gemm_c = -1;  // Gemm's C when it must be added after the product
    float gemm_beta = 1.0f;
    bool b_batched = false;
    if (gemm) {
      std::optional<Dims> c_shape;
      if (node.input(2) >= 0) c_shape = dims(node.input(2));
      const graph::GemmParams p = graph::parse_gemm(graph_, node, dims(a), dims(b), c_shape);
      pr.m = p.m;
      pr.n = p.n;
      pr.k = p.k;
      pr.trans_a = p.trans_a;
      pr.trans_b = p.trans_b;
      pr.alpha = p.alpha;
      if (node.input(2) >= 0 && p.beta != 0.0f) {
        gemm_c = node.input(2);
        gemm_beta = p.beta;
      }
    } else {
      const graph::MatMulParams p = graph::parse_matmul(graph_, node, dims(a), dims(b));
      pr.m = p.m;
      pr.n = p.n;
      pr.k = p.k;
      const int64_t batch = product(p.batch), a_batch = product(p.a_batch),
                    b_batch = product(p.b_batch);
      b_batched = b_batch != 1;
      if (is_constant(b) && !b_batched) {
        pr.m *= a_batch;  // a constant 2-D weight: the batch folds into the rows
      } else {
        auto stride = [&](int64_t operand_batch, int64_t slice) -> int64_t {
          if (operand_batch == batch) return slice;
          if (operand_batch == 1) return 0;
          throw Unmapped{"a partially broadcast batch"};
        };
        pr.batch = batch;
        pr.stride_a = stride(a_batch, pr.m * pr.k);
        pr.stride_b = stride(b_batch, pr.k * pr.n);
      }
    }
    pr.a = fptr(a);
    pr.d = fptr(y);
    const bool sparse_weight = sparse_ && is_constant(b) && !b_batched && !pr.trans_a &&
                               zero_fraction(*value(b).constant) >= sparse_threshold();
    if (sparse_weight) return map_sparse_gemm(node, pr, gemm_c, gemm_beta);
    pr.b = is_constant(b) && pr.alpha != 1.0f ? nullptr : fptr(b);
    if (pr.b == nullptr) {  // alpha folds into a constant weight
      std::vector<float> scaled(value(b).constant->data<float>(),
                                value(b).constant->data<float>() + value(b).constant->numel());
      for (float& e : scaled) e *= pr.alpha;
      pr.b = upload(scaled);
      pr.alpha = 1.0f;
    }

    // Epilogue fusion: Gemm's C, then leading Adds (one [N] bias, one full-size residual as C
    // with beta 1), then a Relu; the rest in one element-wise pass.
    std::vector<int> extra_adds;  // values added after the product
    if (gemm_c >= 0) {
      if (auto bias = row_vector(gemm_c, pr.n, gemm_beta)) {
        pr.bias = upload(*bias);
      } else if (dims(gemm_c) == Dims{pr.m, pr.n}) {
        pr.c = fptr(gemm_c);
        pr.beta = gemm_beta;
      } else if (gemm_beta == 1.0f) {
        extra_adds.push_back(gemm_c);
      } else {
        throw Unmapped{"Gemm's C broadcasts and beta != 1"};
      }
    }
    std::size_t consumed = 0;
    const Dims& y_dims = dims(y);
    for (; consumed < node.epilogue.size(); ++consumed) {
      const graph::EpilogueOp& e = node.epilogue[consumed];
      if (e.kind != graph::EpilogueOp::Kind::kAdd) break;
      const int v = node.inputs.at(static_cast<std::size_t>(e.input));
      if (pr.bias == nullptr && row_vector(v, pr.n, 1.0f)) {
        pr.bias = static_cast<const float*>(device_constant(v));
      } else if (pr.c == nullptr && dims(v) == y_dims) {
        pr.c = fptr(v);
        pr.beta = 1.0f;
      } else {
        break;
      }
    }
    if (extra_adds.empty() && consumed < node.epilogue.size() &&
        node.epilogue[consumed].kind == graph::EpilogueOp::Kind::kRelu) {
      pr.relu = true;
      ++consumed;
    }
    Step step;
    step.launch = lt_matmul(pr, &step.implementation);
    if (is_constant(b)) {
      step.weight_format = "dense";
      step.packed_bytes = value(b).constant->nbytes();
    }
    cuda::ElementwiseParams post = elementwise_over(y_dims);
    post.a = operand(y, y_dims);
    for (int v : extra_adds) {
      cuda::PostOp& add = post.post[post.post_count++];
      add.op = cuda::ElementOp::kAdd;
      add.operand = operand(v, y_dims);
    }
    add_post_ops(node, consumed, post);
    step.launch = chain(std::move(step.launch), elementwise_launch(post, pr.d));
    return step;
  }

  // Y[M,N] = X[M,K] W[K,N] with W in CSR, as cuSPARSE sees it: W^T (CSR, N x K) times X^T
  // (X read column-major, K x M, ld K) into Y^T (column-major N x M, ld N): no transposes of
  // activations. Bias, Gemm's C and the epilogue follow in one element-wise pass.
  Step map_sparse_gemm(const graph::Node& node, const Product& pr, int gemm_c, float gemm_beta) {
    const int b = node.input(1), y = node.outputs[0];
    const Tensor& weight = *value(b).constant;
    // W^T row n, column k: B[k][n] (ld N), or with trans_b B is stored [N,K]: B[n][k].
    const HostCsr csr = pr.trans_b ? make_csr(weight.data<float>(), pr.n, pr.k, pr.k, 1, pr.alpha)
                                   : make_csr(weight.data<float>(), pr.n, pr.k, 1, pr.n, pr.alpha);
    Step step;
    step.launch =
        spmm(csr, dense_matrix(pr.k, pr.m, pr.k, const_cast<float*>(pr.a), CUSPARSE_ORDER_COL),
             dense_matrix(pr.n, pr.m, pr.n, pr.d, CUSPARSE_ORDER_COL), pr.d, pr.m * pr.n);
    const Dims& y_dims = dims(y);
    cuda::ElementwiseParams post = elementwise_over(y_dims);
    post.a = operand(y, y_dims);
    if (gemm_c >= 0) {
      cuda::PostOp& add = post.post[post.post_count++];
      add.op = cuda::ElementOp::kAdd;
      if (is_constant(gemm_c)) {
        // beta folds into a copy of the constant C.
        const Tensor& c = *value(gemm_c).constant;
        std::vector<float> scaled(c.data<float>(), c.data<float>() + c.numel());
        for (float& e : scaled) e *= gemm_beta;
        add.operand = operand(gemm_c, y_dims);
        add.operand.data = upload(scaled);
      } else if (gemm_beta == 1.0f) {
        add.operand = operand(gemm_c, y_dims);
      } else {
        throw Unmapped{"Gemm's C not constant and beta != 1"};
      }
    }
    add_post_ops(node, 0, post);
    step.launch = chain(std::move(step.launch), elementwise_launch(post, pr.d));
    step.implementation =
        fmt::format("cusparse spmm gemm [fp32, {:.0f}% zeros]", 100.0 * zero_fraction(weight));
    step.weight_format = "sparse-csr";
    step.packed_bytes = csr.bytes();
    return step;
  }

  // ---- pooling, softmax, layer norm ----

  Step map_pool(const graph::Node& node) {
    const int x = node.input(0), y = node.outputs[0];
    if (node.outputs.size() > 1 && node.outputs[1] >= 0) throw Unmapped{"MaxPool Indices"};
    const bool global = node.op_type.starts_with("Global");
    const bool max = node.op_type.find("Max") != std::string::npos;
    const Dims x4 = as_nchw(dims(x)), y4 = as_nchw(dims(y));
    Dims window{x4[2], x4[3]}, pad{0, 0}, stride{1, 1};
    cudnnPoolingMode_t mode = max ? CUDNN_POOLING_MAX : CUDNN_POOLING_AVERAGE_COUNT_EXCLUDE_PADDING;
    if (!global) {
      const graph::PoolParams p = graph::parse_pool(graph_, node, dims(x));
      const graph::WindowParams& win = p.window;
      if (win.pads_begin != win.pads_end) throw Unmapped{"asymmetric padding"};
      for (int64_t d : win.dilations) {
        if (d != 1) throw Unmapped{"dilated pooling"};
      }
      const bool one_d = win.rank() == 1;
      window = one_d ? Dims{1, win.kernel[0]} : Dims{win.kernel[0], win.kernel[1]};
      pad = one_d ? Dims{0, win.pads_begin[0]} : Dims{win.pads_begin[0], win.pads_begin[1]};
      stride = one_d ? Dims{1, win.strides[0]} : Dims{win.strides[0], win.strides[1]};
      if (!max && p.count_include_pad) mode = CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING;
      // cuDNN sizes the output with floor division; ceil_mode outputs that differ are not its.
      for (int d = 0; d < 2; ++d) {
        const int64_t floor_size = (x4[2 + d] + 2 * pad[d] - window[d]) / stride[d] + 1;
        if (floor_size != y4[2 + d]) throw Unmapped{"ceil_mode output size"};
      }
    }
    auto state = std::make_shared<std::tuple<PoolDesc, TensorDesc, TensorDesc>>(
        create<cudnnPoolingDescriptor_t, cudnnCreatePoolingDescriptor,
               cudnnDestroyPoolingDescriptor>("cudnnCreatePoolingDescriptor"),
        tensor_desc(x4), tensor_desc(y4));
    SPARSECOL_CUDA_CHECK(cudnnSetPooling2dDescriptor(
        std::get<0>(*state).get(), mode, CUDNN_NOT_PROPAGATE_NAN, to_int(window[0], "window"),
        to_int(window[1], "window"), to_int(pad[0], "pad"), to_int(pad[1], "pad"),
        to_int(stride[0], "stride"), to_int(stride[1], "stride")));
    const float* xp = fptr(x);
    float* yp = fptr(y);
    cudnnHandle_t handle = cudnn_.get();
    Step step;
    step.launch = [state, handle, xp, yp] {
      const float one = 1.0f, zero = 0.0f;
      SPARSECOL_CUDA_CHECK(cudnnPoolingForward(handle, std::get<0>(*state).get(), &one,
                                               std::get<1>(*state).get(), xp, &zero,
                                               std::get<2>(*state).get(), yp));
    };
    step.launch = chain(std::move(step.launch), epilogue_launch(node, 0));
    step.implementation = fmt::format("cudnn pooling ({})", max ? "max" : "average");
    return step;
  }

  Step map_softmax(const graph::Node& node) {
    const int x = node.input(0), y = node.outputs[0];
    const graph::SoftmaxParams p = graph::parse_softmax(graph_, node, dims(x));
    // [outer, axis, inner, 1] with CUDNN_SOFTMAX_MODE_CHANNEL normalizes along the axis for
    // every (outer, inner): any ONNX Softmax axis, no transpose.
    auto desc = std::make_shared<TensorDesc>(tensor_desc({p.outer, p.axis_size, p.inner, 1}));
    const cudnnSoftmaxAlgorithm_t algo =
        node.op_type == "Softmax" ? CUDNN_SOFTMAX_ACCURATE : CUDNN_SOFTMAX_LOG;
    const float* xp = fptr(x);
    float* yp = fptr(y);
    cudnnHandle_t handle = cudnn_.get();
    Step step;
    step.launch = [desc, handle, algo, xp, yp] {
      const float one = 1.0f, zero = 0.0f;
      SPARSECOL_CUDA_CHECK(cudnnSoftmaxForward(handle, algo, CUDNN_SOFTMAX_MODE_CHANNEL, &one,
                                               desc->get(), xp, &zero, desc->get(), yp));
    };
    step.launch = chain(std::move(step.launch), epilogue_launch(node, 0));
    step.implementation = "cudnn softmax";
    return step;
  }

  Step map_layer_norm(const graph::Node& node) {
    const int x = node.input(0), scale = node.input(1), bias = node.input(2), y = node.outputs[0];
    for (std::size_t i = 1; i < node.outputs.size(); ++i) {
      if (node.outputs[i] >= 0 && is_read(node.outputs[i])) throw Unmapped{"Mean/InvStdDev read"};
    }
    std::optional<Dims> bias_shape;
    if (bias >= 0) bias_shape = dims(bias);
    const graph::LayerNormParams p =
        graph::parse_layer_norm(graph_, node, dims(x), dims(scale), bias_shape);
    for (int v : {scale, bias}) {
      if (v >= 0 && product(dims(v)) != p.inner) throw Unmapped{"scale or bias broadcasts"};
    }
    const float* xp = fptr(x);
    const float* sp = fptr(scale);
    const float* bp = bias >= 0 ? fptr(bias) : nullptr;
    float* yp = fptr(y);
    cudaStream_t stream = stream_.get();
    Step step;
    step.launch = [=] {
      SPARSECOL_CUDA_CHECK(
          cuda::launch_layer_norm(xp, sp, bp, yp, p.outer, p.inner, p.epsilon, stream));
    };
    step.launch = chain(std::move(step.launch), epilogue_launch(node, 0));
    step.implementation = "cuda layer_norm";
    return step;
  }

  bool is_read(int v) const {
    if (std::count(graph_.outputs.begin(), graph_.outputs.end(), v) > 0) return true;
    for (const graph::Node& n : graph_.nodes) {
      if (std::count(n.inputs.begin(), n.inputs.end(), v) > 0) return true;
    }
    return false;
  }

  // ---- data movement and element-wise ops ----

  Step map_transpose(const graph::Node& node) {
    const int x = node.input(0), y = node.outputs[0];
    const Dims& x_dims = dims(x);
    std::vector<int64_t> perm = node.attr_ints("perm");
    if (perm.empty()) {
      for (std::size_t i = x_dims.size(); i-- > 0;) perm.push_back(static_cast<int64_t>(i));
    }
    cuda::ElementwiseParams p = elementwise_over(dims(y));
    const Dims in_strides = row_major_strides(x_dims);
    p.a.data = fptr(x);
    for (std::size_t d = 0; d < perm.size(); ++d) {
      p.a.strides[d] = in_strides.at(static_cast<std::size_t>(perm[d]));
    }
    add_post_ops(node, 0, p);
    Step step;
    step.launch = elementwise_launch(p, fptr(y));
    step.implementation = "cuda transpose";
    return step;
  }

  Step map_concat(const graph::Node& node) {
    if (!node.epilogue.empty()) throw Unmapped{"epilogue on Concat"};
    const int y = node.outputs[0];
    const Dims& y_dims = dims(y);
    int64_t axis = node.attr_int("axis", 0);
    if (axis < 0) axis += static_cast<int64_t>(y_dims.size());
    const auto ax = static_cast<std::size_t>(axis);
    const int64_t outer = product_before(y_dims, ax);
    const std::size_t out_row = static_cast<std::size_t>(product(y_dims, ax)) * 4;
    std::vector<std::function<void()>> copies;
    std::size_t offset = 0;
    cudaStream_t stream = stream_.get();
    auto* base = static_cast<std::byte*>(device_ptr(y));
    for (int v : node.inputs) {
      if (v < 0) continue;
      const std::size_t row = static_cast<std::size_t>(product(dims(v), ax)) * 4;
      const void* src = device_ptr(v);
      std::byte* dst = base + offset;
      // One strided 2-D copy per input: `outer` rows of `row` bytes into rows of `out_row`.
      copies.push_back([=] {
        SPARSECOL_CUDA_CHECK(cudaMemcpy2DAsync(dst, out_row, src, row, row,
                                               static_cast<std::size_t>(outer),
                                               cudaMemcpyDeviceToDevice, stream));
      });
      offset += row;
    }
    Step step;
    step.launch = [copies] {
      for (const auto& copy : copies) copy();
    };
    step.implementation = "cuda memcpy2d";
    return step;
  }

  Step map_elementwise(const graph::Node& node) {
    using E = cuda::ElementOp;
    static const std::map<std::string, E> kBinary = {
        {"Add", E::kAdd}, {"Sub", E::kSub}, {"Mul", E::kMul}, {"Div", E::kDiv},
        {"Pow", E::kPow}, {"Max", E::kMax}, {"Min", E::kMin}};
    static const std::map<std::string, E> kUnary = {{"Relu", E::kRelu},
                                                    {"LeakyRelu", E::kLeakyRelu},
                                                    {"Sigmoid", E::kSigmoid},
                                                    {"Tanh", E::kTanh},
                                                    {"Exp", E::kExp},
                                                    {"Log", E::kLog},
                                                    {"Sqrt", E::kSqrt},
                                                    {"Neg", E::kNeg},
                                                    {"Abs", E::kAbs},
                                                    {"Erf", E::kErf},
                                                    {"Reciprocal", E::kReciprocal},
                                                    {"Clip", E::kClip},
                                                    {"Identity", E::kCopy},
                                                    {"Dropout", E::kCopy},
                                                    {"Gelu", E::kGelu}};
    const int y = node.outputs.at(0);
    const Dims& y_dims = dims(y);
    cuda::ElementwiseParams p = elementwise_over(y_dims);
    if (auto it = kBinary.find(node.op_type); it != kBinary.end()) {
      if (node.own_input_count() != 2) throw Unmapped{"not two inputs"};
      p.op = it->second;
      p.b = operand(node.input(1), y_dims);
    } else if (auto u = kUnary.find(node.op_type); u != kUnary.end()) {
      p.op = u->second;
      if (node.op_type == "Dropout" && node.outputs.size() > 1 && node.outputs[1] >= 0) {
        throw Unmapped{"Dropout mask"};
      }
      if (p.op == E::kLeakyRelu) p.alpha = node.attr_float("alpha", 0.01f);
      if (p.op == E::kClip) {
        p.alpha = -std::numeric_limits<float>::infinity();
        p.beta = std::numeric_limits<float>::infinity();
        if (graph_.opset < 11) {
          p.alpha = node.attr_float("min", p.alpha);
          p.beta = node.attr_float("max", p.beta);
        }
        for (std::size_t i : {std::size_t{1}, std::size_t{2}}) {
          const int v = node.input(i);
          if (v < 0) continue;
          if (!is_constant(v) || value(v).constant->numel() != 1) throw Unmapped{"Clip bounds"};
          (i == 1 ? p.alpha : p.beta) = value(v).constant->data<float>()[0];
        }
      }
    } else {
      throw Unmapped{"no device implementation"};
    }
    p.a = operand(node.input(0), y_dims);
    add_post_ops(node, 0, p);
    Step step;
    step.launch = elementwise_launch(p, fptr(y));
    step.implementation = "cuda elementwise";
    return step;
  }

  // ---- host fallback ----

  Step host_fallback(const graph::Node& node, const std::string& reason) {
    const RefOp* op = find_reference_op(node.op_type);
    if (op == nullptr || !node.domain.empty()) {
      graph::fail(graph_, node, ErrorCode::kUnsupported,
                  fmt::format("no CUDA implementation ({}) and no reference op", reason));
    }
    auto host = std::make_shared<HostFallback>();
    host->graph = &graph_;
    host->node = &node;
    host->op = op;
    host->error = &host_error_;
    cudaStream_t stream = stream_.get();
    std::vector<std::function<void()>> before, after;
    auto pinned = [&](int v) {
      const std::size_t bytes =
          static_cast<std::size_t>(checked_numel(dims(v))) * dtype_size(value(v).dtype);
      void* p = nullptr;
      SPARSECOL_CUDA_CHECK(cudaMallocHost(&p, std::max<std::size_t>(bytes, 1)));
      host->staging.emplace_back(p);
      return std::make_pair(p, bytes);
    };
    for (int v : node.inputs) {
      if (v < 0) {
        host->inputs.emplace_back();
      } else if (is_constant(v)) {
        host->inputs.push_back(*value(v).constant);
      } else {
        auto [p, bytes] = pinned(v);
        const void* src = device_ptr(v);
        host->inputs.push_back(Tensor::view(p, value(v).dtype, dims(v)));
        if (bytes > 0) {
          before.push_back([=] {
            SPARSECOL_CUDA_CHECK(cudaMemcpyAsync(p, src, bytes, cudaMemcpyDeviceToHost, stream));
          });
        }
      }
    }
    for (int v : node.outputs) {
      if (v < 0) {
        host->outputs.emplace_back();
        continue;
      }
      auto [p, bytes] = pinned(v);
      void* dst = device_ptr(v);
      host->outputs.push_back(Tensor::view(p, value(v).dtype, dims(v)));
      if (bytes > 0) {
        after.push_back([=] {
          SPARSECOL_CUDA_CHECK(cudaMemcpyAsync(dst, p, bytes, cudaMemcpyHostToDevice, stream));
        });
      }
    }
    Step step;
    step.launch = [host, before, after, stream] {
      for (const auto& copy : before) copy();
      SPARSECOL_CUDA_CHECK(cudaLaunchHostFunc(stream, &HostFallback::run, host.get()));
      for (const auto& copy : after) copy();
    };
    step.implementation = fmt::format("host reference (fallback: {})", reason);
    return step;
  }

  graph::Graph graph_;
  Options options_;
  bool sparse_ = false;
  bool verbose_ = false;
  Stream stream_;
  Owned<cudnnHandle_t, cudnnDestroy> cudnn_;
  LtHandle lt_;
  SparseHandle cusparse_;
  std::vector<Dims> dims_;        // by value id
  std::vector<int> root_;         // value id whose buffer a value lives in, -1 for none
  std::vector<int64_t> offsets_;  // arena offset of each root
  std::vector<std::vector<int64_t>> scratch_offsets_;  // by node: its scratch buffers
  DeviceMemory arena_;
  std::vector<DeviceMemory> weights_;  // uploaded constants, CSR arrays, folded biases
  std::map<int, const void*> constants_;
  std::size_t workspace_bytes_ = kLtWorkspaceBytes;
  DeviceMemory workspace_;
  std::vector<Step> steps_;  // one per node
  std::string host_error_;   // set by a failing host fallback during a run
  GraphExec graph_exec_;
};

}  // namespace

std::string cuda_unavailable_reason() {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();  // not sticky: leave no error behind for later calls
    return fmt::format("no CUDA device: {}", cudaGetErrorString(e));
  }
  if (count == 0) return "no CUDA device: cudaGetDeviceCount found none";
  return cuda::libraries_problem();
}

std::unique_ptr<Executor> make_cuda_executor(graph::Graph graph, const Options& options) {
  if (options.schedule != Schedule::kCuda && options.schedule != Schedule::kCudaSparse) {
    throw Error(ErrorCode::kInvalidArgument, "make_cuda_executor: not a cuda schedule");
  }
  const std::string problem = cuda_unavailable_reason();
  if (!problem.empty()) throw Error(ErrorCode::kUnsupported, problem);
  return std::make_unique<CudaExecutor>(std::move(graph), options);
}

}  // namespace sparsecol::runtime
