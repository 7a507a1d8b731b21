#include "runtime/depthwise/tile_kernels.h"

#include <algorithm>
#include <limits>
#include <optional>

#include <fmt/format.h>

#include "f32-eltwise/eltwise.h"
#include "f32-pool/pool.h"
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

// The channel planes of a tile seen by the row kernels: one "row" per channel, the tile's rows
// of that channel being contiguous in NCHW (kernels/f32-eltwise's RowOperand).
kernels::RowOperand plane_operand(const kernels::PlaneView& v, const TileArgs& args,
                                  int64_t width) {
  return {row_at(v, args.rows.begin, width), v.plane_stride, 1};
}

// An operand read on a tile: a view of input `input` (same shape as the output), or a constant
// scalar / per-channel vector.
struct Operand {
  int input = -1;  // index into TileArgs::inputs, or -1 for the constant
  const float* constant = nullptr;
  bool per_channel = false;

  kernels::RowOperand bind(const TileArgs& args, int64_t width) const {
    if (input >= 0) return plane_operand(args.inputs[static_cast<std::size_t>(input)], args, width);
    return {constant, per_channel ? 1 : 0, 0};
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
    o.per_channel = value_of(graph, v).constant->numel() > 1;
  }
  return o;
}

// A node's fused epilogue applied on the tile after its kernel, op by op, with the row kernels.
// Used where the kernel cannot fuse it (pooling, element-wise ops, unusual conv epilogues).
class TileEpilogue {
 public:
  TileEpilogue() = default;
  TileEpilogue(const graph::Graph& graph, const graph::Node& node, const plan::TileOp& op) {
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

  void apply(const TileArgs& args, int64_t channels, int64_t width) const {
    const int64_t n = args.rows.size() * width;
    float* out = row_at(args.output, args.rows.begin, width);
    const int64_t ld = args.output.plane_stride;
    for (const Step& s : steps_) {
      if (s.add) {
        kernels::binary_rows(kernels::BinaryKind::kAdd, {out, ld, 1}, s.add->bind(args, width), out,
                             ld, channels, n);
      } else {
        kernels::unary_rows(s.unary, out, ld, out, ld, channels, n, s.lo, s.hi);
      }
    }
  }

 private:
  struct Step {
    std::optional<Operand> add;  // set: Add this operand; else the activation below
    kernels::UnaryKind unary = kernels::UnaryKind::kRelu;
    float lo = 0.0f, hi = 0.0f;
  };
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
              constant_data(graph, node.input(2)), sparse_threshold) {
    // The bias is packed with the weight (the conv kernel adds it per output channel); an Add
    // fuses as the residual only when its operand is a same-shape tensor on the tile.
    const std::optional<FusedEpilogue> fused = fuse_epilogue(node, [&](int input) {
      AddOperandUse use;
      use.residual = op.inputs[static_cast<std::size_t>(input)].kind == RowMap::Kind::kSame;
      return use;
    });
    if (fused) {
      fused_ = *fused;
    } else {
      generic_ = TileEpilogue(graph, node, op);
    }
  }

  void run(const TileArgs& args) const override {
    const kernels::ConvGeometry& g = conv_.geometry();
    kernels::Epilogue ep = fused_.kernel;
    const kernels::PlaneView* residual = nullptr;
    if (fused_.residual_input >= 0) {
      residual = &args.inputs[static_cast<std::size_t>(fused_.residual_input)];
      ep.residual = residual->data;
      ep.residual_ld = g.out_w;
    }
    kernels::conv2d_rows(conv_, args.inputs[0], args.output, args.rows.begin, args.rows.end, ep,
                         residual, *args.scratch);
    generic_.apply(args, g.out_c, g.out_w);
  }
  std::string implementation() const override { return "conv " + conv_.implementation(); }

 private:
  kernels::PackedConv conv_;
  FusedEpilogue fused_;
  TileEpilogue generic_;  // empty when the kernel fuses the epilogue
};

// ---- Pooling ----

class PoolTile final : public TileKernel {
 public:
  PoolTile(const graph::Graph& graph, const graph::Node& node, const plan::TileOp& op)
      : kind_(pool_kind(node)),
        g_(pool_geometry(graph::parse_pool(graph, node, dims_of(graph, node.input(0))))),
        epilogue_(graph, node, op) {}

  void run(const TileArgs& args) const override {
    kernels::pool2d_rows(kind_, g_, args.inputs[0], args.output, args.rows.begin, args.rows.end,
                         *args.scratch);
    epilogue_.apply(args, g_.channels, g_.out_w);
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
      : channels_(op.channels), width_(op.width), epilogue_(graph, node, op) {
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
    const int64_t n = args.rows.size() * width_;
    float* out = row_at(args.output, args.rows.begin, width_);
    const int64_t ld = args.output.plane_stride;
    if (binary_) {
      kernels::binary_rows(*binary_, a_.bind(args, width_), b_.bind(args, width_), out, ld,
                           channels_, n);
    } else {
      const kernels::RowOperand src = plane_operand(args.inputs[0], args, width_);
      kernels::unary_rows(*unary_, src.data, src.row_stride, out, ld, channels_, n, lo_, hi_);
    }
    epilogue_.apply(args, channels_, width_);
  }
  std::string implementation() const override {
    return fmt::format("{}-{}-rows/{}", binary_ ? "binary" : "unary", name_,
                       kernels::to_string(kernels::active_isa()));
  }

 private:
  int64_t channels_, width_;
  std::optional<kernels::BinaryKind> binary_;
  std::optional<kernels::UnaryKind> unary_;
  Operand a_, b_;
  float lo_ = 0.0f, hi_ = 0.0f;
  std::string name_;
  TileEpilogue epilogue_;
};

}  // namespace

std::unique_ptr<TileKernel> make_tile_kernel(const graph::Graph& graph, const plan::TileOp& op,
                                             const Options& options) {
  const graph::Node& node = graph.nodes[static_cast<std::size_t>(op.node)];
  if (node.op_type == "Conv") {
    return std::make_unique<ConvTile>(graph, node, op, options.sparse_threshold);
  }
  if (node.op_type == "MaxPool" || node.op_type == "AveragePool") {
    return std::make_unique<PoolTile>(graph, node, op);
  }
  return std::make_unique<EltwiseTile>(graph, node, op);
}

}  // namespace sparsecol::runtime::depthwise
