#include "runtime/layerwise/steps.h"

#include <omp.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <utility>

#include <fmt/format.h>

#include "f32-conv/conv.h"
#include "f32-eltwise/eltwise.h"
#include "f32-gemm/gemm.h"
#include "f32-norm/norm.h"
#include "f32-pool/pool.h"
#include "graph/op_params.h"
#include "runtime/epilogue.h"
#include "runtime/reference/reference_ops.h"

namespace sparsecol::runtime::layerwise {

namespace {

using Dims = std::vector<int64_t>;

// Regions are sized from the problem, never from the thread count, and every output element is
// computed by exactly one region with the kernel's fixed summation order: results are the same
// for any number of threads.
constexpr int64_t kGemmRowBlock = 64;
constexpr int64_t kGemmColBlock = 256;
constexpr int64_t kRowsPerTask = 8;            // layer norm / softmax rows (tokens)
constexpr int64_t kEltwiseTaskFloats = 16384;  // 64 KiB of output: well above OpenMP overhead

// Runs fn(task, thread) for task in [0, count) on `threads` threads.
template <typename Fn>
void parallel_for(int threads, int64_t count, Fn&& fn) {
  if (threads <= 1 || count <= 1) {
    for (int64_t t = 0; t < count; ++t) fn(t, 0);
    return;
  }
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1)
  for (int64_t t = 0; t < count; ++t) fn(t, omp_get_thread_num());
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

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

kernels::Activation to_activation(graph::EpilogueOp::Kind kind) {
  switch (kind) {
    case graph::EpilogueOp::Kind::kRelu:
      return kernels::Activation::kRelu;
    case graph::EpilogueOp::Kind::kClip:
      return kernels::Activation::kClip;
    case graph::EpilogueOp::Kind::kGelu:
      return kernels::Activation::kGelu;
    case graph::EpilogueOp::Kind::kAdd:
      break;
  }
  return kernels::Activation::kNone;
}

// A node's epilogue in the kernels' form out = post(residual + pre(acc + col_bias)). When the
// list does not fit that form, `fits` is false and the step applies it afterwards with the
// generic runtime::apply_epilogue.
struct EpiloguePlan {
  kernels::Epilogue kernel;  // residual pointer bound per run
  int residual = -1;         // value id of the residual operand
  bool fits = true;
};

EpiloguePlan plan_epilogue(const graph::Graph& graph, const graph::Node& node, const Dims& out,
                           bool allow_col_bias) {
  EpiloguePlan plan;
  enum Stage { kStart, kBias, kPre, kResidual, kPost } stage = kStart;
  bool clip_used = false;
  auto activation = [&](const graph::EpilogueOp& op) {
    if (op.kind == graph::EpilogueOp::Kind::kClip) {
      if (clip_used && (plan.kernel.clip_min != op.min || plan.kernel.clip_max != op.max)) {
        return false;
      }
      clip_used = true;
      plan.kernel.clip_min = op.min;
      plan.kernel.clip_max = op.max;
    }
    if (stage <= kBias) {
      plan.kernel.pre_residual = to_activation(op.kind);
      stage = kPre;
    } else if (stage == kResidual) {
      plan.kernel.post_residual = to_activation(op.kind);
      stage = kPost;
    } else {
      return false;
    }
    return true;
  };
  for (const graph::EpilogueOp& op : node.epilogue) {
    if (op.kind != graph::EpilogueOp::Kind::kAdd) {
      if (!activation(op)) plan.fits = false;
      continue;
    }
    const int operand = op.input >= 0 && static_cast<std::size_t>(op.input) < node.inputs.size()
                            ? node.inputs[static_cast<std::size_t>(op.input)]
                            : -1;
    const std::optional<Dims> dims = dims_of(graph, operand);
    const Tensor* constant = constant_of(graph, operand);
    if (constant != nullptr && allow_col_bias && stage == kStart && !out.empty() &&
        constant->numel() == out.back() && graph::broadcasts_to(constant->shape(), out)) {
      plan.kernel.col_bias = constant->data<float>();
      stage = kBias;
    } else if (is_f32(graph, operand) && dims && *dims == out && stage <= kPre) {
      plan.residual = operand;
      stage = kResidual;
    } else {
      plan.fits = false;
    }
  }
  if (!plan.fits) plan = EpiloguePlan{{}, -1, false};
  return plan;
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
      : FastStep(graph, node, "conv " + conv.implementation()),
        conv_(std::move(conv)),
        batch_(batch),
        epilogue_(epilogue) {}

  void run(RunContext& ctx) override {
    const kernels::ConvGeometry& g = conv_.geometry();
    const float* x = input(ctx, 0);
    float* y = output(ctx);
    const float* residual =
        epilogue_.residual >= 0
            ? ctx.tensors[static_cast<std::size_t>(epilogue_.residual)].data<float>()
            : nullptr;
    const int64_t in_image = g.in_c * g.in_h * g.in_w, out_image = g.out_c * g.out_h * g.out_w;
    // Enough row blocks per image to feed every thread even at batch 1.
    const int64_t blocks = std::min<int64_t>(g.out_h, std::max<int64_t>(1, 4 * ctx.threads));
    const int64_t rows = ceil_div(g.out_h, blocks);
    const int64_t per_image = ceil_div(g.out_h, rows);
    parallel_for(ctx.threads, batch_ * per_image, [&](int64_t task, int thread) {
      const int64_t n = task / per_image, r0 = task % per_image * rows;
      const int64_t r1 = std::min(g.out_h, r0 + rows);
      const kernels::PlaneView src{const_cast<float*>(x) + n * in_image, 0, g.in_h * g.in_w};
      const kernels::PlaneView dst{y + n * out_image, 0, g.out_h * g.out_w};
      kernels::Epilogue ep = epilogue_.kernel;
      kernels::PlaneView res{};
      if (residual != nullptr) {
        res = {const_cast<float*>(residual) + n * out_image, 0, g.out_h * g.out_w};
        ep.residual = res.data;
        ep.residual_ld = g.out_w;
      }
      kernels::conv2d_rows(conv_, src, dst, r0, r1, ep, residual != nullptr ? &res : nullptr,
                           ctx.scratch[static_cast<std::size_t>(thread)]);
    });
    finish(ctx, epilogue_.fits);
  }

 private:
  kernels::PackedConv conv_;
  int64_t batch_;
  EpiloguePlan epilogue_;
};

std::unique_ptr<Step> make_conv(const graph::Graph& graph, const graph::Node& node,
                                [[maybe_unused]] const Options& options, std::string* why_not) {
  const std::optional<Dims> x = dims_of(graph, node.input(0)), y = dims_of(graph, node.output(0));
  const Tensor* w = constant_of(graph, node.input(1));
  const Tensor* b = constant_of(graph, node.input(2));
  if (!x || !y || x->size() != 4) return *why_not = "not a 2-D convolution", nullptr;
  if (w == nullptr || (node.input(2) >= 0 && b == nullptr)) {
    return *why_not = "weights or bias are not float32 constants", nullptr;
  }
  const std::optional<Dims> bias_dims =
      b != nullptr ? std::optional<Dims>(b->shape()) : std::nullopt;
  const graph::ConvParams p = graph::parse_conv(graph, node, *x, w->shape(), bias_dims);
  const graph::WindowParams& win = p.window;
  kernels::ConvGeometry g;
  g.in_c = p.in_channels;
  g.in_h = win.in_size[0];
  g.in_w = win.in_size[1];
  g.out_c = p.out_channels;
  g.out_h = win.out_size[0];
  g.out_w = win.out_size[1];
  g.kernel_h = win.kernel[0];
  g.kernel_w = win.kernel[1];
  g.stride_h = win.strides[0];
  g.stride_w = win.strides[1];
  g.pad_top = win.pads_begin[0];
  g.pad_left = win.pads_begin[1];
  g.dilation_h = win.dilations[0];
  g.dilation_w = win.dilations[1];
  g.groups = p.group;
  const EpiloguePlan epilogue = plan_epilogue(graph, node, *y, /*allow_col_bias=*/false);
  kernels::PackedConv conv(g, w->data<float>(), b != nullptr ? b->data<float>() : nullptr);
  return std::make_unique<ConvStep>(graph, node, std::move(conv), p.batch, epilogue);
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
  // the node says so) at build; empty when B is read from the node's input 1 per run.
  GemmStep(const graph::Graph& graph, const graph::Node& node, BatchedGemm shape,
           std::vector<float> weight, EpiloguePlan epilogue, const char* what)
      : FastStep(graph, node,
                 fmt::format("{} gemm/{}", what, kernels::to_string(kernels::active_isa()))),
        shape_(std::move(shape)),
        weight_(std::move(weight)),
        epilogue_(epilogue) {}

  void run(RunContext& ctx) override {
    const BatchedGemm& s = shape_;
    const float* a = input(ctx, 0);
    const float* b = weight_.empty() ? input(ctx, 1) : weight_.data();
    float* c = output(ctx);
    const float* residual =
        epilogue_.residual >= 0
            ? ctx.tensors[static_cast<std::size_t>(epilogue_.residual)].data<float>()
            : nullptr;
    const int64_t row_blocks = ceil_div(s.m, kGemmRowBlock);
    const int64_t col_blocks = ceil_div(s.n, kGemmColBlock);
    const int64_t per_batch = row_blocks * col_blocks;
    const auto batches = static_cast<int64_t>(s.a_offsets.size());
    parallel_for(ctx.threads, batches * per_batch, [&](int64_t task, int thread) {
      const int64_t batch = task / per_batch, block = task % per_batch;
      const int64_t r0 = block / col_blocks * kGemmRowBlock;
      const int64_t c0 = block % col_blocks * kGemmColBlock;
      const kernels::GemmShape region{std::min(kGemmRowBlock, s.m - r0),
                                      std::min(kGemmColBlock, s.n - c0), s.k};
      const int64_t out = batch * s.m * s.n + r0 * s.n + c0;
      kernels::Epilogue ep = epilogue_.kernel;
      if (ep.col_bias != nullptr) ep.col_bias += c0;
      if (residual != nullptr) {
        ep.residual = residual + out;
        ep.residual_ld = s.n;
      }
      kernels::gemm(region, a + s.a_offsets[static_cast<std::size_t>(batch)] + r0 * s.k, s.k,
                    b + s.b_offsets[static_cast<std::size_t>(batch)] + c0, s.n, c + out, s.n, ep,
                    ctx.scratch[static_cast<std::size_t>(thread)]);
    });
    finish(ctx, epilogue_.fits);
  }

 private:
  BatchedGemm shape_;
  std::vector<float> weight_;
  EpiloguePlan epilogue_;
};

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

std::unique_ptr<Step> make_matmul(const graph::Graph& graph, const graph::Node& node,
                                  [[maybe_unused]] const Options& options, std::string* why_not) {
  const std::optional<Dims> a = dims_of(graph, node.input(0)), b = dims_of(graph, node.input(1));
  const std::optional<Dims> y = dims_of(graph, node.output(0));
  if (!a || !b || !y || a->size() < 2 || b->size() < 2) {
    return *why_not = "a 1-D operand (vector product)", nullptr;
  }
  const graph::MatMulParams p = graph::parse_matmul(graph, node, *a, *b);
  const EpiloguePlan epilogue = plan_epilogue(graph, node, *y, /*allow_col_bias=*/true);
  BatchedGemm s{p.m, p.n, p.k, {}, {}};
  const Tensor* weight = constant_of(graph, node.input(1));
  const bool b_shared = numel(p.b_batch) == 1;
  if (b_shared) {
    // One B for every batch entry (a linear layer): fold A's batch dims into M, so that the
    // row blocks span tokens of every batch entry and B is read once per block.
    const bool a_dense = p.a_batch == p.batch;
    if (a_dense) {
      s.m = p.m * numel(p.batch);
      s.a_offsets = {0};
      s.b_offsets = {0};
    }
  }
  if (s.a_offsets.empty()) {
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
                                [[maybe_unused]] const Options& options, std::string* why_not) {
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
  std::vector<float> packed(static_cast<std::size_t>(p.k * p.n));
  const float* w = weight->data<float>();
  for (int64_t kk = 0; kk < p.k; ++kk) {
    for (int64_t nn = 0; nn < p.n; ++nn) {
      packed[static_cast<std::size_t>(kk * p.n + nn)] =
          p.trans_b ? w[nn * p.k + kk] : w[kk * p.n + nn];
    }
  }
  return std::make_unique<GemmStep>(graph, node, BatchedGemm{p.m, p.n, p.k, {0}, {0}},
                                    std::move(packed), epilogue, "gemm");
}

// ---- Row-wise ops: softmax and layer normalization over the last axis ----

class RowsStep final : public FastStep {
 public:
  using Kernel = void (*)(const RowsStep&, const float*, float*, int64_t rows);
  RowsStep(const graph::Graph& graph, const graph::Node& node, std::string what, int64_t rows,
           int64_t n, Kernel kernel)
      : FastStep(graph, node,
                 fmt::format("{}/{}", what, kernels::to_string(kernels::active_isa()))),
        rows_(rows),
        n_(n),
        kernel_(kernel) {}

  void run(RunContext& ctx) override {
    const float* x = input(ctx, 0);
    float* y = output(ctx);
    parallel_for(ctx.threads, ceil_div(rows_, kRowsPerTask), [&](int64_t task, int) {
      const int64_t r0 = task * kRowsPerTask;
      kernel_(*this, x + r0 * n_, y + r0 * n_, std::min(kRowsPerTask, rows_ - r0));
    });
    finish(ctx, false);
  }

  int64_t n() const { return n_; }
  std::vector<float> gamma, beta;  // layer norm
  float epsilon = 0.0f;

 private:
  int64_t rows_, n_;
  Kernel kernel_;
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
  return std::make_unique<RowsStep>(
      graph, node, "softmax-rows", p.outer, p.axis_size,
      [](const RowsStep& s, const float* src, float* dst, int64_t rows) {
        kernels::softmax_rows(src, s.n(), dst, s.n(), rows, s.n());
      });
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
  auto step = std::make_unique<RowsStep>(
      graph, node, "layer-norm-rows", p.outer, p.inner,
      [](const RowsStep& s, const float* src, float* dst, int64_t rows) {
        kernels::layer_norm_rows(src, s.n(), dst, s.n(), rows, s.n(), s.gamma.data(),
                                 s.beta.empty() ? nullptr : s.beta.data(), s.epsilon);
      });
  step->gamma.assign(scale->data<float>(), scale->data<float>() + p.inner);
  if (bias != nullptr) step->beta.assign(bias->data<float>(), bias->data<float>() + p.inner);
  step->epsilon = p.epsilon;
  return step;
}

// ---- Pooling ----

class PoolStep final : public FastStep {
 public:
  PoolStep(const graph::Graph& graph, const graph::Node& node, kernels::PoolKind kind,
           kernels::PoolGeometry g, int64_t batch)
      : FastStep(graph, node,
                 fmt::format("{}-pool-rows/{}", kind == kernels::PoolKind::kMax ? "max" : "avg",
                             kernels::to_string(kernels::active_isa()))),
        kind_(kind),
        g_(g),
        batch_(batch) {}

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
  const graph::WindowParams& w = p.window;
  kernels::PoolGeometry g;
  g.channels = p.channels;
  g.in_h = w.in_size[0];
  g.in_w = w.in_size[1];
  g.out_h = w.out_size[0];
  g.out_w = w.out_size[1];
  g.kernel_h = w.kernel[0];
  g.kernel_w = w.kernel[1];
  g.stride_h = w.strides[0];
  g.stride_w = w.strides[1];
  g.pad_top = w.pads_begin[0];
  g.pad_left = w.pads_begin[1];
  g.pad_bottom = w.pads_end[0];
  g.pad_right = w.pads_end[1];
  g.dilation_h = w.dilations[0];
  g.dilation_w = w.dilations[1];
  g.count_include_pad = p.count_include_pad;
  const auto kind =
      node.op_type == "MaxPool" ? kernels::PoolKind::kMax : kernels::PoolKind::kAverage;
  return std::make_unique<PoolStep>(graph, node, kind, g, p.batch);
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
  static const std::pair<const char*, kernels::BinaryKind> kBinary[] = {
      {"Add", kernels::BinaryKind::kAdd},
      {"Sub", kernels::BinaryKind::kSub},
      {"Mul", kernels::BinaryKind::kMul},
      {"Div", kernels::BinaryKind::kDiv}};
  static const std::pair<const char*, kernels::UnaryKind> kUnary[] = {
      {"Relu", kernels::UnaryKind::kRelu},       {"Clip", kernels::UnaryKind::kClip},
      {"Sigmoid", kernels::UnaryKind::kSigmoid}, {"Tanh", kernels::UnaryKind::kTanh},
      {"Erf", kernels::UnaryKind::kErf},         {"Exp", kernels::UnaryKind::kExp},
      {"Sqrt", kernels::UnaryKind::kSqrt},       {"Neg", kernels::UnaryKind::kNeg}};
  const std::optional<Dims> y = dims_of(graph, node.output(0));
  if (!y) return *why_not = "shape unknown", nullptr;
  const int64_t n = y->empty() ? 1 : y->back();
  const int64_t rows = n == 0 ? 0 : numel(*y) / n;
  for (const auto& [op, kind] : kBinary) {
    if (node.op_type != op) continue;
    const std::optional<Dims> a = dims_of(graph, node.input(0)), b = dims_of(graph, node.input(1));
    if (!a || !b || !is_f32(graph, node.input(1))) return *why_not = "not float32", nullptr;
    const auto ra = row_operand(*a, *y), rb = row_operand(*b, *y);
    if (!ra || !rb) return *why_not = "a broadcast the row kernels do not take", nullptr;
    auto step = std::make_unique<EltwiseStep>(graph, node, fmt::format("binary-{}", op), rows, n);
    step->binary_ = true;
    step->binary_kind_ = kind;
    step->operands_ = {*ra, *rb};
    return step;
  }
  for (const auto& [op, kind] : kUnary) {
    if (node.op_type != op) continue;
    auto step = std::make_unique<EltwiseStep>(graph, node, fmt::format("unary-{}", op), rows, n);
    step->unary_kind_ = kind;
    step->operands_ = {kernels::RowOperand{nullptr, n, 1}};
    if (kind == kernels::UnaryKind::kClip) {
      // Bounds must be constants (opset 11+ inputs, or the opset 6 attributes).
      step->lo_ = node.attr_float("min", -std::numeric_limits<float>::infinity());
      step->hi_ = node.attr_float("max", std::numeric_limits<float>::infinity());
      for (std::size_t i = 1; i <= 2; ++i) {
        if (node.input(i) < 0) continue;
        const Tensor* bound = constant_of(graph, node.input(i));
        if (bound == nullptr || bound->numel() != 1)
          return *why_not = "bounds not constant", nullptr;
        (i == 1 ? step->lo_ : step->hi_) = bound->data<float>()[0];
      }
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

std::unique_ptr<Step> make_fast_step(const graph::Graph& graph, const graph::Node& node,
                                     const Options& options, std::string* why_not) {
  using Factory = std::unique_ptr<Step> (*)(const graph::Graph&, const graph::Node&, const Options&,
                                            std::string*);
  static const std::pair<const char*, Factory> kFactories[] = {
      {"Conv", make_conv},
      {"MatMul", make_matmul},
      {"Gemm", make_gemm},
      {"Softmax", make_softmax},
      {"LayerNormalization", make_layer_norm},
      {"MaxPool", make_pool},
      {"AveragePool", make_pool},
      {"GlobalAveragePool", make_global_average_pool},
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
  for (int v : node.inputs) {
    if (v >= 0 && !is_f32(graph, v) && node.op_type != "Clip") {
      return *why_not = "an input is not float32", nullptr;
    }
  }
  if (node.outputs.empty() || !is_f32(graph, node.outputs[0])) {
    return *why_not = "the output is not float32", nullptr;
  }
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
  static const char* const kViews[] = {"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity"};
  const bool listed = std::any_of(std::begin(kViews), std::end(kViews),
                                  [&](const char* op) { return node.op_type == op; });
  if (!listed || !node.domain.empty() || !node.epilogue.empty() || node.outputs.size() != 1 ||
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

}  // namespace sparsecol::runtime::layerwise
