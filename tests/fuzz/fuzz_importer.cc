// libFuzzer target: arbitrary bytes as an ONNX model, through what Engine::load and
// Session::run do: import (protobuf parse, checker, shape inference), the load-time passes, and,
// when the model imports, specialization to small input shapes and a run with the layer-wise,
// depth-wise, reference and oneDNN executors on deterministic inputs. The only exception allowed
// out of any step is sparsecol::Error; anything else (another exception, a sanitizer report, a
// signal) is a bug.
//
// Built only with -DSPARSECOL_FUZZ=ON (clang, see tests/CMakeLists.txt); .ci/run fuzzes it for
// a bounded time from a corpus written by sparsecol_fuzz_corpus.
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
  if (graph_bytes(specialized) < 0) return;
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
