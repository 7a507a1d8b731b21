#include "runtime/layerwise/steps.h"

#include <omp.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <string_view>
#include <utility>

#include <fmt/format.h>

#include "f32-conv/conv.h"
#include "f32-conv/conv_transpose.h"
#include "f32-eltwise/eltwise.h"
#include "f32-gemm/gemm.h"
#include "f32-norm/norm.h"
#include "f32-pool/pool.h"
#include "f32-rnn/recurrent.h"
#include "f32-spmm/spmm.h"
#include "graph/op_params.h"
#include "graph/ops.h"
#include "graph/ops_tensor.h"
#include "reference/tensor.h"
#include "runtime/epilogue.h"
#include "runtime/kernel_bindings.h"
#include "runtime/reference/reference_ops.h"
#include "runtime/tile_queue.h"
#include "scratch.h"

namespace sparsecol::runtime::layerwise {

namespace {

using Dims = std::vector<int64_t>;

// Regions are sized from the problem, never from the thread count, and every output element is
// computed by exactly one region with the kernel's fixed summation order: results are the same
// for any number of threads.
constexpr int64_t kGemmRowBlock = 128;         // GEMM rows per task, at least (see GemmStep::run)
constexpr int64_t kMinTaskColumns = 64;        // GEMM columns / linear-layer features per task
constexpr int64_t kRowsPerTask = 8;            // layer norm / softmax rows (tokens)
constexpr int64_t kEltwiseTaskFloats = 16384;  // 64 KiB of output: well above OpenMP overhead

// Runs fn(task, thread) for task in [0, count) on `threads` threads. Each thread starts on its
// own contiguous range of tasks and steals from the others once it is done (TileQueue): tasks
// are regions in image order, so a thread runs the same images in consecutive layers and finds
// their activations in its own caches. Against OpenMP's dynamic schedule, MobileNetV2 at batch
// 16, 2 threads: equal when the two cores share their L3, 1.08-1.15x faster when the machine
// placed them apart (core round trip ~370 instead of ~80 ns); ResNet-50 90% at batch 1 likewise
// (1.07-1.10x apart). Plain static scheduling lost that batch-1 case to a late-starting thread;
// stealing absorbs it.
template <typename Fn>
void parallel_for(int threads, int64_t count, Fn&& fn) {
  if (threads <= 1 || count <= 1) {
    for (int64_t t = 0; t < count; ++t) fn(t, 0);
    return;
  }
  TileQueue queue(std::vector<int>(static_cast<std::size_t>(threads), 0), count, 1);
#pragma omp parallel num_threads(threads)
  {
    const int thread = omp_get_thread_num();
    for (int64_t t = 0; (t = queue.next(thread)) >= 0;) fn(t, thread);
  }
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Into how many blocks a second axis of work is cut (a product's columns or rows, a dense
// convolution's image rows) when the first already gives `row_blocks` tasks: each task packs (GEMM)
// or transposes (sparse linear) its rows of the activations once and pays its own call costs, so
// columns are cut only as far as balance needs: the fewest blocks (at most `most`) that give the
// threads equal shares of tasks, or four tasks per thread where shares cannot be equal.
int64_t balanced_blocks(int64_t row_blocks, int threads, int64_t most) {
  for (int64_t c = 1; c < most; ++c) {
    const int64_t tasks = row_blocks * c;
    if (tasks % threads == 0 || tasks >= 4 * int64_t{threads}) return c;
  }
  return std::max<int64_t>(most, 1);
}

// Output channels per block when `blocks` blocks of whole granules are wanted.
int64_t channels_per_block(int64_t out_c, int64_t granule, int64_t blocks) {
  return std::min(out_c, ceil_div(ceil_div(out_c, blocks), granule) * granule);
}

const graph::Value& value(const graph::Graph& graph, int id) {
  return graph.values[static_cast<std::size_t>(id)];
}

std::optional<Dims> dims_of(const graph::Graph& graph, int id) {
  if (id < 0) return std::nullopt;
  const graph::Value& v = value(graph, id);
  if (!v.shape) return std::nullopt;
  return graph::concrete(*v.shape);
}

bool is_f32(const graph::Graph& graph, int id) {
  return id >= 0 && value(graph, id).dtype == DType::kFloat32;
}

int64_t numel(const Dims& dims) {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  return n;
}

const Tensor* constant_of(const graph::Graph& graph, int id) {
  if (id < 0) return nullptr;
  const auto& c = value(graph, id).constant;
  return c && c->dtype() == DType::kFloat32 ? &*c : nullptr;
}

// A node's epilogue as the kernels fuse it (runtime::fuse_epilogue). When it does not fit,
// `fits` is false and the step applies it afterwards with the generic runtime::apply_epilogue.
struct EpiloguePlan {
  kernels::Epilogue kernel;  // residual pointer bound per run
  int residual = -1;         // value id of the residual operand
  int residual_input = -1;   // its index in the node's inputs
  bool fits = true;

  const float* residual_data(RunContext& ctx) const {
    return residual >= 0 ? ctx.tensors[static_cast<std::size_t>(residual)].data<float>() : nullptr;
  }
};

// A bias is a constant vector along the output's last axis (where the kernel takes one); a
// residual, a float32 tensor of the output's shape.
EpiloguePlan plan_epilogue(const graph::Graph& graph, const graph::Node& node, const Dims& out,
                           bool allow_col_bias) {
  const std::optional<FusedEpilogue> fused = fuse_epilogue(node, [&](int input) {
    const int operand = node.inputs[static_cast<std::size_t>(input)];
    AddOperandUse use;
    const Tensor* constant = constant_of(graph, operand);
    if (constant != nullptr && allow_col_bias && !out.empty() && constant->numel() == out.back() &&
        graph::broadcasts_to(constant->shape(), out)) {
      use.bias = constant->data<float>();
    }
    const std::optional<Dims> dims = dims_of(graph, operand);
    use.residual = is_f32(graph, operand) && dims && *dims == out;
    return use;
  });
  if (!fused) return EpiloguePlan{{}, -1, -1, false};
  const int residual = fused->residual_input >= 0
                           ? node.inputs[static_cast<std::size_t>(fused->residual_input)]
                           : -1;
  return EpiloguePlan{fused->kernel, residual, fused->residual_input, true};
}

// What every fast step shares: the node, its output, the epilogue fallback.
class FastStep : public Step {
 public:
  FastStep(const graph::Graph& graph, const graph::Node& node, std::string implementation)
      : graph_(graph), node_(node), implementation_(std::move(implementation)) {}
  std::string implementation() const override { return implementation_; }

 protected:
  float* output(RunContext& ctx) const {
    return ctx.tensors[static_cast<std::size_t>(node_.outputs[0])].data<float>();
  }
  const float* input(RunContext& ctx, std::size_t i) const {
    return ctx.tensors[static_cast<std::size_t>(node_.inputs[i])].data<float>();
  }
  // Applies the node's epilogue over the whole output when the kernel could not fuse it.
  void finish(RunContext& ctx, bool fused) const {
    if (fused || node_.epilogue.empty()) return;
    std::vector<const Tensor*> args;
    for (int v : node_.inputs)
      args.push_back(v >= 0 ? &ctx.tensors[static_cast<std::size_t>(v)] : nullptr);
    apply_epilogue(graph_, node_, args, ctx.tensors[static_cast<std::size_t>(node_.outputs[0])]);
  }

  const graph::Graph& graph_;
  const graph::Node& node_;
  std::string implementation_;
};

// ---- Conv: PackedConv per 2-D convolution, regions = images x row blocks ----

class ConvStep final : public FastStep {
 public:
  ConvStep(const graph::Graph& graph, const graph::Node& node, kernels::PackedConv conv,
           int64_t batch, EpiloguePlan epilogue)
      : FastStep(graph, node,
                 "conv " + conv.implementation() +
                     (conv.stacks_images() && batch > 1 ? ", images stacked" : "")),
        conv_(std::move(conv)),
        batch_(batch),
        epilogue_(epilogue) {}

  void run(RunContext& ctx) override {
    const kernels::ConvGeometry& g = conv_.geometry();
    const float* x = input(ctx, 0);
    float* y = output(ctx);
    const float* residual = epilogue_.residual_data(ctx);
    const int64_t in_image = g.in_c * g.in_h * g.in_w, out_image = g.out_c * g.out_h * g.out_w;
    const Split split = this->split(ctx.threads);
    const int64_t rows = split.rows, channels = split.channels;
    if (split.images > 1) {  // whole images stacked: tasks of `images` images x `channels`
      const int64_t groups = ceil_div(batch_, split.images);
      const int64_t blocks = ceil_div(g.out_c, channels);
      auto images_of = [&](int64_t group) {
        return std::min(split.images, batch_ - group * split.images);
      };
      // Several channel blocks of a stack share it, built once by all threads: each block
      // stacking the whole input itself made ResNet-50 90%'s 7x7 1x1 layers at batch 16 run no
      // faster on 16 threads than on one (16 copies of a 6.4 MB stack; 4.8 against 5.2 ms).
      const int64_t group_floats = g.in_c * kernels::stacked_plane_floats(g, split.images);
      float* stacks =
          blocks > 1 ? kernels::aligned_scratch(stacks_, groups * group_floats) : nullptr;
      if (blocks > 1) {
        constexpr int64_t kStackTaskChannels = 64;
        const int64_t parts = ceil_div(g.in_c, kStackTaskChannels);
        parallel_for(ctx.threads, groups * parts, [&](int64_t task, int) {
          const int64_t group = task / parts, c0 = task % parts * kStackTaskChannels;
          kernels::stack_channels(g, x + group * split.images * in_image, images_of(group), c0,
                                  std::min(g.in_c, c0 + kStackTaskChannels),
                                  stacks + group * group_floats);
        });
      }
      parallel_for(ctx.threads, groups * blocks, [&](int64_t task, int thread) {
        const int64_t group = task / blocks, c0 = task % blocks * channels;
        const int64_t n0 = group * split.images, c1 = std::min(g.out_c, c0 + channels);
        const float* res = residual != nullptr ? residual + n0 * out_image : nullptr;
        std::vector<float>& scratch = ctx.scratch[static_cast<std::size_t>(thread)];
        if (blocks > 1) {
          kernels::conv2d_stacked(conv_, stacks + group * group_floats, y + n0 * out_image,
                                  images_of(group), c0, c1, epilogue_.kernel, res, scratch);
        } else {
          kernels::conv2d_images(conv_, x + n0 * in_image, y + n0 * out_image, images_of(group), c0,
                                 c1, epilogue_.kernel, res, scratch);
        }
      });
      finish(ctx, epilogue_.fits);
      return;
    }
    if (conv_.input_split() > 0 && batch_ == 1 && ctx.threads > 1) {
      run_by_input_halves(ctx, x, y, residual);
      return;
    }
    const int64_t row_blocks = ceil_div(g.out_h, rows);
    const int64_t per_image = row_blocks * ceil_div(g.out_c, channels);
    parallel_for(ctx.threads, batch_ * per_image, [&](int64_t task, int thread) {
      const int64_t n = task / per_image, r0 = task % per_image % row_blocks * rows;
      const int64_t r1 = std::min(g.out_h, r0 + rows);
      const int64_t c0 = task % per_image / row_blocks * channels;
      const kernels::PlaneView src{const_cast<float*>(x) + n * in_image, 0, g.in_h * g.in_w};
      const kernels::PlaneView dst{y + n * out_image, 0, g.out_h * g.out_w};
      kernels::Epilogue ep = epilogue_.kernel;
      kernels::PlaneView res{};
      if (residual != nullptr) {
        res = {const_cast<float*>(residual) + n * out_image, 0, g.out_h * g.out_w};
        ep.residual = res.data;
        ep.residual_ld = g.out_w;
      }
      kernels::conv2d_region(conv_, src, dst, r0, r1, c0, std::min(g.out_c, c0 + channels), ep,
                             residual != nullptr ? &res : nullptr,
                             ctx.scratch[static_cast<std::size_t>(thread)]);
    });
    finish(ctx, epilogue_.fits);
  }

  void describe(LayerInfo& info) const override {
    info.implementation = implementation();
    info.weight_format = conv_.weight_format();
    info.packed_bytes = conv_.packed_bytes();
  }

  int writes_over_input() const override {
    return epilogue_.fits && conv_.may_overwrite_residual() ? epilogue_.residual_input : -1;
  }

 private:
  // Output rows x output channels of one task, or whole images x output channels when `images`
  // > 1 (kernels::conv2d_images stacks them).
  struct Split {
    int64_t rows, channels, images = 1;
  };
  // Dense: dense_conv_tasks. Sparse: a sparse kernel streams the whole weight once per run of
  // pixels it is handed, and a short run wastes its vector tail, so runs are kept at >=
  // kSparseTaskPixels (or the whole image) and the threads are fed by splitting output channels
  // instead where the batch has too few such runs (ResNet-50's 7x7 layers at batch 1: one run per
  // image).
  Split split(int threads) const {
    const kernels::ConvGeometry& g = conv_.geometry();
    const int64_t granule = conv_.channel_granule();
    auto channels_per = [&](int64_t blocks) {
      return channels_per_block(g.out_c, granule, blocks);
    };
    const bool dense = std::string_view(conv_.weight_format()) == "dense";
    if (conv_.stacks_images() && batch_ > 1) {
      const StackTasks tasks = stacked_conv_tasks(g, granule, batch_, threads, !dense);
      return {g.out_h, tasks.channels, tasks.images};
    }
    if (dense) {
      const ConvTasks tasks = dense_conv_tasks(g, granule, batch_, threads);
      return {tasks.rows, tasks.channels};
    }
    constexpr int64_t kSparseTaskPixels = 256, kMinTaskChannels = 16;
    int64_t rows = std::min(g.out_h, ceil_div(kSparseTaskPixels, g.out_w));
    // Up to twice the rows where that makes every run start on a cache line (56- and 28-wide
    // images: 6 and 12 rows, not 5 and 10): the 1x1 kernels read such runs in place and copy any
    // other (f32-conv/conv.cc). ResNet-50 90% and 95% at batch 1, 2 threads, old and new binary
    // alternated three times: 1.02-1.08x.
    for (int64_t r = rows; r <= std::min(g.out_h - 1, 2 * rows); ++r) {
      if (r * g.out_w % kernels::kLineFloats == 0) {
        rows = r;
        break;
      }
    }
    const int64_t row_tasks = batch_ * ceil_div(g.out_h, rows);
    // Only as many channel blocks as the threads need: each block redoes the input's
    // im2col / padded copy.
    const int64_t channel_blocks = std::clamp<int64_t>(ceil_div(std::max(threads, 1), row_tasks), 1,
                                                       ceil_div(g.out_c, kMinTaskChannels));
    return {rows, channels_per(channel_blocks)};
  }

  // A layer summed by halves of its input channels (kernels::kInputHalvesMaxPixels) at batch 1:
  // first each half's sums over blocks of output channels, the first half's tasks first, so that
  // with the thread queue's contiguous shares the threads that wrote the input's first channels
  // (the layer before splits its output channels the same way) read them; then the two sums added
  // with the epilogue, by blocks of output channels.
  void run_by_input_halves(RunContext& ctx, const float* x, float* y, const float* residual) {
    const kernels::ConvGeometry& g = conv_.geometry();
    const int64_t plane = g.out_h * g.out_w;
    float* sums = kernels::aligned_scratch(stacks_, 2 * g.out_c * plane);
    const kernels::PlaneView src{const_cast<float*>(x), 0, g.in_h * g.in_w};
    auto sums_of = [&](int64_t half) {
      return kernels::PlaneView{sums + half * g.out_c * plane, 0, plane};
    };
    const int64_t blocks = std::max<int64_t>(1, ctx.threads / 2);
    const int64_t per_block = ceil_div(g.out_c, blocks);
    parallel_for(ctx.threads, 2 * blocks, [&](int64_t task, int thread) {
      const int64_t half = task / blocks, c0 = task % blocks * per_block;
      kernels::conv2d_input_half(conv_, static_cast<int>(half), src, sums_of(half), 0, g.out_h, c0,
                                 std::min(g.out_c, c0 + per_block),
                                 ctx.scratch[static_cast<std::size_t>(thread)]);
    });
    const int64_t add_per_block = ceil_div(g.out_c, ctx.threads);
    parallel_for(ctx.threads, ceil_div(g.out_c, add_per_block), [&](int64_t task, int) {
      const int64_t c0 = task * add_per_block, c1 = std::min(g.out_c, c0 + add_per_block);
      const kernels::PlaneView dst{y, 0, plane};
      const kernels::PlaneView res{const_cast<float*>(residual), 0, plane};
      kernels::add_input_halves(conv_, sums_of(0), sums_of(1), dst, 0, g.out_h, c0, c1,
                                epilogue_.kernel, residual != nullptr ? &res : nullptr);
    });
    finish(ctx, epilogue_.fits);
  }

  kernels::PackedConv conv_;
  int64_t batch_;
  EpiloguePlan epilogue_;
  // The stacks the channel blocks share (run: images stacked), or the sums of the input halves.
  std::vector<float> stacks_;
};

// A 2-D Conv's or ConvTranspose's parameters, constant weight and bias (null when it has none)
// and output shape; nullopt, with why_not, where the fast kernels cannot take it.
struct ConvOperands {
  graph::ConvParams params;
  const float* weight = nullptr;
  const float* bias = nullptr;
  Dims output;
};
std::optional<ConvOperands> conv_operands(const graph::Graph& graph, const graph::Node& node,
                                          bool transposed, std::string* why_not) {
  const std::optional<Dims> x = dims_of(graph, node.input(0)), y = dims_of(graph, node.output(0));
  const Tensor* w = constant_of(graph, node.input(1));
  const Tensor* b = constant_of(graph, node.input(2));
  if (!x || !y || x->size() != 4) {
    *why_not = transposed ? "not a 2-D transposed convolution" : "not a 2-D convolution";
    return std::nullopt;
  }
  if (w == nullptr || (node.input(2) >= 0 && b == nullptr)) {
    *why_not = "weights or bias are not float32 constants";
    return std::nullopt;
  }
  const std::optional<Dims> bias_dims =
      b != nullptr ? std::optional<Dims>(b->shape()) : std::nullopt;
  return ConvOperands{(transposed ? graph::parse_conv_transpose : graph::parse_conv)(
                          graph, node, *x, w->shape(), bias_dims),
                      w->data<float>(), b != nullptr ? b->data<float>() : nullptr, *y};
}

std::unique_ptr<Step> make_conv(const graph::Graph& graph, const graph::Node& node,
                                const Options& options, std::string* why_not) {
  const std::optional<ConvOperands> c = conv_operands(graph, node, false, why_not);
  if (!c) return nullptr;
  const EpiloguePlan epilogue = plan_epilogue(graph, node, c->output, /*allow_col_bias=*/false);
  // A pruned weight (sparsity at or above the threshold) is packed for the sparse kernels.
  kernels::PackedConv conv(conv_geometry(c->params), c->weight, c->bias, options.sparse_threshold);
  return std::make_unique<ConvStep>(graph, node, std::move(conv), c->params.batch, epilogue);
}

// ---- ConvTranspose: PackedConvTranspose per 2-D transposed convolution, images x channels ----

class ConvTransposeStep final : public FastStep {
 public:
  ConvTransposeStep(const graph::Graph& graph, const graph::Node& node,
                    kernels::PackedConvTranspose conv, int64_t batch)
      : FastStep(graph, node, "conv-transpose " + conv.implementation()),
        conv_(std::move(conv)),
        batch_(batch) {}

  void run(RunContext& ctx) override {
    const kernels::ConvGeometry& g = conv_.geometry();
    const float* x = input(ctx, 0);
    float* y = output(ctx);
    const int64_t in_image = g.in_c * g.in_h * g.in_w, out_image = g.out_c * g.out_h * g.out_w;
    // Channel blocks only as far as the threads need: each block reads its image's input again.
    const int64_t granule = conv_.channel_granule();
    const int64_t channels = channels_per_block(
        g.out_c, granule, balanced_blocks(batch_, ctx.threads, ceil_div(g.out_c, granule)));
    const int64_t per_image = ceil_div(g.out_c, channels);
    parallel_for(ctx.threads, batch_ * per_image, [&](int64_t task, int thread) {
      const int64_t n = task / per_image, c0 = task % per_image * channels;
      kernels::conv_transpose2d_image(conv_, x + n * in_image, y + n * out_image, c0,
                                      std::min(g.out_c, c0 + channels),
                                      ctx.scratch[static_cast<std::size_t>(thread)]);
    });
    finish(ctx, false);
  }

  void describe(LayerInfo& info) const override {
    info.implementation = implementation();
    info.weight_format = conv_.weight_format();
    info.packed_bytes = conv_.packed_bytes();
  }

 private:
  kernels::PackedConvTranspose conv_;
  int64_t batch_;
};

std::unique_ptr<Step> make_conv_transpose(const graph::Graph& graph, const graph::Node& node,
                                          const Options& options, std::string* why_not) {
  const std::optional<ConvOperands> c = conv_operands(graph, node, true, why_not);
  if (!c) return nullptr;
  kernels::PackedConvTranspose conv(conv_geometry(c->params), c->weight, c->bias,
                                    options.sparse_threshold);
  return std::make_unique<ConvTransposeStep>(graph, node, std::move(conv), c->params.batch);
}

// ---- MatMul / Gemm: C[M x N] = A * B ----

// One product C = A * B per batch entry, each split into row x column blocks. The operands'
// and the output's batch offsets are precomputed (numpy broadcasting of the batch dims).
struct BatchedGemm {
  int64_t m = 0, n = 0, k = 0;
  std::vector<int64_t> a_offsets, b_offsets;  // per batch entry, in floats
};

class GemmStep final : public FastStep {
 public:
  // `weight` (K x N, row-major) is the constant B of a linear layer, copied (transposed where
  // the node says so) at build; empty when B is read from the node's input 1 per run. One B for
  // every batch entry is packed once into the micro-kernel's strips (kernels::PackedB), which
  // gemm() would otherwise redo for every region.
  GemmStep(const graph::Graph& graph, const graph::Node& node, BatchedGemm shape,
           std::vector<float> weight, EpiloguePlan epilogue, const char* what)
      : FastStep(graph, node,
                 fmt::format("{} gemm/{}", what, kernels::to_string(kernels::active_isa()))),
        shape_(std::move(shape)),
        epilogue_(epilogue) {
    if (!weight.empty() && shape_.b_offsets == std::vector<int64_t>{0}) {
      packed_b_.emplace(weight.data(), shape_.k, shape_.n, shape_.n);
    } else {
      weight_ = std::move(weight);
    }
  }

  void run(RunContext& ctx) override {
    const BatchedGemm& s = shape_;
    const float* a = input(ctx, 0);
    // B per batch entry: a constant copy or the node's input (unused with the packed B).
    const float* b = weight_.empty() ? input(ctx, 1) : weight_.data();
    float* c = output(ctx);
    const float* residual = epilogue_.residual_data(ctx);
    // Rows too are cut only as balance needs: within a task the driver reuses each block of B
    // across all its rows, so a task of 64 rows streamed all of a 3072-wide weight for them.
    // Dense BERT at batch 8 (1024 tokens: two tasks of 512 rows instead of 16 of 64) 1.05x,
    // BERT 90% 1.06x (its attention products: one task per head instead of two, B packed
    // once); batch 1 0.98-1.0x (5-8 alternated pairs, 2 threads). Rows are cut into blocks of
    // at least kGemmRowBlock = 128 (was 64): BERT's 128 tokens at batch 1 are then one block and
    // its linear layers split their columns, each thread streaming half of every weight instead
    // of all of it: dense BERT at batch 1 0.83-0.85x -> 0.87-0.90x of oneDNN (3-4 alternated
    // rounds, Zen 5, 2 threads); splitting columns first at batch 8 too ran 0.98x.
    const auto batches = static_cast<int64_t>(s.a_offsets.size());
    if (s.m == 0 || s.n == 0 || batches == 0) return;  // an empty output: nothing to compute
    const int64_t row_height =
        ceil_div(s.m, balanced_blocks(batches, ctx.threads, ceil_div(s.m, kGemmRowBlock)));
    const int64_t row_blocks = ceil_div(s.m, row_height);
    // Column blocks start at a strip of the packed B.
    const int64_t align = packed_b_ ? packed_b_->strip_width() : 1;
    const int64_t col_width =
        ceil_div(ceil_div(s.n, balanced_blocks(batches * row_blocks, ctx.threads,
                                               ceil_div(s.n, kMinTaskColumns))),
                 align) *
        align;
    const int64_t col_blocks = ceil_div(s.n, col_width);
    const int64_t per_batch = row_blocks * col_blocks;
    // Tasks side by side in the same rows of C, each summing its columns over several blocks of
    // K, load and store their tiles once per block; even with every task's columns a whole
    // number of cache lines, the cores' prefetchers fetch lines of the neighbouring task's
    // columns (a row of BERT's 768 outputs is 3 KiB, so both tasks' parts of it share a 4 KiB
    // page), and those lines travel between the cores on every block. Each task sums into a
    // buffer of its own thread instead and copies its rows out once. BERT's feed-forward output
    // product alone (128 x 3072 x 768, 2 threads, columns split): 0.70-0.78 of the two cores'
    // peak in C, 0.45-0.51 while the cores' round trip was slow; 0.78 in a private buffer either
    // way, copy included.
    const bool private_c =
        col_blocks > 1 && !kernels::gemm_packed_writes_c_once(s.k, kernels::active_isa());
    if (private_c) private_c_.resize(static_cast<std::size_t>(ctx.threads));
    parallel_for(ctx.threads, batches * per_batch, [&](int64_t task, int thread) {
      const int64_t batch = task / per_batch, block = task % per_batch;
      const int64_t r0 = block / col_blocks * row_height;
      const int64_t c0 = block % col_blocks * col_width;
      const kernels::GemmShape region{std::min(row_height, s.m - r0), std::min(col_width, s.n - c0),
                                      s.k};
      const int64_t out = batch * s.m * s.n + r0 * s.n + c0;
      kernels::Epilogue ep = epilogue_.kernel;
      if (ep.col_bias != nullptr) ep.col_bias += c0;
      if (residual != nullptr) {
        ep.residual = residual + out;
        ep.residual_ld = s.n;
      }
      const float* a_rows = a + s.a_offsets[static_cast<std::size_t>(batch)] + r0 * s.k;
      std::vector<float>& scratch = ctx.scratch[static_cast<std::size_t>(thread)];
      float* dst = c + out;
      int64_t ldd = s.n;
      if (private_c) {
        dst = kernels::aligned_scratch(private_c_[static_cast<std::size_t>(thread)],
                                       region.m * region.n);
        ldd = region.n;
      }
      if (packed_b_) {
        kernels::gemm_packed_b(region, a_rows, s.k, *packed_b_, c0, dst, ldd, ep, scratch);
      } else {
        kernels::gemm(region, a_rows, s.k, b + s.b_offsets[static_cast<std::size_t>(batch)] + c0,
                      s.n, dst, ldd, ep, scratch);
      }
      if (private_c) {
        for (int64_t r = 0; r < region.m; ++r) {
          std::memcpy(c + out + r * s.n, dst + r * ldd,
                      static_cast<std::size_t>(region.n) * sizeof(float));
        }
      }
    });
    finish(ctx, epilogue_.fits);
  }

  void describe(LayerInfo& info) const override {
    info.implementation = implementation();
    if (!packed_b_ && weight_.empty()) return;
    info.weight_format = "dense";
    info.packed_bytes = packed_b_ ? packed_b_->packed_bytes()
                                  : static_cast<int64_t>(weight_.size() * sizeof(float));
  }

 private:
  BatchedGemm shape_;
  std::optional<kernels::PackedB> packed_b_;  // a constant B shared by the batch entries
  std::vector<float> weight_;                 // a constant B per batch entry
  EpiloguePlan epilogue_;
  std::vector<std::vector<float>> private_c_;  // per thread: a task's C (run: private_c)
};

// A linear layer Y[T x N] = X[T x K] W[K x N] whose constant W is pruned: the sparse kernel over
// Y^T = W^T X^T (kernels::sparse_linear), regions = blocks of kSpmmTokenBlock tokens x blocks of
// features. Results do not depend on the split: the kernel sums every element in one order.
// X and Y are token-major, or in feature blocks where they pass between two such layers (see
// passes_in_feature_blocks).
class SparseLinearStep final : public FastStep {
 public:
  SparseLinearStep(const graph::Graph& graph, const graph::Node& node, kernels::SparseLinear w,
                   int64_t tokens, EpiloguePlan epilogue, kernels::LinearLayouts layouts,
                   const char* what)
      : FastStep(graph, node,
                 fmt::format("{} spmm/{}{}", what, kernels::to_string(kernels::active_isa()),
                             kernels::describe(layouts))),
        weight_(std::move(w)),
        tokens_(tokens),
        epilogue_(epilogue),
        layouts_(layouts) {}

  void run(RunContext& ctx) override {
    const int64_t k = weight_.depth(), n = weight_.features();
    const float* x = input(ctx, 0);
    float* y = output(ctx);
    const float* residual = epilogue_.residual_data(ctx);
    // Features cut by balanced_blocks: with four tasks per thread whatever the tokens, BERT 90%
    // pruned at batch 1 (two blocks of tokens, 2 threads) transposed each block four times and
    // ran 0.87x (8 interleaved pairs, median).
    const int64_t token_blocks = ceil_div(tokens_, kernels::kSpmmTokenBlock);
    const int64_t feature_blocks =
        balanced_blocks(token_blocks, ctx.threads, ceil_div(n, kMinTaskColumns));
    const int64_t features = ceil_div(n, feature_blocks);
    parallel_for(ctx.threads, token_blocks * feature_blocks, [&](int64_t task, int thread) {
      const int64_t t0 = task / feature_blocks * kernels::kSpmmTokenBlock;
      const int64_t f0 = task % feature_blocks * features;
      const int64_t t1 = std::min(tokens_, t0 + kernels::kSpmmTokenBlock);
      kernels::Epilogue ep = epilogue_.kernel;
      if (ep.col_bias != nullptr) ep.col_bias += f0;
      if (residual != nullptr) {
        ep.residual = residual + t0 * n + f0;
        ep.residual_ld = n;
      }
      kernels::sparse_linear(
          weight_, x + kernels::token_feature_offset(layouts_.x, t0, 0, k), k, t1 - t0, f0,
          std::min(n, f0 + features), y + kernels::token_feature_offset(layouts_.y, t0, f0, n), n,
          ep, ctx.scratch[static_cast<std::size_t>(thread)], kernels::active_isa(), layouts_,
          /*one_token_tensor=*/tokens_ == 1);
    });
    finish(ctx, epilogue_.fits);
  }

  void describe(LayerInfo& info) const override {
    info.implementation = implementation();
    info.weight_format = "sparse-csr";
    info.packed_bytes = weight_.packed_bytes();
  }

 private:
  kernels::SparseLinear weight_;
  int64_t tokens_;
  EpiloguePlan epilogue_;
  kernels::LinearLayouts layouts_;
};

// Whether a constant linear-layer weight of `count` floats is pruned enough for the sparse path.
bool use_sparse_linear(const Tensor& weight, const Options& options) {
  return kernels::zero_fraction(weight.data<float>(), weight.numel()) >=
         kernels::resolve_sparse_threshold(options.sparse_threshold,
                                           kernels::SparseLayerKind::kLinear);
}

// Offsets of each batch entry of an operand whose batch dims (right-aligned, 1 = broadcast)
// are `operand` within the product's batch dims `batch`.
std::vector<int64_t> batch_offsets(const Dims& batch, const Dims& operand, int64_t matrix) {
  Dims strides(batch.size(), 0);
  int64_t stride = matrix;
  for (std::size_t d = batch.size(); d-- > 0;) {
    strides[d] = operand[d] == 1 ? 0 : stride;
    stride *= operand[d];
  }
  std::vector<int64_t> offsets;
  Dims index(batch.size(), 0);
  for (int64_t i = 0, count = numel(batch); i < count; ++i) {
    int64_t offset = 0;
    for (std::size_t d = 0; d < batch.size(); ++d) offset += index[d] * strides[d];
    offsets.push_back(offset);
    for (std::size_t d = batch.size(); d-- > 0;) {
      if (++index[d] < batch[d]) break;
      index[d] = 0;
    }
  }
  return offsets;
}

// A MatMul that runs as a SparseLinearStep: its B a constant matrix pruned enough for the sparse
// kernel and shared by every batch entry of a dense A (a linear layer).
bool runs_sparse_linear(const graph::Graph& graph, const graph::Node& node,
                        const Options& options) {
  // make_fast_step's own conditions first: this also judges the MatMul that reads a value.
  const bool all_f32 = std::all_of(node.inputs.begin(), node.inputs.end(),
                                   [&](int v) { return v < 0 || is_f32(graph, v); });
  if (node.op_type != "MatMul" || !node.domain.empty() || !all_f32 || node.outputs.empty() ||
      !is_f32(graph, node.outputs[0])) {
    return false;
  }
  const std::optional<Dims> a = dims_of(graph, node.input(0)), b = dims_of(graph, node.input(1));
  const Tensor* weight = constant_of(graph, node.input(1));
  if (!a || !b || a->size() < 2 || b->size() < 2 || weight == nullptr) return false;
  const graph::MatMulParams p = graph::parse_matmul(graph, node, *a, *b);
  return numel(p.b_batch) == 1 && p.a_batch == p.batch && use_sparse_linear(*weight, options);
}

// Whether value `v` passes between two sparse linear layers in feature blocks: the output of
// one, read by nothing but the next as its X (BERT's FFN, 3072 features per token), whose
// tokens fill whole blocks, and the first one's epilogue ends in its kernel (no residual, no
// activation after it, see kernels::sparse_linear). Then the first writes Y^T as the kernel
// computes it and the second reads it as its X^T: no transpose out of one and into the other.
// Both steps ask this of the same value, so they agree on the layout. Under the depth-wise
// schedule (`column_of` not empty) a value that a column's op writes or reads stays
// token-major: the columns' tiles read and write no other layout in memory.
bool passes_in_feature_blocks(const graph::Graph& graph, int v, const Options& options,
                              std::span<const int> column_of) {
  if (v < 0 || std::find(graph.outputs.begin(), graph.outputs.end(), v) != graph.outputs.end()) {
    return false;
  }
  const int producer = value(graph, v).producer;
  const graph::Node* second = nullptr;  // the one node that reads v
  for (const graph::Node& node : graph.nodes) {
    if (std::find(node.inputs.begin(), node.inputs.end(), v) == node.inputs.end()) continue;
    if (second != nullptr) return false;
    second = &node;
  }
  if (producer < 0 || second == nullptr) return false;
  if (!column_of.empty() &&
      (column_of[static_cast<std::size_t>(producer)] >= 0 ||
       column_of[static_cast<std::size_t>(second - graph.nodes.data())] >= 0)) {
    return false;
  }
  const graph::Node& first = graph.nodes[static_cast<std::size_t>(producer)];
  if (first.outputs[0] != v || std::count(second->inputs.begin(), second->inputs.end(), v) != 1 ||
      second->input(0) != v || !runs_sparse_linear(graph, first, options) ||
      !runs_sparse_linear(graph, *second, options)) {
    return false;
  }
  const std::optional<Dims> y = dims_of(graph, v);
  if (!y || y->empty() || (numel(*y) / y->back()) % kernels::kSpmmTokenBlock != 0) return false;
  const EpiloguePlan epilogue = plan_epilogue(graph, first, *y, /*allow_col_bias=*/true);
  return epilogue.fits && epilogue.residual < 0 &&
         epilogue.kernel.post_residual == kernels::Activation::kNone;
}

std::unique_ptr<Step> make_matmul(const graph::Graph& graph, const graph::Node& node,
                                  const Options& options, std::span<const int> column_of,
                                  std::string* why_not) {
  const std::optional<Dims> a = dims_of(graph, node.input(0)), b = dims_of(graph, node.input(1));
  const std::optional<Dims> y = dims_of(graph, node.output(0));
  if (!a || !b || !y || a->size() < 2 || b->size() < 2) {
    return *why_not = "a 1-D operand (vector product)", nullptr;
  }
  const graph::MatMulParams p = graph::parse_matmul(graph, node, *a, *b);
  const EpiloguePlan epilogue = plan_epilogue(graph, node, *y, /*allow_col_bias=*/true);
  const Tensor* weight = constant_of(graph, node.input(1));
  if (runs_sparse_linear(graph, node, options)) {
    using kernels::TokenLayout;
    const kernels::LinearLayouts layouts{
        passes_in_feature_blocks(graph, node.input(0), options, column_of)
            ? TokenLayout::kFeatureBlocks
            : TokenLayout::kTokenMajor,
        passes_in_feature_blocks(graph, node.output(0), options, column_of)
            ? TokenLayout::kFeatureBlocks
            : TokenLayout::kTokenMajor};
    return std::make_unique<SparseLinearStep>(
        graph, node, kernels::SparseLinear(weight->data<float>(), p.k, p.n, p.n, 1),
        p.m * numel(p.batch), epilogue, layouts, "matmul");
  }
  BatchedGemm s{p.m, p.n, p.k, {}, {}};
  if (numel(p.b_batch) == 1 && p.a_batch == p.batch) {
    // One B for every batch entry (a linear layer): fold A's batch dims into M, so that the
    // row blocks span tokens of every batch entry and B is read once per block.
    s.m = p.m * numel(p.batch);
    s.a_offsets = {0};
    s.b_offsets = {0};
  } else {
    s.a_offsets = batch_offsets(p.batch, p.a_batch, p.m * p.k);
    s.b_offsets = batch_offsets(p.batch, p.b_batch, p.k * p.n);
  }
  std::vector<float> packed;
  if (weight != nullptr)
    packed.assign(weight->data<float>(), weight->data<float>() + weight->numel());
  return std::make_unique<GemmStep>(graph, node, std::move(s), std::move(packed), epilogue,
                                    "matmul");
}

std::unique_ptr<Step> make_gemm(const graph::Graph& graph, const graph::Node& node,
                                const Options& options, std::string* why_not) {
  const std::optional<Dims> a = dims_of(graph, node.input(0)), b = dims_of(graph, node.input(1));
  const std::optional<Dims> y = dims_of(graph, node.output(0));
  const Tensor* weight = constant_of(graph, node.input(1));
  if (!a || !b || !y || weight == nullptr) return *why_not = "B is not a float32 constant", nullptr;
  const std::optional<Dims> c_dims = dims_of(graph, node.input(2));
  const graph::GemmParams p = graph::parse_gemm(graph, node, *a, *b, c_dims);
  if (p.trans_a || p.alpha != 1.0f || (node.input(2) >= 0 && p.beta != 1.0f)) {
    return *why_not = "transA, alpha or beta other than the linear-layer form", nullptr;
  }
  EpiloguePlan epilogue = plan_epilogue(graph, node, *y, /*allow_col_bias=*/true);
  if (node.input(2) >= 0) {
    // C as the kernel's column bias: a constant vector along N. The node's own epilogue then
    // must not bring a second one.
    const Tensor* c = constant_of(graph, node.input(2));
    if (c == nullptr || c->numel() != p.n || !graph::broadcasts_to(c->shape(), {p.m, p.n}) ||
        (c->rank() == 2 && c->dim(0) != 1)) {
      return *why_not = "C is not a constant vector along N", nullptr;
    }
    if (epilogue.kernel.col_bias != nullptr) epilogue = EpiloguePlan{{}, -1, false};
    epilogue.kernel.col_bias = c->data<float>();
    // An unfused epilogue runs after the kernel: the bias must then be added by the kernel
    // alone, which is what a plan without activations or residual does.
  }
  const float* w = weight->data<float>();
  if (use_sparse_linear(*weight, options)) {
    kernels::SparseLinear sparse = p.trans_b ? kernels::SparseLinear(w, p.k, p.n, 1, p.k)
                                             : kernels::SparseLinear(w, p.k, p.n, p.n, 1);
    return std::make_unique<SparseLinearStep>(graph, node, std::move(sparse), p.m, epilogue,
                                              kernels::LinearLayouts{}, "gemm");
  }
  std::vector<float> packed(static_cast<std::size_t>(p.k * p.n));
  for (int64_t kk = 0; kk < p.k; ++kk) {
    for (int64_t nn = 0; nn < p.n; ++nn) {
      packed[static_cast<std::size_t>(kk * p.n + nn)] =
          p.trans_b ? w[nn * p.k + kk] : w[kk * p.n + nn];
    }
  }
  return std::make_unique<GemmStep>(graph, node, BatchedGemm{p.m, p.n, p.k, {0}, {0}},
                                    std::move(packed), epilogue, "gemm");
}

// ---- RNN, GRU, LSTM: kernels::PackedRecurrent, tasks of a direction x a block of entries ----

// Batch entries per task: sized from the problem, not the threads (see kRowsPerTask). Each step
// of a task multiplies its entries' states by all of R, so a larger block reads R fewer times;
// 4 leaves batch 8 (BERT-sized benchmarks) two tasks per direction.
constexpr int64_t kRecurrentRows = 4;

class RecurrentStep final : public FastStep {
 public:
  RecurrentStep(const graph::Graph& graph, const graph::Node& node, kernels::PackedRecurrent kernel)
      : FastStep(graph, node, kernel.implementation()), kernel_(std::move(kernel)) {}

  void run(RunContext& ctx) override {
    const kernels::reference::RecurrentShape& s = kernel_.shape();
    auto optional_in = [&](int i) -> const Tensor* {
      const int v = node_.input(i);
      return v >= 0 ? &ctx.tensors[static_cast<std::size_t>(v)] : nullptr;
    };
    auto optional_out = [&](std::size_t i) -> float* {
      if (i >= node_.outputs.size() || node_.outputs[i] < 0) return nullptr;
      return ctx.tensors[static_cast<std::size_t>(node_.outputs[i])].data<float>();
    };
    kernels::reference::RecurrentOperands o;
    o.x = input(ctx, 0);
    if (const Tensor* lens = optional_in(4)) {
      o.sequence_lens = lens->data<int32_t>();
      check_sequence_lens(graph_, node_, o.sequence_lens, s);
    }
    if (const Tensor* h = optional_in(5)) o.initial_h = h->data<float>();
    if (const Tensor* c = optional_in(6)) o.initial_c = c->data<float>();
    o.y = optional_out(0);
    o.y_h = optional_out(1);
    o.y_c = optional_out(2);
    if (buffers_.size() < static_cast<std::size_t>(ctx.threads)) {
      buffers_.resize(static_cast<std::size_t>(ctx.threads));
    }
    const int64_t blocks = ceil_div(s.batch, kRecurrentRows);
    parallel_for(ctx.threads, s.directions * blocks, [&](int64_t task, int thread) {
      const int64_t d = task / blocks, b0 = task % blocks * kRecurrentRows;
      kernel_.run(o, d, b0, std::min(b0 + kRecurrentRows, s.batch),
                  buffers_[static_cast<std::size_t>(thread)],
                  ctx.scratch[static_cast<std::size_t>(thread)]);
    });
    finish(ctx, false);
  }

 private:
  kernels::PackedRecurrent kernel_;
  std::vector<std::vector<float>> buffers_;  // per thread: projections, gates, states
};

bool is_recurrent(const graph::Node& node) {
  return node.op_type == "RNN" || node.op_type == "GRU" || node.op_type == "LSTM";
}

std::unique_ptr<Step> make_recurrent(const graph::Graph& graph, const graph::Node& node,
                                     [[maybe_unused]] const Options& options,
                                     std::string* why_not) {
  std::vector<std::optional<Dims>> shapes;
  for (std::size_t i = 0; i < node.inputs.size(); ++i) {
    const int v = node.inputs[i];
    if (v >= 0 && !dims_of(graph, v)) return *why_not = "an input's shape is unknown", nullptr;
    shapes.push_back(v >= 0 ? dims_of(graph, v) : std::nullopt);
  }
  // W, R, B and P are packed at build.
  for (int i : {1, 2, 3, 7}) {
    if (node.input(i) >= 0 && constant_of(graph, node.input(i)) == nullptr) {
      return *why_not = "a weight, bias or peephole is not a float32 constant", nullptr;
    }
  }
  if (node.input(4) >= 0 && value(graph, node.input(4)).dtype != DType::kInt32) {
    return *why_not = "sequence_lens is not int32", nullptr;
  }
  const RecurrentBinding bound = bind_recurrent(graph, node, shapes);
  const kernels::reference::RecurrentShape& s = bound.shape;
  if (s.seq_length <= 0 || s.batch <= 0 || s.input_size <= 0 || s.hidden_size <= 0) {
    return *why_not = "an empty dimension", nullptr;
  }
  auto data = [&](int i) {
    return node.input(i) >= 0 ? constant_of(graph, node.input(i))->data<float>() : nullptr;
  };
  return std::make_unique<RecurrentStep>(
      graph, node, kernels::PackedRecurrent(s, data(1), data(2), data(3), data(7)));
}

// ---- Einsum of one or two float operands: a batched GEMM on strided operands ----

// The stride that steps through labels [begin, end) of an operand as one index over them would:
// their strides nest like a dense block's (size-1 labels do not move). 1 for a group of one
// element; nullopt where the labels do not nest.
std::optional<int64_t> collapsed_stride(std::span<const int64_t> shape,
                                        std::span<const int64_t> strides, std::size_t begin,
                                        std::size_t end) {
  std::optional<int64_t> stride;
  int64_t next = 0;  // the stride the next outer label must have
  for (std::size_t i = end; i-- > begin;) {
    if (shape[i] == 1) continue;
    if (stride && strides[i] != next) return std::nullopt;
    if (!stride) stride = strides[i];
    next = strides[i] * shape[i];
  }
  return stride.value_or(1);
}

// An operand ([batch..., rows..., columns...] labels, as graph::EinsumProduct groups them) read
// in place as a batch of matrices: where each batch entry starts, and one stride for its rows and
// one for its columns.
struct MatrixViews {
  std::vector<int64_t> offsets;  // per batch entry, in floats
  int64_t row_stride = 0, col_stride = 0;
};

std::optional<MatrixViews> matrix_views(const std::vector<int64_t>& shape,
                                        const std::vector<int64_t>& strides,
                                        std::size_t batch_labels, std::size_t row_labels) {
  const std::optional<int64_t> rows =
      collapsed_stride(shape, strides, batch_labels, batch_labels + row_labels);
  const std::optional<int64_t> cols =
      collapsed_stride(shape, strides, batch_labels + row_labels, shape.size());
  if (!rows || !cols) return std::nullopt;
  std::vector<int64_t> offsets = {0};  // batch labels in order, the last one fastest
  for (std::size_t d = 0; d < batch_labels; ++d) {
    std::vector<int64_t> outer;
    for (int64_t o : offsets) {
      for (int64_t i = 0; i < shape[d]; ++i) outer.push_back(o + i * strides[d]);
    }
    offsets = std::move(outer);
  }
  return MatrixViews{std::move(offsets), *rows, *cols};
}

// Matrices of `rows` x `cols` one after another.
MatrixViews dense_views(int64_t batch, int64_t rows, int64_t cols) {
  MatrixViews v{std::vector<int64_t>(static_cast<std::size_t>(batch)), cols, 1};
  for (int64_t i = 0; i < batch; ++i) v.offsets[static_cast<std::size_t>(i)] = i * rows * cols;
  return v;
}

// How the product's operands are read: in place where an operand's labels form matrices the GEMM
// reads (A with unit column stride; B with unit column stride, or unit row stride as a B given
// transposed: an attention product's K^T read from K; C written with unit column stride), else
// through a dense copy (the product scattered from one). So the transposes around a
// transformer's attention products fold into them (graph::fold_matmul_transposes) instead of
// moving the activations once more.
struct EinsumOperands {
  MatrixViews a, b, c;  // each operand's matrices, in place or in its copy
  bool gather_a = false, gather_b = false, b_transposed = false, scatter_c = false;

  explicit EinsumOperands(const graph::EinsumProduct& p) {
    const std::size_t nb = p.batch_labels;
    std::optional<MatrixViews> in_a = matrix_views(p.a_shape, p.a_strides, nb, p.m_labels);
    gather_a = !in_a || in_a->col_stride != 1;
    a = gather_a ? dense_views(p.batch, p.m, p.k) : *std::move(in_a);
    std::optional<MatrixViews> in_b = matrix_views(p.b_shape, p.b_strides, nb, p.k_labels);
    b_transposed = in_b && in_b->col_stride != 1 && in_b->row_stride == 1;
    gather_b = !in_b || (in_b->col_stride != 1 && !b_transposed);
    b = gather_b ? dense_views(p.batch, p.k, p.n) : *std::move(in_b);
    std::optional<MatrixViews> in_c = matrix_views(p.c_shape, p.c_strides, nb, p.m_labels);
    scatter_c = !in_c || in_c->col_stride != 1;
    c = scatter_c ? dense_views(p.batch, p.m, p.n) : *std::move(in_c);
  }

  // "einsum gemm/avx512", then what is copied or transposed: "; copies A, B transposed".
  std::string implementation() const {
    std::vector<std::string> notes;
    if (gather_a) notes.emplace_back("copies A");
    if (gather_b) notes.emplace_back("copies B");
    if (b_transposed) notes.emplace_back("B transposed");
    if (scatter_c) notes.emplace_back("copies C");
    return fmt::format("einsum gemm/{}{}{}", kernels::to_string(kernels::active_isa()),
                       notes.empty() ? "" : "; ", fmt::join(notes, ", "));
  }
};

class EinsumStep final : public FastStep {
 public:
  EinsumStep(const graph::Graph& graph, const graph::Node& node,
             const graph::EinsumProduct& product)
      : EinsumStep(graph, node, product, EinsumOperands(product)) {}

  void run(RunContext& ctx) override {
    float* y = output(ctx);
    const int64_t out_numel = p_.batch * p_.m * p_.n;
    if (out_numel == 0) return;
    if (p_.k == 0) {  // an empty sum
      std::fill_n(y, out_numel, 0.0f);
      return finish(ctx, false);
    }
    const float one = 1.0f;
    const float* a = input(ctx, 0);
    const float* b = node_.inputs.size() == 2 ? input(ctx, 1) : &one;
    if (o_.gather_a) a = gathered(a, p_.a_shape, p_.a_strides, a_copy_);
    if (o_.gather_b) b = gathered(b, p_.b_shape, p_.b_strides, b_copy_);
    float* c = o_.scatter_c ? kernels::aligned_scratch(c_copy_, out_numel) : y;
    const int64_t row_blocks = ceil_div(p_.m, kGemmRowBlock);
    parallel_for(ctx.threads, p_.batch * row_blocks, [&](int64_t task, int thread) {
      const auto batch = static_cast<std::size_t>(task / row_blocks);
      const int64_t r0 = task % row_blocks * kGemmRowBlock;
      const kernels::GemmShape region{std::min(kGemmRowBlock, p_.m - r0), p_.n, p_.k};
      const float* a_rows = a + o_.a.offsets[batch] + r0 * o_.a.row_stride;
      const float* b_matrix = b + o_.b.offsets[batch];
      float* c_rows = c + o_.c.offsets[batch] + r0 * o_.c.row_stride;
      std::vector<float>& scratch = ctx.scratch[static_cast<std::size_t>(thread)];
      if (o_.b_transposed) {
        kernels::gemm_transposed_b(region, a_rows, o_.a.row_stride, b_matrix, o_.b.col_stride,
                                   c_rows, o_.c.row_stride, kernels::Epilogue{}, scratch);
      } else {
        kernels::gemm(region, a_rows, o_.a.row_stride, b_matrix, o_.b.row_stride, c_rows,
                      o_.c.row_stride, kernels::Epilogue{}, scratch);
      }
    });
    if (o_.scatter_c) {
      kernels::reference::copy_strided(c, kernels::reference::contiguous_strides(p_.c_shape), y,
                                       p_.c_strides, p_.c_shape, sizeof(float));
    }
    finish(ctx, false);
  }

 private:
  // The operand as a dense [shape] block, copied into `buffer`.
  static const float* gathered(const float* src, const std::vector<int64_t>& shape,
                               const std::vector<int64_t>& strides, std::vector<float>& buffer) {
    float* dst = kernels::aligned_scratch(buffer, numel(shape));
    kernels::reference::copy_strided(
        src, strides, dst, kernels::reference::contiguous_strides(shape), shape, sizeof(float));
    return dst;
  }

  EinsumStep(const graph::Graph& graph, const graph::Node& node, graph::EinsumProduct product,
             EinsumOperands operands)
      : FastStep(graph, node, operands.implementation()),
        p_(std::move(product)),
        o_(std::move(operands)) {}

  graph::EinsumProduct p_;
  EinsumOperands o_;
  std::vector<float> a_copy_, b_copy_, c_copy_;  // gathered operands and the product
};

std::unique_ptr<Step> make_einsum(const graph::Graph& graph, const graph::Node& node,
                                  [[maybe_unused]] const Options& options, std::string* why_not) {
  if (node.inputs.empty() || node.inputs.size() > 2) {
    return *why_not = "not one or two operands", nullptr;
  }
  std::vector<std::vector<int64_t>> shapes;
  for (int v : node.inputs) {
    const std::optional<Dims> dims = dims_of(graph, v);
    if (!dims) return *why_not = "an operand's shape is unknown", nullptr;
    shapes.push_back(*dims);
  }
  const graph::EinsumSpec spec = graph::resolve_einsum(graph::InferContext(graph, node),
                                                       node.attr_string("equation", ""), shapes);
  return std::make_unique<EinsumStep>(graph, node, graph::einsum_product(spec));
}

// ---- Row-wise ops: softmax and layer normalization over the last axis ----

class RowsStep final : public FastStep {
 public:
  RowsStep(const graph::Graph& graph, const graph::Node& node, int64_t rows, int64_t n)
      : FastStep(graph, node, RowNormalization(graph, node, n).implementation()),
        rows_(rows),
        n_(n),
        kernel_(graph, node, n) {}

  void run(RunContext& ctx) override {
    const float* x = input(ctx, 0);
    float* y = output(ctx);
    parallel_for(ctx.threads, ceil_div(rows_, kRowsPerTask), [&](int64_t task, int) {
      const int64_t r0 = task * kRowsPerTask;
      kernel_.run(x + r0 * n_, y + r0 * n_, std::min(kRowsPerTask, rows_ - r0));
    });
    finish(ctx, false);
  }

  // A row is read whole (its max, or its mean and variance) before any of it is written, and
  // each element before its own result: the output may take the input's buffer. BERT-base 90%
  // at batch 8 (its attention scores, 6 MiB a layer, then no longer copied into a second
  // buffer): 1.01-1.03x layer by layer (two engines in one process, 13 runs each, alternated).
  int writes_over_input() const override { return 0; }

 private:
  int64_t rows_, n_;
  RowNormalization kernel_;
};

// Only the first output may be used: Mean and InvStdDev of LayerNormalization are not computed
// by the fast kernel.
bool only_first_output_used(const graph::Graph& graph, const graph::Node& node) {
  const auto readers = graph.consumers();
  for (std::size_t i = 1; i < node.outputs.size(); ++i) {
    const int v = node.outputs[i];
    if (v < 0) continue;
    if (!readers[static_cast<std::size_t>(v)].empty()) return false;
    for (int o : graph.outputs) {
      if (o == v) return false;
    }
  }
  return true;
}

std::unique_ptr<Step> make_softmax(const graph::Graph& graph, const graph::Node& node,
                                   [[maybe_unused]] const Options& options, std::string* why_not) {
  const std::optional<Dims> x = dims_of(graph, node.input(0));
  if (!x) return *why_not = "shape unknown", nullptr;
  const graph::SoftmaxParams p = graph::parse_softmax(graph, node, *x);
  if (p.inner != 1) return *why_not = "the axis is not the last one", nullptr;
  return std::make_unique<RowsStep>(graph, node, p.outer, p.axis_size);
}

std::unique_ptr<Step> make_layer_norm(const graph::Graph& graph, const graph::Node& node,
                                      [[maybe_unused]] const Options& options,
                                      std::string* why_not) {
  const std::optional<Dims> x = dims_of(graph, node.input(0));
  const Tensor* scale = constant_of(graph, node.input(1));
  const Tensor* bias = constant_of(graph, node.input(2));
  if (!x || scale == nullptr || (node.input(2) >= 0 && bias == nullptr)) {
    return *why_not = "scale or bias is not a float32 constant", nullptr;
  }
  if (!only_first_output_used(graph, node)) return *why_not = "Mean or InvStdDev is read", nullptr;
  const graph::LayerNormParams p =
      graph::parse_layer_norm(graph, node, *x, scale->shape(),
                              bias != nullptr ? std::optional<Dims>(bias->shape()) : std::nullopt);
  if (scale->numel() != p.inner || (bias != nullptr && bias->numel() != p.inner)) {
    return *why_not = "scale or bias broadcasts within the normalized axes", nullptr;
  }
  return std::make_unique<RowsStep>(graph, node, p.outer, p.inner);
}

// ---- Pooling ----

class PoolStep final : public FastStep {
 public:
  PoolStep(const graph::Graph& graph, const graph::Node& node, kernels::PoolKind kind,
           kernels::PoolGeometry g, int64_t batch)
      : FastStep(graph, node, pool_rows_implementation(kind)), kind_(kind), g_(g), batch_(batch) {}

  void run(RunContext& ctx) override {
    const float* x = input(ctx, 0);
    float* y = output(ctx);
    const int64_t in_image = g_.channels * g_.in_h * g_.in_w;
    const int64_t out_image = g_.channels * g_.out_h * g_.out_w;
    const int64_t blocks = std::min<int64_t>(g_.out_h, std::max<int64_t>(1, 4 * ctx.threads));
    const int64_t rows = ceil_div(g_.out_h, blocks), per_image = ceil_div(g_.out_h, rows);
    parallel_for(ctx.threads, batch_ * per_image, [&](int64_t task, int thread) {
      const int64_t n = task / per_image, r0 = task % per_image * rows;
      const kernels::PlaneView src{const_cast<float*>(x) + n * in_image, 0, g_.in_h * g_.in_w};
      const kernels::PlaneView dst{y + n * out_image, 0, g_.out_h * g_.out_w};
      kernels::pool2d_rows(kind_, g_, src, dst, r0, std::min(g_.out_h, r0 + rows),
                           ctx.scratch[static_cast<std::size_t>(thread)]);
    });
    finish(ctx, false);
  }

 private:
  kernels::PoolKind kind_;
  kernels::PoolGeometry g_;
  int64_t batch_;
};

std::unique_ptr<Step> make_pool(const graph::Graph& graph, const graph::Node& node,
                                [[maybe_unused]] const Options& options, std::string* why_not) {
  const std::optional<Dims> x = dims_of(graph, node.input(0));
  if (!x || x->size() != 4) return *why_not = "not 2-D pooling", nullptr;
  if (node.outputs.size() > 1 && node.outputs[1] >= 0) return *why_not = "Indices output", nullptr;
  const graph::PoolParams p = graph::parse_pool(graph, node, *x);
  return std::make_unique<PoolStep>(graph, node, pool_kind(node), pool_geometry(p), p.batch);
}

class GlobalAveragePoolStep final : public FastStep {
 public:
  GlobalAveragePoolStep(const graph::Graph& graph, const graph::Node& node, int64_t planes,
                        int64_t plane_size)
      : FastStep(graph, node,
                 fmt::format("global-avg-pool/{}", kernels::to_string(kernels::active_isa()))),
        planes_(planes),
        plane_size_(plane_size) {}

  void run(RunContext& ctx) override {
    const float* x = input(ctx, 0);
    float* y = output(ctx);
    constexpr int64_t kPlanesPerTask = 64;
    parallel_for(ctx.threads, ceil_div(planes_, kPlanesPerTask), [&](int64_t task, int) {
      const int64_t p0 = task * kPlanesPerTask;
      kernels::global_average_pool(x + p0 * plane_size_, plane_size_, plane_size_,
                                   std::min(kPlanesPerTask, planes_ - p0), y + p0);
    });
    finish(ctx, false);
  }

 private:
  int64_t planes_, plane_size_;
};

std::unique_ptr<Step> make_global_average_pool(const graph::Graph& graph, const graph::Node& node,
                                               [[maybe_unused]] const Options& options,
                                               std::string* why_not) {
  const std::optional<Dims> x = dims_of(graph, node.input(0));
  if (!x || x->size() < 3) return *why_not = "input has no spatial dimensions", nullptr;
  const graph::ChannelLayout l = graph::parse_channel_layout(graph, node, *x);
  return std::make_unique<GlobalAveragePoolStep>(graph, node, l.batch * l.channels, l.inner);
}

// ---- Transpose: batched 2-D transposes, or copies of contiguous runs ----

// The input's dims and the permutation with size-1 axes dropped and axes that stay adjacent
// merged, so that the loops are few and long (BERT's attention head split [B, 128, 12, 64] by
// (0, 2, 1, 3) becomes runs of 64 floats; by (0, 2, 3, 1), 128 x 64 transposes per head).
std::pair<Dims, Dims> simplify_permutation(const Dims& in, const Dims& perm) {
  Dims renumber(in.size(), -1), dims, order;
  for (std::size_t a = 0; a < in.size(); ++a) {
    if (in[a] == 1) continue;
    renumber[a] = static_cast<int64_t>(dims.size());
    dims.push_back(in[a]);
  }
  for (int64_t p : perm) {
    if (renumber[static_cast<std::size_t>(p)] >= 0)
      order.push_back(renumber[static_cast<std::size_t>(p)]);
  }
  // Merge output axes i, i + 1 that read input axes p, p + 1: one axis of their product.
  for (std::size_t i = 0; i + 1 < order.size();) {
    const int64_t p = order[i];
    if (order[i + 1] != p + 1) {
      ++i;
      continue;
    }
    dims[static_cast<std::size_t>(p)] *= dims[static_cast<std::size_t>(p + 1)];
    dims.erase(dims.begin() + p + 1);
    order.erase(order.begin() + static_cast<std::ptrdiff_t>(i) + 1);
    for (int64_t& q : order) q -= q > p ? 1 : 0;
  }
  if (dims.empty()) return {{1}, {0}};
  return {dims, order};
}

class TransposeStep final : public FastStep {
 public:
  // `simplified`: the input's dims and the permutation, from simplify_permutation().
  TransposeStep(const graph::Graph& graph, const graph::Node& node,
                std::pair<Dims, Dims> simplified)
      : FastStep(graph, node, "transpose-2d"),
        in_(std::move(simplified.first)),
        perm_(std::move(simplified.second)) {
    const std::size_t rank = in_.size();
    Dims in_stride(rank, 1), out_dims(rank), out_stride(rank, 1);
    for (std::size_t a = rank - 1; a-- > 0;) in_stride[a] = in_stride[a + 1] * in_[a + 1];
    for (std::size_t i = 0; i < rank; ++i) out_dims[i] = in_[static_cast<std::size_t>(perm_[i])];
    for (std::size_t i = rank - 1; i-- > 0;) out_stride[i] = out_stride[i + 1] * out_dims[i + 1];
    // The output's last axis reads input axis `a`; the input's last axis lands on output axis b.
    const auto a = static_cast<std::size_t>(perm_.back());
    const auto b = static_cast<std::size_t>(
        std::find(perm_.begin(), perm_.end(), static_cast<int64_t>(rank - 1)) - perm_.begin());
    rows_ = a == rank - 1 ? 1 : in_[a];
    cols_ = in_[rank - 1];
    lds_ = in_stride[a];
    ldd_ = out_stride[b];
    // Every other output axis indexes one block.
    for (std::size_t i = 0; i < rank; ++i) {
      if (i == rank - 1 || i == b) continue;
      batch_.push_back({out_dims[i], in_stride[static_cast<std::size_t>(perm_[i])], out_stride[i]});
    }
  }

  void run(RunContext& ctx) override {
    const float* x = input(ctx, 0);
    float* y = output(ctx);
    int64_t blocks = 1;
    for (const Axis& axis : batch_) blocks *= axis.dim;
    const int64_t per_task = std::max<int64_t>(1, kEltwiseTaskFloats / (rows_ * cols_));
    parallel_for(ctx.threads, ceil_div(blocks, per_task), [&](int64_t task, int) {
      for (int64_t block = task * per_task; block < std::min(blocks, (task + 1) * per_task);
           ++block) {
        int64_t src = 0, dst = 0, rest = block;
        for (std::size_t i = batch_.size(); i-- > 0;) {
          src += rest % batch_[i].dim * batch_[i].in_stride;
          dst += rest % batch_[i].dim * batch_[i].out_stride;
          rest /= batch_[i].dim;
        }
        if (rows_ == 1) {
          std::memcpy(y + dst, x + src, static_cast<std::size_t>(cols_) * sizeof(float));
        } else {
          kernels::transpose_2d(x + src, lds_, rows_, cols_, y + dst, ldd_);
        }
      }
    });
    finish(ctx, false);
  }

 private:
  struct Axis {
    int64_t dim, in_stride, out_stride;
  };
  Dims in_, perm_;
  std::vector<Axis> batch_;  // outermost first
  int64_t rows_ = 1, cols_ = 1, lds_ = 0, ldd_ = 0;
};

std::unique_ptr<Step> make_transpose(const graph::Graph& graph, const graph::Node& node,
                                     [[maybe_unused]] const Options& options,
                                     std::string* why_not) {
  const std::optional<Dims> x = dims_of(graph, node.input(0));
  if (!x || x->empty() || numel(*x) == 0) return *why_not = "a scalar, empty or unknown", nullptr;
  const Dims perm =
      graph::resolve_perm(graph::InferContext(graph, node), static_cast<int64_t>(x->size()));
  return std::make_unique<TransposeStep>(graph, node, simplify_permutation(*x, perm));
}

// ---- Element-wise ----

// An operand's broadcast onto the output seen as rows x n (n = the output's last dimension),
// or nullopt when it is none of the forms the row kernels take.
std::optional<kernels::RowOperand> row_operand(const Dims& operand, const Dims& out) {
  const int64_t n = out.empty() ? 1 : out.back();
  if (operand == out) return kernels::RowOperand{nullptr, n, 1};
  if (numel(operand) == 1) return kernels::RowOperand{nullptr, 0, 0};
  if (!graph::broadcasts_to(operand, out) || operand.empty()) return std::nullopt;
  if (numel(operand) == n && operand.back() == n) return kernels::RowOperand{nullptr, 0, 1};
  // One value per row: the operand equals the output but for a last dimension of 1.
  if (operand.size() == out.size() && operand.back() == 1 &&
      std::equal(operand.begin(), operand.end() - 1, out.begin())) {
    return kernels::RowOperand{nullptr, 1, 0};
  }
  return std::nullopt;
}

class EltwiseStep final : public FastStep {
 public:
  EltwiseStep(const graph::Graph& graph, const graph::Node& node, std::string what, int64_t rows,
              int64_t n)
      : FastStep(graph, node,
                 fmt::format("{}-rows/{}", what, kernels::to_string(kernels::active_isa()))),
        rows_(rows),
        n_(n) {}

  void run(RunContext& ctx) override {
    float* y = output(ctx);
    std::vector<kernels::RowOperand> operands = operands_;
    for (std::size_t i = 0; i < operands.size(); ++i) operands[i].data = input(ctx, i);
    const int64_t rows_per_task =
        std::max<int64_t>(1, kEltwiseTaskFloats / std::max<int64_t>(n_, 1));
    parallel_for(ctx.threads, ceil_div(rows_, rows_per_task), [&](int64_t task, int) {
      const int64_t r0 = task * rows_per_task, rows = std::min(rows_per_task, rows_ - r0);
      auto at = [&](kernels::RowOperand op) {
        op.data += r0 * op.row_stride;
        return op;
      };
      if (binary_) {
        kernels::binary_rows(binary_kind_, at(operands[0]), at(operands[1]), y + r0 * n_, n_, rows,
                             n_);
      } else {
        kernels::unary_rows(unary_kind_, operands[0].data + r0 * n_, n_, y + r0 * n_, n_, rows, n_,
                            lo_, hi_);
      }
    });
    finish(ctx, false);
  }

  bool binary_ = false;
  kernels::BinaryKind binary_kind_ = kernels::BinaryKind::kAdd;
  kernels::UnaryKind unary_kind_ = kernels::UnaryKind::kRelu;
  float lo_ = 0.0f, hi_ = 0.0f;
  std::vector<kernels::RowOperand> operands_;

 private:
  int64_t rows_, n_;
};

std::unique_ptr<Step> make_eltwise(const graph::Graph& graph, const graph::Node& node,
                                   [[maybe_unused]] const Options& options, std::string* why_not) {
  const std::optional<Dims> y = dims_of(graph, node.output(0));
  if (!y) return *why_not = "shape unknown", nullptr;
  const int64_t n = y->empty() ? 1 : y->back();
  const int64_t rows = n == 0 ? 0 : numel(*y) / n;
  if (const std::optional<kernels::BinaryKind> kind = binary_kind(node.op_type)) {
    const std::optional<Dims> a = dims_of(graph, node.input(0)), b = dims_of(graph, node.input(1));
    if (!a || !b || !is_f32(graph, node.input(1))) return *why_not = "not float32", nullptr;
    const auto ra = row_operand(*a, *y), rb = row_operand(*b, *y);
    if (!ra || !rb) return *why_not = "a broadcast the row kernels do not take", nullptr;
    auto step =
        std::make_unique<EltwiseStep>(graph, node, fmt::format("binary-{}", node.op_type), rows, n);
    step->binary_ = true;
    step->binary_kind_ = *kind;
    step->operands_ = {*ra, *rb};
    return step;
  }
  if (const std::optional<kernels::UnaryKind> kind = unary_kind(node.op_type)) {
    auto step =
        std::make_unique<EltwiseStep>(graph, node, fmt::format("unary-{}", node.op_type), rows, n);
    step->unary_kind_ = *kind;
    step->operands_ = {kernels::RowOperand{nullptr, n, 1}};
    if (*kind == kernels::UnaryKind::kClip) {
      const std::optional<ClipBounds> bounds = clip_bounds(graph, node);
      if (!bounds) return *why_not = "bounds not constant", nullptr;
      step->lo_ = bounds->lo;
      step->hi_ = bounds->hi;
    }
    return step;
  }
  return *why_not = "no fast kernel for this op", nullptr;
}

// ---- The reference fallback and views ----

class ReferenceStep final : public Step {
 public:
  ReferenceStep(const graph::Graph& graph, const graph::Node& node, const RefOp& op)
      : graph_(graph), node_(node), op_(op) {}

  void run(RunContext& ctx) override {
    RefOpContext ref{graph_, node_, {}, {}};
    for (std::size_t i = 0; i < node_.own_input_count(); ++i) {
      const int v = node_.inputs[i];
      ref.inputs.push_back(v >= 0 ? &ctx.tensors[static_cast<std::size_t>(v)] : nullptr);
    }
    for (int v : node_.outputs) {
      Tensor* t = v >= 0 ? &ctx.tensors[static_cast<std::size_t>(v)] : nullptr;
      // Reference kernels may accumulate into their output, which evaluate_node hands them
      // zero-filled; an arena buffer holds whatever its previous tenant left.
      if (t != nullptr && t->raw_data() != nullptr) std::memset(t->raw_data(), 0, t->nbytes());
      ref.outputs.push_back(t);
    }
    op_.run(ref);
    if (!node_.epilogue.empty()) {
      std::vector<const Tensor*> args;
      for (int v : node_.inputs) {
        args.push_back(v >= 0 ? &ctx.tensors[static_cast<std::size_t>(v)] : nullptr);
      }
      apply_epilogue(graph_, node_, args, ctx.tensors[static_cast<std::size_t>(node_.outputs[0])]);
    }
  }
  std::string implementation() const override { return "reference"; }

 private:
  const graph::Graph& graph_;
  const graph::Node& node_;
  const RefOp& op_;
};

class ViewStep final : public Step {
 public:
  ViewStep(int input, int output, Dims shape)
      : input_(input), output_(output), shape_(std::move(shape)) {}
  void run(RunContext& ctx) override {
    ctx.tensors[static_cast<std::size_t>(output_)] =
        ctx.tensors[static_cast<std::size_t>(input_)].reshaped(shape_);
  }
  std::string implementation() const override { return "view (no copy)"; }

 private:
  int input_, output_;
  Dims shape_;
};

}  // namespace

StackTasks stacked_conv_tasks(const kernels::ConvGeometry& g, int64_t granule, int64_t batch,
                              int threads, bool sparse) {
  // Stacks of up to kStackPixels pixels (16 images of 7x7: the most the standalone product
  // gained from; 4 already gave most of it), in a number of tasks the threads share evenly where
  // the batch allows; channel blocks where it has too few images for the threads.
  constexpr int64_t kStackPixels = 1024;
  const int64_t plane = g.out_h * g.out_w;
  int64_t images = std::min(batch, ceil_div(kStackPixels, plane));
  const int64_t even = ceil_div(ceil_div(batch, images), threads) * threads;
  if (ceil_div(batch, even) > 1) images = ceil_div(batch, even);
  if (sparse) {
    // A sparse task reads its whole stack from the shared cache for its few non-zeros (a 90%
    // 2048 -> 512 layer at 7x7: 0.4 MB of input per image against 0.8 MB of packed weight for all
    // 512 channels), so the threads split images first, down to stacks of
    // kMinSparseStackPixels (2 images of 7x7; narrower tiles leave the kernel's FMAs waiting on
    // their latency: tiles of 2 vectors ran 1.1-1.6x slower), then channels. ResNet-50 90% at batch
    // 16 on 16 threads (Xeon, 300 MiB L3): every thread read the whole 6.4 MB stack of layer4's
    // 2048 -> 512 layers for 32 output channels, and they scaled 5.7-6.6x from one thread.
    constexpr int64_t kMinSparseStackPixels = 96;
    images = std::min(images, std::max(ceil_div(kMinSparseStackPixels, plane),
                                       ceil_div(batch, int64_t{std::max(threads, 1)})));
  }
  const int64_t groups = ceil_div(batch, images);
  const int64_t blocks = balanced_blocks(groups, threads, ceil_div(g.out_c, granule));
  return {images, channels_per_block(g.out_c, granule, blocks)};
}

// All channels, an image cut into row blocks only as far as the threads need (balanced_blocks: a
// block per image from a batch of 16 on 2 threads, two at batch 1): four blocks per thread
// whatever the batch made GEMMs of a few rows, each with its own im2col halo and call costs;
// cutting only as needed ran MobileNetV2 1.24x (b16) and 1.29x (b1), ResNet-50 1.30x and 1.17x
// (2 threads, 5 interleaved pairs, medians). Blocks of output channels instead:
//  - Where the weights outweigh the image's column matrix (out_c >= out_h * out_w: the deep
//    layers at batch 1): every row block streams all the weights from memory, a channel block
//    only its part, at the cost of redoing the im2col. This also splits a depthwise layer's
//    small planes (7x7, 14x14) by channels: MobileNetV2 at batch 1, 2 threads, 1.005-1.04x
//    (dense), 1.03-1.05x (80% pruned); its 7- and 14-wide depthwise layers 1.3-1.6x.
//  - Where row blocks would not start on a cache line (28 rows of 28 in two blocks: 392 floats)
//    and a channel block redoes nothing (depthwise and stride-1 1x1 layers, which read their
//    input in place): both threads would write the line at each block's edge in every plane,
//    and it would travel between their cores once per plane. MobileNetV2's 28x28 depthwise
//    layer alone (192 channels, 2 threads, one pinned process each): 40-150 us by rows, 25-37
//    by channels; MobileNetV2 at batch 1 against oneDNN (2 threads, 10 alternated pairs,
//    medians): 0.874x -> 0.907x, its 80% twin 1.44-1.49x -> 1.51-1.54x; ResNet-50 at batch 1,
//    whose 28x28 1x1 layers change too, 0.885x -> 0.891x.
ConvTasks dense_conv_tasks(const kernels::ConvGeometry& g, int64_t granule, int64_t batch,
                           int threads) {
  const int64_t rows = ceil_div(g.out_h, balanced_blocks(batch, threads, g.out_h));
  const bool depthwise = g.groups == g.in_c && g.groups == g.out_c;
  const bool pointwise = g.groups == 1 && g.kernel_h == 1 && g.kernel_w == 1 && g.stride_h == 1 &&
                         g.stride_w == 1 && g.pad_top == 0 && g.pad_left == 0;
  const bool edges_share_lines = rows < g.out_h && rows * g.out_w % kernels::kLineFloats != 0;
  if (granule < g.out_c &&
      (g.out_c >= g.out_h * g.out_w || ((depthwise || pointwise) && edges_share_lines))) {
    const int64_t blocks = balanced_blocks(batch, threads, ceil_div(g.out_c, granule));
    return {g.out_h, channels_per_block(g.out_c, granule, blocks)};
  }
  return {rows, g.out_c};
}

namespace {

bool output_over_input(const graph::Graph& graph, std::span<const int> root, std::size_t n,
                       int input) {
  const graph::Node& node = graph.nodes[n];
  if (input < 0 || static_cast<std::size_t>(input) >= node.inputs.size()) return false;
  const int in = node.inputs[static_cast<std::size_t>(input)], out = node.outputs[0];
  if (in < 0 || root[static_cast<std::size_t>(in)] < 0 ||
      root[static_cast<std::size_t>(out)] != out) {
    return false;
  }
  const int buffer = root[static_cast<std::size_t>(in)];
  auto bytes = [&](int v) {
    return numel(graph.concrete_dims(v)) * static_cast<int64_t>(dtype_size(value(graph, v).dtype));
  };
  if (bytes(buffer) != bytes(out)) return false;
  auto reads_buffer = [&](const graph::Node& reader, int except) {
    for (std::size_t i = 0; i < reader.inputs.size(); ++i) {
      const int v = reader.inputs[i];
      if (static_cast<int>(i) != except && v >= 0 && root[static_cast<std::size_t>(v)] == buffer) {
        return true;
      }
    }
    return false;
  };
  if (reads_buffer(node, input)) return false;
  for (std::size_t m = n + 1; m < graph.nodes.size(); ++m) {
    if (reads_buffer(graph.nodes[m], -1)) return false;
  }
  return true;
}

}  // namespace

bool place_output_over_input(const graph::Graph& graph, std::size_t n, const Step& step,
                             std::vector<int>& root, std::vector<int>& written_over) {
  const int input = step.writes_over_input();
  if (!output_over_input(graph, root, n, input)) return false;
  const graph::Node& node = graph.nodes[n];
  root[static_cast<std::size_t>(node.outputs[0])] =
      root[static_cast<std::size_t>(node.inputs[static_cast<std::size_t>(input)])];
  written_over.push_back(node.outputs[0]);
  return true;
}

std::unique_ptr<Step> make_fast_step(const graph::Graph& graph, const graph::Node& node,
                                     const Options& options, std::string* why_not,
                                     std::span<const int> column_of) {
  using Factory = std::unique_ptr<Step> (*)(const graph::Graph&, const graph::Node&, const Options&,
                                            std::string*);
  static const std::pair<const char*, Factory> kFactories[] = {
      {"Conv", make_conv},
      {"ConvTranspose", make_conv_transpose},
      {"Gemm", make_gemm},
      {"Softmax", make_softmax},
      {"Transpose", make_transpose},
      {"LayerNormalization", make_layer_norm},
      {"MaxPool", make_pool},
      {"AveragePool", make_pool},
      {"GlobalAveragePool", make_global_average_pool},
      {"Einsum", make_einsum},
      {"RNN", make_recurrent},
      {"GRU", make_recurrent},
      {"LSTM", make_recurrent},
      {"Add", make_eltwise},
      {"Sub", make_eltwise},
      {"Mul", make_eltwise},
      {"Div", make_eltwise},
      {"Relu", make_eltwise},
      {"Clip", make_eltwise},
      {"Sigmoid", make_eltwise},
      {"Tanh", make_eltwise},
      {"Erf", make_eltwise},
      {"Exp", make_eltwise},
      {"Sqrt", make_eltwise},
      {"Neg", make_eltwise},
  };
  if (!node.domain.empty()) return *why_not = "not the default domain", nullptr;
  for (std::size_t i = 0; i < node.inputs.size(); ++i) {
    // Clip's bounds and a recurrent op's sequence_lens (input 4) are read by the step itself.
    const bool float_input = node.op_type != "Clip" && !(is_recurrent(node) && i == 4);
    if (node.inputs[i] >= 0 && float_input && !is_f32(graph, node.inputs[i])) {
      return *why_not = "an input is not float32", nullptr;
    }
  }
  if (node.outputs.empty() || !is_f32(graph, node.outputs[0])) {
    return *why_not = "the output is not float32", nullptr;
  }
  // MatMul alone needs the plan's columns: they decide the layout of its sparse operands.
  if (node.op_type == "MatMul") return make_matmul(graph, node, options, column_of, why_not);
  for (const auto& [op, factory] : kFactories) {
    if (node.op_type == op) return factory(graph, node, options, why_not);
  }
  *why_not = "no fast kernel for this op";
  return nullptr;
}

std::unique_ptr<Step> make_reference_step(const graph::Graph& graph, const graph::Node& node) {
  const RefOp* op = find_reference_op(node.op_type);
  if (op == nullptr || !node.domain.empty()) {
    graph::fail(graph, node, ErrorCode::kUnsupported, "no implementation (fast or reference)");
  }
  return std::make_unique<ReferenceStep>(graph, node, *op);
}

bool is_view_op(const graph::Graph& graph, const graph::Node& node) {
  if (!graph::keeps_element_order(node) || !node.epilogue.empty() || node.outputs.size() != 1 ||
      node.input(0) < 0 || node.outputs[0] < 0) {
    return false;
  }
  const std::optional<Dims> in = dims_of(graph, node.input(0)),
                            out = dims_of(graph, node.outputs[0]);
  return in && out && numel(*in) == numel(*out) &&
         value(graph, node.input(0)).dtype == value(graph, node.outputs[0]).dtype;
}

std::unique_ptr<Step> make_view_step(const graph::Graph& graph, const graph::Node& node) {
  return std::make_unique<ViewStep>(node.input(0), node.outputs[0],
                                    *dims_of(graph, node.outputs[0]));
}

std::unique_ptr<Step> make_whole_step(const graph::Graph& graph, const graph::Node& node,
                                      const Options& options, std::string* why_not,
                                      std::span<const int> column_of) {
  if (is_view_op(graph, node) && !graph.is_output(node.outputs[0])) {
    return make_view_step(graph, node);
  }
  std::unique_ptr<Step> step = make_fast_step(graph, node, options, why_not, column_of);
  return step != nullptr ? std::move(step) : make_reference_step(graph, node);
}

void place_output(const graph::Graph& graph, std::size_t n, const Step& step,
                  std::vector<int>& root, std::vector<int>& written_over, bool may_write_over) {
  const graph::Node& node = graph.nodes[n];
  if (is_view_op(graph, node) && !graph.is_output(node.outputs[0])) {
    // The view shares its input's bytes: planned as one buffer.
    root[static_cast<std::size_t>(node.outputs[0])] =
        std::max(root[static_cast<std::size_t>(node.input(0))], -1);
  } else if (may_write_over) {
    place_output_over_input(graph, n, step, root, written_over);
  }
}

}  // namespace sparsecol::runtime::layerwise
