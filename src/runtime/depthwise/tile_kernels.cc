#include "runtime/depthwise/tile_kernels.h"

#include <algorithm>
#include <limits>
#include <optional>

#include <fmt/format.h>

#include "f32-eltwise/eltwise.h"
#include "f32-gemm/gemm.h"
#include "f32-pool/pool.h"
#include "f32-spmm/spmm.h"
#include "graph/op_params.h"
#include "runtime/kernel_bindings.h"

namespace sparsecol::runtime::depthwise {

namespace {

using Dims = std::vector<int64_t>;
using plan::RowMap;

const graph::Value& value_of(const graph::Graph& graph, int id) {
  return graph.values[static_cast<std::size_t>(id)];
}

Dims dims_of(const graph::Graph& graph, int id) {
  return *graph::concrete(*value_of(graph, id).shape);
}

const float* constant_data(const graph::Graph& graph, int id) {
  return id >= 0 && value_of(graph, id).constant ? value_of(graph, id).constant->data<float>()
                                                 : nullptr;
}

// Row r of channel 0 in a view of rows `width` floats wide.
float* row_at(const kernels::PlaneView& v, int64_t row, int64_t width) {
  return v.data + (row - v.row0) * width;
}

// How the row kernels (kernels/f32-eltwise's RowOperand, f32-norm) walk a tile of an op's
// output: an NCHW tile as one row per channel (the tile's rows of a channel plane are
// contiguous), a token tile as one row per token (its features).
struct RowWalk {
  bool tokens = false;
  int64_t channels = 0, width = 0;

  explicit RowWalk(const plan::TileOp& op)
      : tokens(op.tokens), channels(op.channels), width(op.width) {}
  int64_t count(plan::RowRange rows) const { return tokens ? rows.size() : channels; }
  int64_t length(plan::RowRange rows) const { return tokens ? width : rows.size() * width; }
  float* first(const kernels::PlaneView& v, plan::RowRange rows) const {
    return row_at(v, rows.begin, width);
  }
  int64_t stride(const kernels::PlaneView& v) const { return tokens ? width : v.plane_stride; }
  kernels::RowOperand operand(const kernels::PlaneView& v, plan::RowRange rows) const {
    return {first(v, rows), stride(v), 1};
  }
  // A constant: a scalar, or a vector along the channels (NCHW) or the features (tokens).
  kernels::RowOperand constant(const float* c, bool vector) const {
    if (!vector) return {c, 0, 0};
    return tokens ? kernels::RowOperand{c, 0, 1} : kernels::RowOperand{c, 1, 0};
  }
};

// An operand read on a tile: a view of input `input` (same shape as the output), or a constant
// scalar or vector (RowWalk::constant).
struct Operand {
  int input = -1;  // index into TileArgs::inputs, or -1 for the constant
  const float* constant = nullptr;
  bool vector = false;

  kernels::RowOperand bind(const TileArgs& args, const RowWalk& walk) const {
    if (input >= 0) return walk.operand(args.inputs[static_cast<std::size_t>(input)], args.rows);
    return walk.constant(constant, vector);
  }
};

Operand operand_of(const graph::Graph& graph, const graph::Node& node, const plan::TileOp& op,
                   std::size_t input) {
  Operand o;
  if (op.inputs[input].kind == RowMap::Kind::kSame) {
    o.input = static_cast<int>(input);
  } else {
    const int v = node.inputs[input];
    o.constant = constant_data(graph, v);
    o.vector = value_of(graph, v).constant->numel() > 1;
  }
  return o;
}

// A node's fused epilogue applied on the tile after its kernel, op by op, with the row kernels.
// Used where the kernel cannot fuse it (pooling, element-wise ops, unusual conv epilogues).
class TileEpilogue {
 public:
  TileEpilogue(const graph::Graph& graph, const graph::Node& node, const plan::TileOp& op,
               bool fused)
      : walk_(op) {
    if (fused) return;  // the kernel applies it
    for (const graph::EpilogueOp& e : node.epilogue) {
      Step s;
      switch (e.kind) {
        case graph::EpilogueOp::Kind::kRelu:
          s.unary = kernels::UnaryKind::kRelu;
          break;
        case graph::EpilogueOp::Kind::kClip:
          s.unary = kernels::UnaryKind::kClip;
          s.lo = e.min;
          s.hi = e.max;
          break;
        case graph::EpilogueOp::Kind::kGelu:
          s.unary = kernels::UnaryKind::kGelu;
          break;
        case graph::EpilogueOp::Kind::kAdd:
          s.add = operand_of(graph, node, op, static_cast<std::size_t>(e.input));
          break;
      }
      steps_.push_back(s);
    }
  }

  void apply(const TileArgs& args) const {
    const int64_t count = walk_.count(args.rows), n = walk_.length(args.rows);
    float* out = walk_.first(args.output, args.rows);
    const int64_t ld = walk_.stride(args.output);
    for (const Step& s : steps_) {
      if (s.add) {
        kernels::binary_rows(kernels::BinaryKind::kAdd, {out, ld, 1}, s.add->bind(args, walk_), out,
                             ld, count, n);
      } else {
        kernels::unary_rows(s.unary, out, ld, out, ld, count, n, s.lo, s.hi);
      }
    }
  }

 private:
  struct Step {
    std::optional<Operand> add;  // set: Add this operand; else the activation below
    kernels::UnaryKind unary = kernels::UnaryKind::kRelu;
    float lo = 0.0f, hi = 0.0f;
  };
  RowWalk walk_;
  std::vector<Step> steps_;
};

// ---- Conv ----

kernels::ConvGeometry conv_geometry_of(const graph::Graph& graph, const graph::Node& node) {
  const int b = node.input(2);
  return conv_geometry(
      graph::parse_conv(graph, node, dims_of(graph, node.input(0)), dims_of(graph, node.input(1)),
                        b >= 0 ? std::optional<Dims>(dims_of(graph, b)) : std::nullopt));
}

class ConvTile final : public TileKernel {
 public:
  ConvTile(const graph::Graph& graph, const graph::Node& node, const plan::TileOp& op,
           double sparse_threshold)
      : conv_(conv_geometry_of(graph, node), constant_data(graph, node.input(1)),
              constant_data(graph, node.input(2)), sparse_threshold),
        // The bias is packed with the weight (the conv kernel adds it per output channel).
        fused_(plan::fuse_tile_epilogue(graph, op)),
        generic_(graph, node, op, fused_.has_value()) {}

  void run(const TileArgs& args) const override {
    const kernels::ConvGeometry& g = conv_.geometry();
    kernels::Epilogue ep = fused_ ? fused_->kernel : kernels::Epilogue{};
    const kernels::PlaneView* residual = nullptr;
    if (fused_ && fused_->residual_input >= 0) {
      residual = &args.inputs[static_cast<std::size_t>(fused_->residual_input)];
      ep.residual = residual->data;
      ep.residual_ld = g.out_w;
    }
    kernels::conv2d_rows(conv_, args.inputs[0], args.output, args.rows.begin, args.rows.end, ep,
                         residual, *args.scratch);
    generic_.apply(args);
  }
  std::string implementation() const override { return "conv " + conv_.implementation(); }
  void describe(LayerInfo& info) const override {
    info.weight_format = conv_.weight_format();
    info.packed_bytes = conv_.packed_bytes();
  }
  bool may_overwrite_residual() const override {
    return fused_ && fused_->residual_input >= 0 && conv_.may_overwrite_residual();
  }

 private:
  kernels::PackedConv conv_;
  std::optional<FusedEpilogue> fused_;
  TileEpilogue generic_;  // empty when the kernel fuses the epilogue
};

// ---- Linear layers: a MatMul with a constant [K, N] weight on a tile of tokens ----

class LinearTile final : public TileKernel {
 public:
  LinearTile(const graph::Graph& graph, const graph::Node& node, const plan::TileOp& op,
             kernels::LinearLayouts layouts)
      : k_(dims_of(graph, node.input(1))[0]),
        n_(op.width),
        one_token_tensor_(op.batch * op.rows == 1),
        layouts_(layouts),
        fused_(plan::fuse_tile_epilogue(graph, op)),
        generic_(graph, node, op, fused_.has_value()) {
    // The planner's choice (plan::make_tile_op), the layer-by-layer steps' rule.
    const float* w = constant_data(graph, node.input(1));
    if (op.sparse) {
      sparse_.emplace(w, k_, n_, n_, 1);
    } else {
      dense_.emplace(w, k_, n_, n_);
    }
  }

  void run(const TileArgs& args) const override {
    // A tile's first token starts a feature block (plan::Column::feature_blocks).
    const int64_t tokens = args.rows.size();
    const kernels::PlaneView& in = args.inputs[0];
    const float* x =
        in.data + kernels::token_feature_offset(layouts_.x, args.rows.begin - in.row0, 0, k_);
    float* y = args.output.data +
               kernels::token_feature_offset(layouts_.y, args.rows.begin - args.output.row0, 0, n_);
    kernels::Epilogue ep = fused_ ? fused_->kernel : kernels::Epilogue{};
    if (fused_ && fused_->residual_input >= 0) {
      ep.residual = row_at(args.inputs[static_cast<std::size_t>(fused_->residual_input)],
                           args.rows.begin, n_);
      ep.residual_ld = n_;
    }
    if (sparse_) {
      kernels::sparse_linear(*sparse_, x, k_, tokens, 0, n_, y, n_, ep, *args.scratch,
                             kernels::active_isa(), layouts_, one_token_tensor_);
    } else {
      kernels::gemm_packed_b({tokens, n_, k_}, x, k_, *dense_, 0, y, n_, ep, *args.scratch);
    }
    generic_.apply(args);
  }
  std::string implementation() const override {
    return fmt::format("matmul {}/{}{}", sparse_ ? "spmm" : "gemm",
                       kernels::to_string(kernels::active_isa()), kernels::describe(layouts_));
  }
  void describe(LayerInfo& info) const override {
    info.weight_format = sparse_ ? "sparse-csr" : "dense";
    info.packed_bytes = sparse_ ? sparse_->packed_bytes() : dense_->packed_bytes();
  }

 private:
  int64_t k_, n_;
  bool one_token_tensor_;           // the whole input is one token (kernels::sparse_linear)
  kernels::LinearLayouts layouts_;  // feature blocks only between two sparse layers
  std::optional<kernels::SparseLinear> sparse_;
  std::optional<kernels::PackedB> dense_;
  std::optional<FusedEpilogue> fused_;
  TileEpilogue generic_;  // empty when the kernel fuses the epilogue
};

// ---- Per-token rows: LayerNormalization, Softmax over the features ----

class TokenRowsTile final : public TileKernel {
 public:
  TokenRowsTile(const graph::Graph& graph, const graph::Node& node, const plan::TileOp& op)
      : n_(op.width), kernel_(graph, node, n_), epilogue_(graph, node, op, /*fused=*/false) {}

  void run(const TileArgs& args) const override {
    kernel_.run(row_at(args.inputs[0], args.rows.begin, n_),
                row_at(args.output, args.rows.begin, n_), args.rows.size());
    epilogue_.apply(args);
  }
  std::string implementation() const override { return kernel_.implementation(); }

 private:
  int64_t n_;
  RowNormalization kernel_;
  TileEpilogue epilogue_;
};

// ---- Pooling ----

class PoolTile final : public TileKernel {
 public:
  PoolTile(const graph::Graph& graph, const graph::Node& node, const plan::TileOp& op)
      : kind_(pool_kind(node)),
        g_(pool_geometry(graph::parse_pool(graph, node, dims_of(graph, node.input(0))))),
        epilogue_(graph, node, op, /*fused=*/false) {}

  void run(const TileArgs& args) const override {
    kernels::pool2d_rows(kind_, g_, args.inputs[0], args.output, args.rows.begin, args.rows.end,
                         *args.scratch);
    epilogue_.apply(args);
  }
  std::string implementation() const override { return pool_rows_implementation(kind_); }

 private:
  kernels::PoolKind kind_;
  kernels::PoolGeometry g_;
  TileEpilogue epilogue_;
};

// ---- Element-wise ----

class EltwiseTile final : public TileKernel {
 public:
  EltwiseTile(const graph::Graph& graph, const graph::Node& node, const plan::TileOp& op)
      : walk_(op), epilogue_(graph, node, op, /*fused=*/false) {
    binary_ = binary_kind(node.op_type);
    unary_ = unary_kind(node.op_type);
    if (binary_) {
      a_ = operand_of(graph, node, op, 0);
      b_ = operand_of(graph, node, op, 1);
    }
    if (!binary_ && !unary_) {
      graph::fail(graph, node, ErrorCode::kInternal, "no element-wise tile kernel for this op");
    }
    if (unary_ == kernels::UnaryKind::kClip) {
      // The planner tiles a Clip only with constant bounds (plan::make_tile_op).
      const std::optional<ClipBounds> bounds = clip_bounds(graph, node);
      if (!bounds) graph::fail(graph, node, ErrorCode::kInternal, "Clip bounds are not scalars");
      lo_ = bounds->lo;
      hi_ = bounds->hi;
    }
    name_ = node.op_type;
  }

  void run(const TileArgs& args) const override {
    const int64_t count = walk_.count(args.rows), n = walk_.length(args.rows);
    float* out = walk_.first(args.output, args.rows);
    const int64_t ld = walk_.stride(args.output);
    if (binary_) {
      kernels::binary_rows(*binary_, a_.bind(args, walk_), b_.bind(args, walk_), out, ld, count, n);
    } else {
      const kernels::RowOperand src = walk_.operand(args.inputs[0], args.rows);
      kernels::unary_rows(*unary_, src.data, src.row_stride, out, ld, count, n, lo_, hi_);
    }
    epilogue_.apply(args);
  }
  std::string implementation() const override {
    return fmt::format("{}-{}-rows/{}", binary_ ? "binary" : "unary", name_,
                       kernels::to_string(kernels::active_isa()));
  }

 private:
  RowWalk walk_;
  std::optional<kernels::BinaryKind> binary_;
  std::optional<kernels::UnaryKind> unary_;
  Operand a_, b_;
  float lo_ = 0.0f, hi_ = 0.0f;
  std::string name_;
  TileEpilogue epilogue_;
};

}  // namespace

std::unique_ptr<TileKernel> make_tile_kernel(const graph::Graph& graph, const plan::TileOp& op,
                                             const Options& options,
                                             kernels::LinearLayouts layouts) {
  const graph::Node& node = graph.nodes[static_cast<std::size_t>(op.node)];
  if (node.op_type == "Conv") {
    return std::make_unique<ConvTile>(graph, node, op, options.sparse_threshold);
  }
  if (node.op_type == "MaxPool" || node.op_type == "AveragePool") {
    return std::make_unique<PoolTile>(graph, node, op);
  }
  if (node.op_type == "MatMul") return std::make_unique<LinearTile>(graph, node, op, layouts);
  if (node.op_type == "LayerNormalization" || node.op_type == "Softmax") {
    return std::make_unique<TokenRowsTile>(graph, node, op);
  }
  return std::make_unique<EltwiseTile>(graph, node, op);
}

}  // namespace sparsecol::runtime::depthwise
