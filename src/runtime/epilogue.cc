#include "runtime/epilogue.h"

#include <algorithm>
#include <cmath>

#include "runtime/reference/broadcast.h"

namespace sparsecol::runtime {

void apply_epilogue(const graph::Graph& graph, const graph::Node& node,
                    const std::vector<const Tensor*>& inputs, Tensor& output) {
  if (output.dtype() != DType::kFloat32) {
    graph::fail(graph, node, ErrorCode::kUnsupported, "fused epilogues need a float32 output");
  }
  float* dst = output.data<float>();
  const int64_t n = output.numel();
  for (const graph::EpilogueOp& op : node.epilogue) {
    switch (op.kind) {
      case graph::EpilogueOp::Kind::kRelu:
        for (int64_t i = 0; i < n; ++i) dst[i] = std::max(dst[i], 0.0f);
        break;
      case graph::EpilogueOp::Kind::kClip:
        for (int64_t i = 0; i < n; ++i) dst[i] = std::min(std::max(dst[i], op.min), op.max);
        break;
      case graph::EpilogueOp::Kind::kGelu:
        for (int64_t i = 0; i < n; ++i) dst[i] = gelu_erf(dst[i]);
        break;
      case graph::EpilogueOp::Kind::kAdd: {
        const std::size_t k = static_cast<std::size_t>(op.input);
        if (op.input < 0 || k >= inputs.size() || inputs[k] == nullptr) {
          graph::fail(graph, node, ErrorCode::kInternal, "fused Add has no operand");
        }
        // The fusion pass checked that the operand broadcasts to the output's shape.
        broadcast_binary<float>(output, *inputs[k], output, [](float x, float y) { return x + y; });
        break;
      }
    }
  }
}

}  // namespace sparsecol::runtime
