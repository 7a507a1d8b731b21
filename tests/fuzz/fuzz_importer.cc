// libFuzzer target: arbitrary bytes as an ONNX model, through what Engine::load and
// Session::run do: import (protobuf parse, checker, shape inference), the load-time passes, and,
// when the model imports, specialization to small input shapes and a run with the layer-wise,
// depth-wise, reference and oneDNN executors on deterministic inputs. The only exception allowed
// out of any step is sparsecol::Error; anything else (another exception, a sanitizer report, a
// signal) is a bug.
//
// Built only with -DSPARSECOL_FUZZ=ON (clang, see tests/CMakeLists.txt); .ci/run fuzzes it for
// a bounded time from a corpus written by sparsecol_fuzz_corpus.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "graph/graph.h"
#include "graph/passes.h"
#include "onnx/onnx_importer.h"
#include "runtime/executor.h"
#include "runtime/reference/reference_ops.h"
#include "sparsecol/sparsecol.h"

namespace {

using sparsecol::DType;
using sparsecol::Tensor;
namespace graph = sparsecol::graph;

// A fuzzed model may legitimately ask for gigabytes (a [65536, 65536] MatMul); running such a
// model proves nothing about robustness and only exhausts the fuzzer's memory limit, so inputs
// and the activations of the specialized graph are capped.
constexpr int64_t kMaxInputElements = int64_t{1} << 14;
constexpr int64_t kMaxGraphBytes = int64_t{64} << 20;
// Small tensors can still ask for hours of work: a ConvTranspose of a [123, 1, 3, 3] input by a
// [1, 65, 59, 2] kernel took 20-80 s per execution through the coverage-instrumented reference
// kernel (found by a 20-minute local run; libFuzzer's 25 s timeout would call that a failure).
// Graphs whose products exceed this many multiply-adds (an upper bound, product_work) are not run.
constexpr double kMaxMultiplyAdds = double(int64_t{1} << 27);
// Unknown dimensions of inputs are set to this.
constexpr int64_t kFreeDim = 2;

// Small values (0 or 1 for integers, so that index inputs stay mostly in range; the engine must
// refuse the others anyway) that depend on the model bytes.
void fill(Tensor& tensor, uint32_t seed) {
  auto* bytes = static_cast<unsigned char*>(tensor.raw_data());
  const std::size_t element = sparsecol::dtype_size(tensor.dtype());
  for (int64_t i = 0; i < tensor.numel(); ++i) {
    seed = seed * 1664525u + 1013904223u;
    unsigned char* at = bytes + static_cast<std::size_t>(i) * element;
    switch (tensor.dtype()) {
      case DType::kFloat32: {
        const float v = static_cast<float>(seed >> 8) / 16777216.0f * 4.0f - 2.0f;
        std::memcpy(at, &v, sizeof(v));
        break;
      }
      case DType::kFloat64: {
        const double v = static_cast<double>(seed >> 8) / 16777216.0 * 4.0 - 2.0;
        std::memcpy(at, &v, sizeof(v));
        break;
      }
      default:  // integers and bool: 0 or 1 in the lowest byte (little-endian)
        at[0] = static_cast<unsigned char>((seed >> 16) & 1);
        break;
    }
  }
}

// Sum of the bytes of every value whose shape is known; -1 if it overflows the cap.
int64_t graph_bytes(const graph::Graph& g) {
  int64_t total = 0;
  for (const graph::Value& value : g.values) {
    if (!value.shape) continue;
    int64_t count = 1;
    for (const graph::Dim& dim : *value.shape) {
      if (!dim.known()) continue;
      if (dim.value != 0 && count > kMaxGraphBytes / dim.value) return -1;
      count *= dim.value;
    }
    const int64_t bytes = count * static_cast<int64_t>(sparsecol::dtype_size(value.dtype));
    if (bytes > kMaxGraphBytes - total) return -1;
    total += bytes;
  }
  return total;
}

int64_t elements(const graph::Graph& g, int id) {
  if (id < 0) return 0;
  const graph::Value& value = g.values[static_cast<std::size_t>(id)];
  if (!value.shape) return 0;
  int64_t count = 1;
  for (const graph::Dim& dim : *value.shape) count *= dim.known() ? dim.value : 1;
  return count;
}

// An upper bound on the multiply-adds of the ops whose work grows with the product of two sizes
// (every other op's grows with the bytes graph_bytes caps): for the products, each output
// element times the largest operand after the first (a convolution's whole weight, not one
// output channel's; a MatMul's whole B, not one column); for Einsum, whose labels each size
// some operand, the product of its operands' sizes; for pooling, each output element times the
// window.
double product_work(const graph::Graph& g) {
  static const char* const kProducts[] = {"Conv",   "ConvTranspose", "ConvInteger",   "QLinearConv",
                                          "MatMul", "MatMulInteger", "QLinearMatMul", "Gemm",
                                          "RNN",    "GRU",           "LSTM"};
  double work = 0.0;
  for (const graph::Node& node : g.nodes) {
    if (node.outputs.empty()) continue;
    const auto out = static_cast<double>(elements(g, node.outputs[0]));
    if (node.op_type == "Einsum") {
      double combinations = 1.0;
      for (int v : node.inputs)
        combinations *= static_cast<double>(std::max<int64_t>(1, elements(g, v)));
      work += combinations;
    } else if (std::any_of(std::begin(kProducts), std::end(kProducts),
                           [&](const char* op) { return node.op_type == op; })) {
      int64_t operand = 1;
      for (std::size_t i = 1; i < node.inputs.size(); ++i) {
        operand = std::max(operand, elements(g, node.inputs[i]));
      }
      work += out * static_cast<double>(operand);
    } else if (node.op_type.find("Pool") != std::string::npos) {
      double window = 1.0;
      for (int64_t k : node.attr_ints("kernel_shape")) window *= static_cast<double>(k);
      work += out * window;
    }
  }
  return work;
}

void import_optimize_run(const uint8_t* data, std::size_t size) {
  graph::Graph g = sparsecol::onnx_import::import_model_bytes(data, size, "fuzz.onnx", "");
  graph::optimize(g, sparsecol::runtime::evaluate_node);

  std::map<std::string, std::vector<int64_t>> shapes;
  sparsecol::NamedTensors inputs;
  uint32_t seed = static_cast<uint32_t>(size);
  for (int id : g.inputs) {
    const graph::Value& value = g.values[static_cast<std::size_t>(id)];
    if (!value.shape || !value.dtype_known) return;  // nothing to choose a shape from
    std::vector<int64_t> shape;
    int64_t count = 1;
    for (const graph::Dim& dim : *value.shape) {
      shape.push_back(dim.known() ? dim.value : kFreeDim);
      if (shape.back() > kMaxInputElements) return;
      count *= shape.back();
      if (count > kMaxInputElements) return;
    }
    Tensor tensor = Tensor::zeros(value.dtype, shape);
    fill(tensor, seed++);
    shapes[value.name] = shape;
    inputs.emplace(value.name, std::move(tensor));
  }
  graph::Graph specialized = graph::specialize(g, shapes, sparsecol::runtime::evaluate_node);
  if (graph_bytes(specialized) < 0 || product_work(specialized) > kMaxMultiplyAdds) return;
  // The fast executors bind kernels to the graph (geometry, packing, memory and tile plans) and
  // must refuse what they cannot run with an Error as well. One thread each: the fuzzer wants
  // executions per second, and their threading is the concurrency test's job. Their outputs are
  // not compared with the reference's: arbitrary weights and inputs overflow and produce NaNs
  // that kernels may legitimately order differently.
  // Each executor gets its try: one refusing the model must not hide the others.
  const sparsecol::Options options;
  auto attempt = [&](auto make_executor) {
    try {
      make_executor()->run(inputs);
    } catch (const sparsecol::Error&) {
    }
  };
  attempt([&] { return sparsecol::runtime::make_layerwise_executor(specialized, 1, options); });
  attempt([&] { return sparsecol::runtime::make_depthwise_executor(specialized, 1, options); });
  attempt([&] { return sparsecol::runtime::make_reference_executor(specialized); });
  attempt([&] { return sparsecol::runtime::make_onednn_executor(specialized, 1); });
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  try {
    import_optimize_run(data, size);
  } catch (const sparsecol::Error&) {
    // A refusal is the expected outcome for almost every input.
  }
  return 0;
}
