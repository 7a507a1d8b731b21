// sparsecol: a sparse-aware CPU inference engine for ONNX models.
//
// The whole public API. It depends on the C++ standard library only: no protobuf, oneDNN,
// hwloc or OpenMP type leaks out of this header.
//
//   sparsecol::Engine engine = sparsecol::Engine::load("model.onnx");   // throws sparsecol::Error
//   sparsecol::Session session = engine.session();                       // one per calling thread
//   auto outputs = session.run({{"input", sparsecol::Tensor::view(ptr, {1, 3, 224, 224})}});
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace sparsecol {

// What kind of failure an Error reports; lets callers react without parsing messages.
enum class ErrorCode {
  kInvalidArgument,  // a caller's argument is wrong (bad option, unknown input name)
  kNotFound,         // a file does not exist
  kIoError,          // a file exists but cannot be read or written
  kInvalidModel,     // the model is malformed (bad protobuf, broken graph, bad attribute)
  kUnsupported,      // valid ONNX that this engine does not implement (op, dtype, opset)
  kShapeMismatch,    // a tensor's shape differs from what the model or op expects
  kDtypeMismatch,    // a tensor's element type differs from what the model or op expects
  kOutOfMemory,      // an allocation failed
  kInternal,         // a bug in sparsecol
};

const char* to_string(ErrorCode code);

// The one exception type of the API. The message names what and where: file, node, op,
// expected vs actual.
class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& message);
  ErrorCode code() const { return code_; }

 private:
  ErrorCode code_;
};

enum class DType : int { kFloat32, kFloat64, kInt64, kInt32, kInt8, kUInt8, kBool };

const char* to_string(DType dtype);
std::size_t dtype_size(DType dtype);

// A dense, C-ordered tensor. Either owns its storage (shared between copies of the Tensor,
// like a shared_ptr) or views memory that the caller keeps alive.
class Tensor {
 public:
  Tensor() = default;

  // Owning, zero-filled. Throws Error(kOutOfMemory) if the allocation fails.
  static Tensor zeros(DType dtype, std::vector<int64_t> shape);
  // Non-owning view of caller memory; the caller keeps it alive while the Tensor is used.
  static Tensor view(void* data, DType dtype, std::vector<int64_t> shape);
  static Tensor view(float* data, std::vector<int64_t> shape) {
    return view(data, DType::kFloat32, std::move(shape));
  }
  static Tensor view(const float* data, std::vector<int64_t> shape) {
    return view(const_cast<float*>(data), DType::kFloat32, std::move(shape));
  }

  // True for a default-constructed Tensor (no data, no shape).
  bool empty() const { return data_ == nullptr && storage_ == nullptr && shape_.empty(); }
  DType dtype() const { return dtype_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  int64_t dim(int axis) const { return shape_.at(static_cast<std::size_t>(axis)); }
  int rank() const { return static_cast<int>(shape_.size()); }
  int64_t numel() const;
  std::size_t nbytes() const { return static_cast<std::size_t>(numel()) * dtype_size(dtype_); }
  bool owns_data() const { return storage_ != nullptr; }

  void* raw_data() { return data_; }
  const void* raw_data() const { return data_; }
  // Typed access; throws Error(kDtypeMismatch) if T is not the tensor's element type.
  template <typename T>
  T* data();
  template <typename T>
  const T* data() const;

  // A deep, owning copy.
  Tensor clone() const;
  // Same storage, another shape with the same element count.
  Tensor reshaped(std::vector<int64_t> shape) const;

 private:
  std::shared_ptr<void> storage_;
  void* data_ = nullptr;
  DType dtype_ = DType::kFloat32;
  std::vector<int64_t> shape_;
};

// Element count of a shape, with overflow and negative-dimension checks (throws Error).
int64_t checked_numel(const std::vector<int64_t>& shape);

using NamedTensors = std::map<std::string, Tensor>;

// How a Session executes the model.
enum class Schedule {
  kReference,   // naive reference kernels, op by op: the oracle every other path is tested against
  kLayerWise,   // the fast kernels, op by op over whole tensors, multi-threaded (the baseline)
  kOneDnn,      // oneDNN primitives op by op: the dense library a user would otherwise pick
  kDepthWise,   // the fast kernels, tile by tile through columns of layers (cache-resident)
  kCuda,        // cuDNN / cuBLAS on an NVIDIA GPU (needs a CUDA build and a device)
  kCudaSparse,  // as kCuda, pruned layers through cuSPARSE SpMM
};

const char* to_string(Schedule schedule);
// Parses "reference", "layerwise", "onednn", "depthwise", "cuda", "cuda-sparse"; throws
// Error(kInvalidArgument) naming the accepted values.
Schedule parse_schedule(const std::string& name);

// How the depth-wise schedule's tiles get the rows their convolutions' windows need beyond the
// tile (the halo): each tile recomputes them, or a thread that runs the next tile of the same
// image keeps the rows the two tiles share in its tile buffers ("rolling line buffers") and
// computes only the new ones. Results are identical either way.
enum class TileReuse { kHalo, kRolling };

// Runs over which the depth-wise schedule measures its columns (Options::measure_columns): two
// untimed (first touches, cold caches), then four as tiles and four whole, alternately.
inline constexpr int kColumnMeasuringRuns = 10;

// Numeric precision of the GPU paths; anything but kFp32 changes results (reported as such).
enum class GpuPrecision { kFp32, kTf32, kFp16 };

struct Options {
  Schedule schedule = Schedule::kDepthWise;  // the fast path, as the CLI
  int threads = 0;       // 0: one per physical core (layerwise, onednn, depthwise)
  bool verbose = false;  // print load/plan decisions to stderr (also SPARSECOL_VERBOSE=1)
  // Weights whose fraction of exact zeros is at least this run through the sparse kernels;
  // negative: the default measured on this machine's class (kernels/f32-spmm).
  double sparse_threshold = -1.0;
  // Depth-wise planning: the per-core cache budget a column's working set must fit (0: three
  // quarters of the L2 size hwloc reports) and a forced tile height in output rows (0: chosen
  // by the planner).
  int64_t cache_budget_bytes = 0;
  int tile_rows = 0;
  // The shared (L3) cache the depth-wise planner assumes, in bytes (0: the size hwloc reports).
  // In a virtual machine hwloc reports the host's whole L3, which other tenants share: the
  // planner then counts on the L3 to hold activations that this process's share does not, and
  // runs ops whole that columns would serve better. No effect with a cache_budget_bytes set
  // (that budget is then the only tier).
  int64_t shared_cache_bytes = 0;
  TileReuse tile_reuse = TileReuse::kRolling;
  // On a machine with several NUMA nodes, one copy of the depth-wise columns' packed weights per
  // node that has workers, each read by that node's workers (weights x nodes of memory). No
  // effect on one node.
  bool replicate_weights = false;
  // Depth-wise schedule: the first kColumnMeasuringRuns runs of each set of input shapes run
  // the columns as tiles and with their ops whole (as layer by layer) on alternate runs, timed,
  // and then keep the faster way: the planner's cache model cannot see all a machine does. Both
  // ways give the same results. While measuring, the columns' ops are packed twice (tile kernels
  // and whole steps) and their intermediates take a second arena; then the way not taken is
  // freed. false: the columns run as tiles, as planned.
  bool measure_columns = true;
  // GPU paths only.
  GpuPrecision gpu_precision = GpuPrecision::kFp32;
  bool cuda_graphs = false;  // capture each run as a CUDA Graph and replay it
};

// One node as a schedule runs it: what `sparsecol inspect` and `bench --per-layer` show.
struct LayerInfo {
  std::string node;            // the node's name
  std::string op;              // its op type, with fused epilogues, e.g. "Conv+Add+Relu"
  std::string implementation;  // the kernel that runs it, e.g. "conv spmm-1x1/avx2"
  std::vector<int64_t> output_shape;
  std::vector<int64_t> weight_shape;  // empty for ops without a weight
  double weight_sparsity = 0.0;       // fraction of exact zeros in the weight
  std::string weight_format;          // "dense", "sparse-csr", ... ("" without a weight)
  int64_t packed_bytes = 0;           // bytes of the packed weight (and bias, and its code)
};

// One timed piece of work of a profiled run: a node (layer by layer) or a node on one tile
// (depth-wise). Times are nanoseconds from the start of the run.
struct ProfileEvent {
  std::string name;  // the node's name
  std::string op;    // its op type
  int thread = 0;    // the worker that ran it (0 ... threads-1)
  int tile = -1;     // the tile index in the depth-wise schedule, -1 for a whole layer
  int64_t start_ns = 0;
  int64_t duration_ns = 0;
};

// Name, element type and shape of a model input or output. A dimension that is not fixed by
// the model (a symbolic batch, say) is -1, with its symbol in dim_names where it has one.
struct TensorInfo {
  std::string name;
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;
  std::vector<std::string> dim_names;
  bool shape_known = true;  // false when the model states no shape at all
};

// "[batch, 3, 224, 224]": a shape as the messages and tools print it, symbolic dimensions by
// name ("?" when unnamed), "[unknown shape]" when the model states none.
std::string shape_string(const TensorInfo& info);
std::string shape_string(const std::vector<int64_t>& shape);

class Session;

// A loaded model. Immutable after load and safe to share across threads.
class Engine {
 public:
  // Loads an ONNX model; throws Error naming the file (and node, op) on any problem.
  static Engine load(const std::string& path, const Options& options = {});

  const std::vector<TensorInfo>& inputs() const;
  const std::vector<TensorInfo>& outputs() const;
  const Options& options() const;
  // A human-readable summary: ops, shapes, initializer sparsity (what `sparsecol inspect` shows).
  std::string describe() const;

  // Cheap to create, but a Session's first run of each set of input shapes builds that shape's
  // executor (graph specialized and planned, weights packed: 0.1-0.6 s on ResNet-50 and BERT on
  // a 2-core machine): keep one Session per calling thread and reuse it.
  Session session() const;

  // Every node as this engine's schedule would run it on the given input shapes (inputs not
  // named: their symbolic dimensions set to 1).
  std::vector<LayerInfo> layers(
      const std::map<std::string, std::vector<int64_t>>& shapes = {}) const;
  // The depth-wise plan for those shapes as text: each column's ops, tile size, tiles per image,
  // working set, halo overhead, and bytes of intermediates kept in cache vs sent to memory
  // against the layer-by-layer plan (what `sparsecol inspect --plan` prints).
  std::string plan_report(const std::map<std::string, std::vector<int64_t>>& shapes = {}) const;

  struct Impl;

 private:
  explicit Engine(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
};

// Runs an Engine's model. Not thread-safe: one per thread, many per Engine.
class Session {
 public:
  // Checks names, dtypes and shapes of the inputs (Error naming the input, expected vs actual),
  // then returns every model output by name.
  NamedTensors run(const NamedTensors& inputs);

  // When on, every run records a ProfileEvent per node (and per tile); profile() returns the
  // last run's. Off by default: profiling reads the clock around every step.
  void set_profiling(bool on);
  const std::vector<ProfileEvent>& profile() const;

  struct Impl;
  ~Session();
  Session(Session&&) noexcept;
  Session& operator=(Session&&) noexcept;

 private:
  friend class Engine;
  explicit Session(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

template <typename T>
struct DTypeOf;
template <>
struct DTypeOf<float> {
  static constexpr DType kValue = DType::kFloat32;
};
template <>
struct DTypeOf<double> {
  static constexpr DType kValue = DType::kFloat64;
};
template <>
struct DTypeOf<int64_t> {
  static constexpr DType kValue = DType::kInt64;
};
template <>
struct DTypeOf<int32_t> {
  static constexpr DType kValue = DType::kInt32;
};
template <>
struct DTypeOf<int8_t> {
  static constexpr DType kValue = DType::kInt8;
};
template <>
struct DTypeOf<uint8_t> {
  static constexpr DType kValue = DType::kUInt8;
};
template <>
struct DTypeOf<bool> {
  static constexpr DType kValue = DType::kBool;
};

[[noreturn]] void throw_dtype_mismatch(DType expected, DType actual);

template <typename T>
T* Tensor::data() {
  if (DTypeOf<T>::kValue != dtype_) throw_dtype_mismatch(DTypeOf<T>::kValue, dtype_);
  return static_cast<T*>(data_);
}

template <typename T>
const T* Tensor::data() const {
  if (DTypeOf<T>::kValue != dtype_) throw_dtype_mismatch(DTypeOf<T>::kValue, dtype_);
  return static_cast<const T*>(data_);
}

}  // namespace sparsecol
