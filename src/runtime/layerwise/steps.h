// The per-node implementations of the layer-by-layer schedule. At build the executor asks
// make_fast_step() for each node; a fast step binds the node to the optimized kernels
// (kernels/f32-*) and splits its output into regions run by an OpenMP team. Where none fits
// (an op, a dtype, a broadcast or an epilogue the kernels do not cover) the node falls back to
// its reference op, writing into the same preplanned buffers.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "graph/graph.h"

namespace sparsecol::kernels {
struct ConvGeometry;
}  // namespace sparsecol::kernels

namespace sparsecol::runtime::layerwise {

// What a step sees at run time. Every value's tensor is bound before the step runs: arena
// views, caller inputs, constants, owned graph outputs, aliases.
struct RunContext {
  std::vector<Tensor>& tensors;              // by value id
  int threads = 1;                           // OpenMP team size
  std::vector<std::vector<float>>& scratch;  // one growable buffer per thread
};

class Step {
 public:
  virtual ~Step() = default;
  virtual void run(RunContext& ctx) = 0;
  // What runs, e.g. "conv gemm-1x1/avx512" or "reference"; printed by SPARSECOL_VERBOSE=1.
  virtual std::string implementation() const = 0;
  // Fills in how this step runs its node: the implementation and, for steps that pack a
  // weight, its format and packed bytes (describe_node() already set shape and sparsity).
  virtual void describe(LayerInfo& info) const { info.implementation = implementation(); }
  // The input (an index into the node's inputs) whose buffer the output may be written over, or
  // -1: one the kernel has finished reading at each place before it writes the output there (a
  // residual read element by element just before the same element of the output is written,
  // kernels::PackedConv::may_overwrite_residual; a softmax's or layer norm's rows, each read
  // whole first). Whether the executor does is place_output_over_input()'s question.
  virtual int writes_over_input() const { return -1; }
};

// Places node n's output in the buffer of the input its step writes over
// (Step::writes_over_input), where the executor may: that input lives in a planned buffer
// (root[input] >= 0) of the output's bytes, which no other input of the node and no later node
// reads, and the output is an ordinary planned buffer (root[output] == output: not a graph
// output, not a view). Then root[output] becomes that buffer, the output is appended to
// `written_over` (the executor binds it to its input's bytes) and the result is true.
// `root`: the buffer each value lives in so far (the executors' root_, negative: unplanned).
bool place_output_over_input(const graph::Graph& graph, std::size_t n, const Step& step,
                             std::vector<int>& root, std::vector<int>& written_over);
// What LayerInfo::implementation adds for a node whose output the executor placed so.
inline constexpr std::string_view kWrittenOverInput = ", in place over its input";

// How the layer-by-layer step cuts a dense convolution's output into tasks for `threads` threads
// at batch `batch`: blocks of `rows` output rows (the whole height: one block per image) x
// `channels` output channels (a multiple of `granule`, kernels::PackedConv::channel_granule, or
// all of them). Every output element is computed the same way whatever the cut.
struct ConvTasks {
  int64_t rows, channels;
};
ConvTasks dense_conv_tasks(const kernels::ConvGeometry& g, int64_t granule, int64_t batch,
                           int threads);

// How the step cuts a convolution whose images it stacks (kernels::stacks_images) into tasks of
// `images` whole images x `channels` output channels (a multiple of `granule`, or all).
struct StackTasks {
  int64_t images, channels;
};
StackTasks stacked_conv_tasks(const kernels::ConvGeometry& g, int64_t granule, int64_t batch,
                              int threads, bool sparse);

// The node's fast implementation, or nullptr with `why_not` saying why none serves it. The
// graph is specialized: every shape is concrete.
// `options` carries the choices a user may override (the sparse threshold). `column_of`: under
// the depth-wise schedule, the plan's column of each node (-1: run whole, as this step); empty
// under the layer-by-layer one. A value that crosses into or out of a column is token-major.
std::unique_ptr<Step> make_fast_step(const graph::Graph& graph, const graph::Node& node,
                                     const Options& options, std::string* why_not,
                                     std::span<const int> column_of = {});

// The reference op into preallocated outputs (zero-filled first, as evaluate_node hands them),
// then the node's epilogue. Throws Error(kUnsupported) when the op has no reference either.
std::unique_ptr<Step> make_reference_step(const graph::Graph& graph, const graph::Node& node);

// Reshape, Flatten, Squeeze, Unsqueeze, Identity: the output is the input's bytes under
// another shape. True when `node` can be run that way.
bool is_view_op(const graph::Graph& graph, const graph::Node& node);
std::unique_ptr<Step> make_view_step(const graph::Graph& graph, const graph::Node& node);

// Node `node`'s step when it runs whole: a view of its input (is_view_op, unless the output is
// the graph's), else its fast step (make_fast_step, `why_not` saying why there is none), else the
// reference op.
std::unique_ptr<Step> make_whole_step(const graph::Graph& graph, const graph::Node& node,
                                      const Options& options, std::string* why_not,
                                      std::span<const int> column_of = {});
// Places node n's output as its whole step runs: a view's in its input's buffer (-1 where that
// is unplanned), else over an input where `may_write_over` and place_output_over_input allow.
void place_output(const graph::Graph& graph, std::size_t n, const Step& step,
                  std::vector<int>& root, std::vector<int>& written_over,
                  bool may_write_over = true);

}  // namespace sparsecol::runtime::layerwise
