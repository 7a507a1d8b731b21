// The nn reference ops are the oracle every fast kernel is tested against, so they are checked
// here against independent formulations: convolution as im2col + matrix product, pooling on
// explicitly padded inputs and on hand-checked values, normalizations and softmax by the
// statistics of their outputs, Gemm/MatMul against plain triple loops.
//
// Each test builds a one-node graph with constant inputs and runs it the way the executor
// does: shape inference (graph::find_op) then the reference op (runtime::find_reference_op).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <limits>
#include <numeric>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <omp.h>

#include "../test_util.h"
#include "graph/op_params.h"
#include "graph/ops.h"
#include "graph_builder.h"
#include "runtime/reference/reference_ops.h"

namespace sparsecol::testing {
namespace {

using Shape = std::vector<int64_t>;
using test::expect_error;
using Attrs = std::map<std::string, graph::AttrValue>;

// One node over constant inputs, run through inference and the reference op.
class OneNode {
 public:
  explicit OneNode(const std::string& op, int64_t opset = 17) {
    graph_.opset = opset;
    node_.name = std::string("n");  // not = "n": GCC 12 -Wrestrict false positive (PR 105651)
    node_.op_type = op;
  }

  OneNode& in(Tensor t) {
    const graph::Shape shape = graph::make_shape(t.shape());
    node_.inputs.push_back(graph_.add_value(
        {fmt::format("in{}", node_.inputs.size()), t.dtype(), true, shape, std::move(t), -1}));
    return *this;
  }
  OneNode& omitted() {
    node_.inputs.push_back(-1);
    return *this;
  }
  OneNode& attr(const std::string& key, graph::AttrValue value) {
    node_.attrs[key] = std::move(value);
    return *this;
  }
  OneNode& attrs(const Attrs& all) {
    for (const auto& [key, value] : all) node_.attrs[key] = value;
    return *this;
  }
  OneNode& outputs(int count) {
    output_count_ = count;
    return *this;
  }

  // The inferred output shapes.
  std::vector<Shape> infer() {
    graph::InferContext ctx = infer_context();
    std::vector<Shape> shapes;
    for (const auto& out : ctx.outputs()) shapes.push_back(out.shape);
    return shapes;
  }

  std::vector<Tensor> run() {
    graph::InferContext ctx = infer_context();
    std::vector<Tensor> outs;
    for (const auto& out : ctx.outputs()) {
      EXPECT_TRUE(out.set);
      outs.push_back(Tensor::zeros(out.dtype, out.shape));
    }
    runtime::RefOpContext ref{graph_, node_, {}, {}};
    for (int id : node_.inputs) {
      ref.inputs.push_back(id < 0 ? nullptr
                                  : &*graph_.values[static_cast<std::size_t>(id)].constant);
    }
    for (Tensor& t : outs) ref.outputs.push_back(&t);
    const runtime::RefOp* op = runtime::find_reference_op(node_.op_type);
    if (op == nullptr) throw std::runtime_error(fmt::format("no reference op {}", node_.op_type));
    op->run(ref);
    return outs;
  }

  Tensor run1() { return run().at(0); }

 private:
  graph::InferContext infer_context() {
    node_.outputs.clear();
    for (int i = 0; i < output_count_; ++i) {
      node_.outputs.push_back(graph_.add_value(
          {fmt::format("out{}", i), DType::kFloat32, false, std::nullopt, std::nullopt, -1}));
    }
    const graph::OpDef* def = graph::find_op(node_.op_type);
    if (def == nullptr) throw std::runtime_error(fmt::format("no op {}", node_.op_type));
    graph::InferContext ctx(graph_, node_);
    def->infer(ctx);
    return ctx;
  }

  graph::Graph graph_;
  graph::Node node_;
  int output_count_ = 1;
};

Tensor from_values(Shape shape, const std::vector<float>& values) {
  Tensor t = Tensor::zeros(DType::kFloat32, std::move(shape));
  EXPECT_EQ(static_cast<std::size_t>(t.numel()), values.size());
  std::copy(values.begin(), values.end(), t.data<float>());
  return t;
}

Tensor iota(Shape shape, float start = 0.0f) {
  Tensor t = Tensor::zeros(DType::kFloat32, std::move(shape));
  std::iota(t.data<float>(), t.data<float>() + t.numel(), start);
  return t;
}

std::vector<float> values(const Tensor& t) {
  return {t.data<float>(), t.data<float>() + t.numel()};
}

// Element-wise closeness relative to the magnitude of the expected value.
void expect_near(const Tensor& actual, const Tensor& expected, float tolerance = 1e-5f) {
  ASSERT_EQ(actual.shape(), expected.shape());
  for (int64_t i = 0; i < actual.numel(); ++i) {
    const float e = expected.data<float>()[i];
    if (actual.data<float>()[i] == e) continue;  // also equal infinities
    ASSERT_NEAR(actual.data<float>()[i], e, tolerance * (1.0f + std::fabs(e))) << "at " << i;
  }
}

int64_t numel(const Shape& shape) {
  return std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<>());
}

// Row-major strides of a shape.
Shape strides_of(const Shape& shape) {
  Shape strides(shape.size(), 1);
  for (std::size_t d = shape.size(); d-- > 1;) strides[d - 1] = strides[d] * shape[d];
  return strides;
}

using test::unravel;

// ---- Conv --------------------------------------------------------------------------------

struct ConvCase {
  int64_t batch, groups, ic_per_group, oc_per_group;
  Shape in, kernel, strides, dilations, pads;  // pads: begins then ends
  bool bias;
};

// Convolution written as im2col + matrix product: per (n, group), a column matrix of
// [ic_per_group * taps] x [output positions] gathered with explicit bounds checks, multiplied
// by the group's weight matrix [oc_per_group] x [ic_per_group * taps].
Tensor conv_im2col(const Tensor& x, const Tensor& w, const Tensor* b, const ConvCase& c,
                   const Shape& out) {
  const std::size_t rank = c.in.size();
  const int64_t taps = numel(c.kernel), positions = numel(out);
  const int64_t rows = c.ic_per_group * taps;
  const int64_t in_channels = c.groups * c.ic_per_group, out_channels = c.groups * c.oc_per_group;
  Shape y_shape = {c.batch, out_channels};
  y_shape.insert(y_shape.end(), out.begin(), out.end());
  Tensor y = Tensor::zeros(DType::kFloat32, y_shape);
  const Shape in_strides = strides_of(c.in);
  std::vector<double> cols(static_cast<std::size_t>(rows * positions));
  for (int64_t n = 0; n < c.batch; ++n) {
    for (int64_t g = 0; g < c.groups; ++g) {
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t ic = r / taps;
        const Shape tap = unravel(r % taps, c.kernel);
        const float* plane =
            x.data<float>() + (n * in_channels + g * c.ic_per_group + ic) * numel(c.in);
        for (int64_t p = 0; p < positions; ++p) {
          const Shape o = unravel(p, out);
          int64_t offset = 0;
          bool inside = true;
          for (std::size_t d = 0; d < rank; ++d) {
            const int64_t i = o[d] * c.strides[d] - c.pads[d] + tap[d] * c.dilations[d];
            inside = inside && i >= 0 && i < c.in[d];
            offset += i * in_strides[d];
          }
          cols[static_cast<std::size_t>(r * positions + p)] = inside ? plane[offset] : 0.0;
        }
      }
      for (int64_t m = 0; m < c.oc_per_group; ++m) {
        const int64_t oc = g * c.oc_per_group + m;
        const float* w_row = w.data<float>() + oc * rows;
        for (int64_t p = 0; p < positions; ++p) {
          double sum = b != nullptr ? b->data<float>()[oc] : 0.0;
          for (int64_t r = 0; r < rows; ++r) {
            sum += w_row[r] * cols[static_cast<std::size_t>(r * positions + p)];
          }
          y.data<float>()[(n * out_channels + oc) * positions + p] = static_cast<float>(sum);
        }
      }
    }
  }
  return y;
}

// Output size straight from the ONNX Conv formula.
Shape conv_out_size(const ConvCase& c) {
  Shape out;
  for (std::size_t d = 0; d < c.in.size(); ++d) {
    const int64_t extent = (c.kernel[d] - 1) * c.dilations[d] + 1;
    out.push_back((c.in[d] + c.pads[d] + c.pads[d + c.in.size()] - extent) / c.strides[d] + 1);
  }
  return out;
}

ConvCase random_conv_case(std::mt19937& rng, std::size_t rank) {
  auto pick = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  ConvCase c;
  c.batch = pick(1, 2);
  c.groups = pick(1, 3);
  c.ic_per_group = pick(1, 3);
  c.oc_per_group = pick(1, 3);
  c.bias = pick(0, 1) == 1;
  for (std::size_t d = 0; d < rank; ++d) {
    c.kernel.push_back(pick(1, 3));
    c.strides.push_back(pick(1, 3));
    c.dilations.push_back(pick(1, 2));
  }
  for (std::size_t d = 0; d < 2 * rank; ++d) c.pads.push_back(pick(0, 2));
  for (std::size_t d = 0; d < rank; ++d) {
    const int64_t extent = (c.kernel[d] - 1) * c.dilations[d] + 1;
    // At least one output position: in + pads >= extent.
    const int64_t min_in = std::max<int64_t>(1, extent - c.pads[d] - c.pads[d + rank]);
    c.in.push_back(pick(min_in, min_in + (rank == 3 ? 3 : 7)));
  }
  return c;
}

class ConvRandomized : public ::testing::TestWithParam<std::size_t> {};

TEST_P(ConvRandomized, MatchesIm2colMatmul) {
  const std::size_t rank = GetParam();
  std::mt19937 rng(1234 + static_cast<uint32_t>(rank));
  for (int trial = 0; trial < 60; ++trial) {
    const ConvCase c = random_conv_case(rng, rank);
    Shape x_shape = {c.batch, c.groups * c.ic_per_group};
    x_shape.insert(x_shape.end(), c.in.begin(), c.in.end());
    Shape w_shape = {c.groups * c.oc_per_group, c.ic_per_group};
    w_shape.insert(w_shape.end(), c.kernel.begin(), c.kernel.end());
    const uint32_t seed = static_cast<uint32_t>(trial) * 3;
    const Tensor x = random_tensor(x_shape, seed);
    const Tensor w = random_tensor(w_shape, seed + 1);
    const Tensor b = random_tensor({c.groups * c.oc_per_group}, seed + 2);
    OneNode node("Conv");
    node.in(x).in(w);
    if (c.bias) node.in(b);
    node.attr("strides", c.strides).attr("dilations", c.dilations).attr("pads", c.pads);
    node.attr("group", c.groups);
    if (trial % 2 == 0) node.attr("kernel_shape", c.kernel);
    const Tensor y = node.run1();
    SCOPED_TRACE(::testing::Message()
                 << "trial " << trial << " x " << x_shape.size() << "-d, group " << c.groups);
    expect_near(y, conv_im2col(x, w, c.bias ? &b : nullptr, c, conv_out_size(c)));
  }
}

INSTANTIATE_TEST_SUITE_P(SpatialRank, ConvRandomized, ::testing::Values(1, 2, 3));

// ---- ConvTranspose ----

double dot(const Tensor& a, const Tensor& b) {
  double sum = 0.0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    sum += static_cast<double>(a.data<float>()[i]) * static_cast<double>(b.data<float>()[i]);
  }
  return sum;
}

class ConvTransposeRandomized : public ::testing::TestWithParam<std::size_t> {};

// A transposed convolution is the adjoint of the convolution with the same weight, strides,
// pads, dilations and groups (W [C, M / group, kernel...] is Conv's [out, in / group, kernel...]
// from M channels to C): <conv_transpose(x), z> == <x, conv(z)> for every x and z. With
// output_padding below the stride, conv maps the transposed output's size back onto x's.
TEST_P(ConvTransposeRandomized, IsTheAdjointOfConv) {
  const std::size_t rank = GetParam();
  std::mt19937 rng(4321 + static_cast<uint32_t>(rank));
  int checked = 0;
  for (int trial = 0; trial < 40; ++trial) {
    ConvCase c = random_conv_case(rng, rank);
    Shape output_padding, out;
    for (std::size_t d = 0; d < rank; ++d) {
      c.in[d] = std::uniform_int_distribution<int64_t>(1, rank == 3 ? 3 : 5)(rng);
      output_padding.push_back(std::uniform_int_distribution<int64_t>(0, c.strides[d] - 1)(rng));
      const int64_t extent = (c.kernel[d] - 1) * c.dilations[d] + 1;
      out.push_back(c.strides[d] * (c.in[d] - 1) + output_padding[d] + extent - c.pads[d] -
                    c.pads[d + rank]);
    }
    if (*std::min_element(out.begin(), out.end()) < 1) continue;  // padded away entirely
    Shape x_shape = {c.batch, c.groups * c.ic_per_group};
    x_shape.insert(x_shape.end(), c.in.begin(), c.in.end());
    Shape w_shape = {c.groups * c.ic_per_group, c.oc_per_group};
    w_shape.insert(w_shape.end(), c.kernel.begin(), c.kernel.end());
    Shape y_shape = {c.batch, c.groups * c.oc_per_group};
    y_shape.insert(y_shape.end(), out.begin(), out.end());
    const uint32_t seed = static_cast<uint32_t>(trial) * 3;
    const Tensor x = random_tensor(x_shape, seed);
    const Tensor w = random_tensor(w_shape, seed + 1);
    const Tensor z = random_tensor(y_shape, seed + 2);
    const Attrs attrs = {
        {"strides", c.strides}, {"dilations", c.dilations}, {"pads", c.pads}, {"group", c.groups}};
    const Tensor y = OneNode("ConvTranspose")
                         .in(x)
                         .in(w)
                         .attrs(attrs)
                         .attr("output_padding", output_padding)
                         .run1();
    SCOPED_TRACE(::testing::Message()
                 << "trial " << trial << " x " << x_shape.size() << "-d, group " << c.groups);
    ASSERT_EQ(y.shape(), y_shape);
    const Tensor back = OneNode("Conv").in(z).in(w).attrs(attrs).run1();
    ASSERT_EQ(back.shape(), x_shape);
    const double lhs = dot(y, z), rhs = dot(x, back);
    EXPECT_NEAR(lhs, rhs, 1e-5 * (1.0 + std::abs(rhs)));
    ++checked;
  }
  EXPECT_GE(checked, 20) << "most trials padded their output away";
}

INSTANTIATE_TEST_SUITE_P(SpatialRank, ConvTransposeRandomized, ::testing::Values(1, 2, 3));

// x = [1, 2, 3], W = [1, 1], stride 2: each input element writes two outputs, [1 1 2 2 3 3].
TEST(ConvTranspose, PadsOutputShapeAutoPadAndBiasPlaceTheOutput) {
  const Tensor x = from_values({1, 1, 3}, {1, 2, 3});
  const Tensor w = from_values({1, 1, 2}, {1, 1});
  const Tensor b = from_values({1}, {10});
  const auto run = [&](const Attrs& attrs, bool bias = false) {
    OneNode node("ConvTranspose");
    node.in(x).in(w).attr("strides", Shape{2}).attrs(attrs);
    if (bias) node.in(b);
    return values(node.run1());
  };
  EXPECT_EQ(run({}), (std::vector<float>{1, 1, 2, 2, 3, 3}));
  EXPECT_EQ(run({}, true), (std::vector<float>{11, 11, 12, 12, 13, 13}));
  EXPECT_EQ(run({{"pads", Shape{1, 0}}}), (std::vector<float>{1, 2, 2, 3, 3}));
  EXPECT_EQ(run({{"output_padding", Shape{1}}}), (std::vector<float>{1, 1, 2, 2, 3, 3, 0}));
  // output_shape beyond the 6 the input gives: ONNX's padding formula, rounding down, puts the
  // first extra element at the end, the second at the beginning.
  EXPECT_EQ(run({{"output_shape", Shape{7}}}), (std::vector<float>{1, 1, 2, 2, 3, 3, 0}));
  EXPECT_EQ(run({{"output_shape", Shape{8}}}, true),
            (std::vector<float>{10, 11, 11, 12, 12, 13, 13, 10}));
  EXPECT_EQ(run({{"output_shape", Shape{4}}}), (std::vector<float>{1, 2, 2, 3}));
  EXPECT_EQ(run({{"auto_pad", std::string("SAME_UPPER")}}), (std::vector<float>{1, 1, 2, 2, 3, 3}));
}

TEST(ConvTranspose, ShapeErrorsNameExpectedAndActual) {
  const Tensor x = random_tensor({1, 4, 5, 5}, 1);
  // Inference of ConvTranspose on x with a weight of `w_shape`, the attributes and a bias.
  const auto infer = [&](const Shape& w_shape, const Attrs& attrs, const Tensor* bias = nullptr) {
    return [&, w_shape, attrs, bias] {
      OneNode node("ConvTranspose");
      node.in(x).in(random_tensor(w_shape, 2)).attrs(attrs);
      if (bias != nullptr) node.in(*bias);
      node.infer();
    };
  };
  expect_error(infer({3, 2, 3, 3}, {}), ErrorCode::kShapeMismatch,
               {"node 'n' (ConvTranspose)", "has 4 channels", "W [3, 2, 3, 3]", "W.shape[0]"});
  const Tensor bias = random_tensor({3}, 3);
  expect_error(infer({4, 2, 3, 3}, {{"group", int64_t{2}}}, &bias), ErrorCode::kShapeMismatch,
               {"bias B must be [4]"});
  expect_error(infer({4, 2, 3, 3}, {{"strides", Shape{2, 2}}, {"output_padding", Shape{2, 0}}}),
               ErrorCode::kInvalidModel, {"output_padding = [2, 0]", "less than the stride"});
  expect_error(infer({4, 2, 3, 3}, {{"output_shape", Shape{9}}}), ErrorCode::kInvalidModel,
               {"output_shape = [9]", "one value per spatial dimension"});
  expect_error(infer({4, 2, 3, 3}, {{"pads", Shape{4, 0, 4, 0}}}), ErrorCode::kShapeMismatch,
               {"spatial dimension 0", "pads 4 + 4 exceed the 7 elements"});
}

TEST(Conv, DepthwiseMatchesPerChannelConvolution) {
  // Depthwise (group == channels) equals running each channel as its own 1-channel conv.
  const int64_t channels = 5;
  const Tensor x = random_tensor({2, channels, 7, 6}, 11);
  const Tensor w = random_tensor({channels, 1, 3, 3}, 12);
  const Attrs attrs = {{"pads", Shape{1, 1, 1, 1}}, {"strides", Shape{2, 1}}};
  const Tensor y = OneNode("Conv").in(x).in(w).attrs(attrs).attr("group", channels).run1();
  ASSERT_EQ(y.shape(), (Shape{2, channels, 4, 6}));
  for (int64_t n = 0; n < 2; ++n) {
    for (int64_t c = 0; c < channels; ++c) {
      Tensor xc = Tensor::zeros(DType::kFloat32, {1, 1, 7, 6});
      std::copy_n(x.data<float>() + (n * channels + c) * 42, 42, xc.data<float>());
      Tensor wc = Tensor::zeros(DType::kFloat32, {1, 1, 3, 3});
      std::copy_n(w.data<float>() + c * 9, 9, wc.data<float>());
      const Tensor yc = OneNode("Conv").in(xc).in(wc).attrs(attrs).run1();
      for (int64_t i = 0; i < 24; ++i) {
        EXPECT_FLOAT_EQ(y.data<float>()[(n * channels + c) * 24 + i], yc.data<float>()[i]);
      }
    }
  }
}

TEST(Conv, AutoPadSameGivesCeilOutputAndPutsOddPadWhereAsked) {
  const Tensor x = random_tensor({1, 2, 7, 8}, 21);
  const Tensor w = random_tensor({3, 2, 4, 3}, 22);  // even kernel height: odd total pad
  for (const std::string mode : {"SAME_UPPER", "SAME_LOWER"}) {
    const Tensor same =
        OneNode("Conv").in(x).in(w).attr("auto_pad", mode).attr("strides", Shape{2, 3}).run1();
    // ceil(7 / 2) = 4, ceil(8 / 3) = 3; total pads (4-1)*2+4-7 = 3 and (3-1)*3+3-8 = 1.
    ASSERT_EQ(same.shape(), (Shape{1, 3, 4, 3}));
    const Shape pads = mode == "SAME_UPPER" ? Shape{1, 0, 2, 1} : Shape{2, 1, 1, 0};
    const Tensor explicit_pads =
        OneNode("Conv").in(x).in(w).attr("pads", pads).attr("strides", Shape{2, 3}).run1();
    expect_near(same, explicit_pads, 0.0f);
  }
  const Tensor valid = OneNode("Conv").in(x).in(w).attr("auto_pad", std::string("VALID")).run1();
  EXPECT_EQ(valid.shape(), (Shape{1, 3, 4, 6}));
}

TEST(Conv, ShapeErrorsNameExpectedAndActual) {
  const Tensor x = random_tensor({1, 4, 5, 5}, 1);
  expect_error(
      [&] {
        OneNode("Conv").in(x).in(random_tensor({2, 3, 3, 3}, 2)).infer();
      },
      ErrorCode::kShapeMismatch,
      {"node 'n' (Conv)", "has 4 channels", "W [2, 3, 3, 3] with group 1"});
  expect_error(
      [&] {
        OneNode("Conv").in(x).in(random_tensor({3, 2, 3, 3}, 2)).attr("group", int64_t{2}).infer();
      },
      ErrorCode::kShapeMismatch, {"3 output channels", "group 2"});
  expect_error(
      [&] {
        OneNode("Conv")
            .in(x)
            .in(random_tensor({2, 4, 3, 3}, 2))
            .attr("kernel_shape", Shape{3, 2})
            .infer();
      },
      ErrorCode::kShapeMismatch, {"kernel_shape = [3, 2]", "[2, 4, 3, 3]"});
  expect_error(
      [&] {
        OneNode("Conv")
            .in(x)
            .in(random_tensor({2, 4, 3, 3}, 2))
            .attr("strides", Shape{1, 0})
            .infer();
      },
      ErrorCode::kInvalidModel, {"strides"});
  expect_error(
      [&] {
        OneNode("Conv").in(x).in(random_tensor({2, 4, 3, 3}, 2)).attr("pads", Shape{1, 1}).infer();
      },
      ErrorCode::kInvalidModel, {"pads", "4 values"});
  expect_error(
      [&] {
        OneNode("Conv").in(x).in(random_tensor({2, 4, 7, 7}, 2)).infer();
      },
      ErrorCode::kShapeMismatch, {"smaller than the dilated kernel"});
  expect_error(
      [&] {
        OneNode("Conv").in(x).in(random_tensor({2, 4, 3, 3}, 2)).in(random_tensor({3}, 3)).infer();
      },
      ErrorCode::kShapeMismatch, {"bias B must be [2]", "[3]"});
  expect_error(
      [&] {
        OneNode("Conv").in(random_tensor({1, 4}, 1)).in(x).infer();
      },
      ErrorCode::kShapeMismatch, {"[1, 4]"});
  expect_error(
      [&] {
        OneNode("Conv")
            .in(Tensor::zeros(DType::kFloat64, {1, 4, 5, 5}))
            .in(random_tensor({2, 4, 3, 3}, 2))
            .infer();
      },
      ErrorCode::kUnsupported, {"float64"});
}

// ---- Pooling -----------------------------------------------------------------------------

// Pools by padding the input explicitly (with -inf for max, 0 for average) into a larger
// buffer and sliding a window with no bounds checks; `ones` pads a mask of ones instead, whose
// window sums are the divisors of count_include_pad = 0. 2-D only.
Tensor pool_padded(const Tensor& x, Shape kernel, Shape strides, Shape pads, Shape dilations,
                   bool max, bool count_include_pad, Shape out) {
  const int64_t n_c = x.dim(0) * x.dim(1), h = x.dim(2), w = x.dim(3);
  // Room for windows that run past pad_end (ceil_mode) too.
  const int64_t ph = (out[0] - 1) * strides[0] + (kernel[0] - 1) * dilations[0] + 1;
  const int64_t pw = (out[1] - 1) * strides[1] + (kernel[1] - 1) * dilations[1] + 1;
  const int64_t hp = std::max(ph, pads[0] + h + pads[2]), wp = std::max(pw, pads[1] + w + pads[3]);
  const float fill = max ? -std::numeric_limits<float>::infinity() : 0.0f;
  Tensor y = Tensor::zeros(DType::kFloat32, {x.dim(0), x.dim(1), out[0], out[1]});
  for (int64_t p = 0; p < n_c; ++p) {
    std::vector<float> padded(static_cast<std::size_t>(hp * wp), fill);
    std::vector<float> counted(padded.size(), 0.0f);  // 1 where a tap counts in the divisor
    for (int64_t i = 0; i < hp; ++i) {
      for (int64_t j = 0; j < wp; ++j) {
        const bool in_pads = i < pads[0] + h + pads[2] && j < pads[1] + w + pads[3];
        const bool in_x = i >= pads[0] && i < pads[0] + h && j >= pads[1] && j < pads[1] + w;
        counted[static_cast<std::size_t>(i * wp + j)] = (count_include_pad ? in_pads : in_x);
        if (in_x) {
          padded[static_cast<std::size_t>(i * wp + j)] =
              x.data<float>()[(p * h + i - pads[0]) * w + j - pads[1]];
        }
      }
    }
    for (int64_t oh = 0; oh < out[0]; ++oh) {
      for (int64_t ow = 0; ow < out[1]; ++ow) {
        double acc = max ? -std::numeric_limits<double>::infinity() : 0.0, count = 0.0;
        for (int64_t kh = 0; kh < kernel[0]; ++kh) {
          for (int64_t kw = 0; kw < kernel[1]; ++kw) {
            const auto at = static_cast<std::size_t>((oh * strides[0] + kh * dilations[0]) * wp +
                                                     ow * strides[1] + kw * dilations[1]);
            acc = max ? std::max<double>(acc, padded[at]) : acc + padded[at];
            count += counted[at];
          }
        }
        y.data<float>()[(p * out[0] + oh) * out[1] + ow] =
            static_cast<float>(max ? acc : acc / count);
      }
    }
  }
  return y;
}

TEST(Pool, RandomizedMatchesExplicitlyPaddedInput) {
  std::mt19937 rng(77);
  auto pick = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  for (int trial = 0; trial < 80; ++trial) {
    const bool max = trial % 2 == 0;
    const bool ceil_mode = pick(0, 1) == 1, include_pad = pick(0, 1) == 1;
    Shape kernel = {pick(1, 3), pick(1, 3)}, strides = {pick(1, 3), pick(1, 3)};
    Shape dilations = max ? Shape{pick(1, 2), pick(1, 2)} : Shape{1, 1};
    Shape pads;  // pads smaller than the kernel, as ONNX requires
    for (int d = 0; d < 4; ++d) pads.push_back(pick(0, kernel[d % 2] - 1));
    Shape in, out;
    for (int d = 0; d < 2; ++d) {
      const int64_t extent = (kernel[d] - 1) * dilations[d] + 1;
      in.push_back(std::max<int64_t>(1, extent - pads[d] - pads[d + 2]) + pick(0, 6));
      const int64_t span = in[d] + pads[d] + pads[d + 2] - extent;
      int64_t o = (ceil_mode ? (span + strides[d] - 1) / strides[d] : span / strides[d]) + 1;
      // A last window starting in the end padding is dropped.
      if ((o - 1) * strides[d] >= in[d] + pads[d]) --o;
      out.push_back(o);
    }
    const Tensor x = random_tensor({2, 3, in[0], in[1]}, static_cast<uint32_t>(trial));
    OneNode node(max ? "MaxPool" : "AveragePool");
    node.in(x).attr("kernel_shape", kernel).attr("strides", strides).attr("pads", pads);
    node.attr("ceil_mode", int64_t{ceil_mode});
    if (max) node.attr("dilations", dilations);
    if (!max) node.attr("count_include_pad", int64_t{include_pad});
    SCOPED_TRACE(::testing::Message() << "trial " << trial);
    expect_near(node.run1(),
                pool_padded(x, kernel, strides, pads, dilations, max, include_pad, out));
  }
}

TEST(Pool, HandCheckedValues) {
  const Tensor x = iota({1, 1, 4, 4}, 1.0f);  // 1..16, row-major
  const Attrs k3s2ceil = {
      {"kernel_shape", Shape{3, 3}}, {"strides", Shape{2, 2}}, {"ceil_mode", int64_t{1}}};
  // Windows rows/cols {0..2} and {2..3}.
  EXPECT_EQ(values(OneNode("MaxPool").in(x).attrs(k3s2ceil).run1()),
            (std::vector<float>{11, 12, 15, 16}));
  EXPECT_EQ(values(OneNode("AveragePool").in(x).attrs(k3s2ceil).run1()),
            (std::vector<float>{6, 7.5, 12, 13.5}));
  // Dilation 2: taps at rows/cols {0, 2} or {1, 3}.
  EXPECT_EQ(values(OneNode("MaxPool")
                       .in(x)
                       .attr("kernel_shape", Shape{2, 2})
                       .attr("dilations", Shape{2, 2})
                       .run1()),
            (std::vector<float>{11, 12, 15, 16}));
  // All ones with pad 1 and a 3x3 window: the corner window holds 4 real values out of 9.
  const Tensor ones = from_values({1, 1, 2, 2}, {1, 1, 1, 1});
  const Attrs k3p1 = {{"kernel_shape", Shape{3, 3}}, {"pads", Shape{1, 1, 1, 1}}};
  EXPECT_EQ(values(OneNode("AveragePool").in(ones).attrs(k3p1).run1()),
            (std::vector<float>{1, 1, 1, 1}));
  expect_near(
      OneNode("AveragePool").in(ones).attrs(k3p1).attr("count_include_pad", int64_t{1}).run1(),
      from_values({1, 1, 2, 2}, {4 / 9.f, 4 / 9.f, 4 / 9.f, 4 / 9.f}));
  // Padding never wins a max, even against negative values.
  const Tensor negative = from_values({1, 1, 2, 2}, {-4, -3, -2, -1});
  EXPECT_EQ(values(OneNode("MaxPool").in(negative).attrs(k3p1).run1()),
            (std::vector<float>{-1, -1, -1, -1}));
}

TEST(Pool, OneAndThreeDimensions) {
  const Tensor x1 = from_values({1, 1, 5}, {3, 1, 4, 1, 5});
  EXPECT_EQ(values(OneNode("MaxPool").in(x1).attr("kernel_shape", Shape{2}).run1()),
            (std::vector<float>{3, 4, 4, 5}));
  EXPECT_EQ(values(OneNode("AveragePool")
                       .in(x1)
                       .attr("kernel_shape", Shape{3})
                       .attr("strides", Shape{2})
                       .run1()),
            (std::vector<float>{8 / 3.f, 10 / 3.f}));
  // 3-D: a 2x2x2 max over 0..26 laid out 3x3x3 picks the far corner of each window.
  const Tensor x3 = iota({1, 1, 3, 3, 3});
  EXPECT_EQ(values(OneNode("MaxPool").in(x3).attr("kernel_shape", Shape{2, 2, 2}).run1()),
            (std::vector<float>{13, 14, 16, 17, 22, 23, 25, 26}));
}

TEST(Pool, CeilModeDropsWindowStartingInEndPadding) {
  // in 4, kernel 2, stride 2, pad_end 1: ceil((4 + 1 - 2) / 2) + 1 = 3 windows, but the third
  // would start at 4, inside the padding, and is dropped.
  const Tensor x = iota({1, 1, 1, 4});
  EXPECT_EQ(OneNode("MaxPool")
                .in(x)
                .attr("kernel_shape", Shape{1, 2})
                .attr("strides", Shape{1, 2})
                .attr("pads", Shape{0, 0, 0, 1})
                .attr("ceil_mode", int64_t{1})
                .infer()[0],
            (Shape{1, 1, 1, 2}));
}

TEST(Pool, SameLowerPadsAtTheBeginning) {
  const Tensor x = iota({1, 1, 1, 3});  // 0 1 2
  // kernel 2, stride 1: one pad, at the start for SAME_LOWER, at the end for SAME_UPPER.
  EXPECT_EQ(values(OneNode("MaxPool")
                       .in(x)
                       .attr("kernel_shape", Shape{1, 2})
                       .attr("auto_pad", std::string("SAME_LOWER"))
                       .run1()),
            (std::vector<float>{0, 1, 2}));
  EXPECT_EQ(values(OneNode("AveragePool")
                       .in(x)
                       .attr("kernel_shape", Shape{1, 2})
                       .attr("auto_pad", std::string("SAME_UPPER"))
                       .run1()),
            (std::vector<float>{0.5, 1.5, 2}));
}

TEST(Pool, GlobalPoolsReduceEachPlane) {
  const Tensor x = random_tensor({2, 3, 4, 5}, 5);
  const Tensor avg = OneNode("GlobalAveragePool").in(x).run1();
  const Tensor max = OneNode("GlobalMaxPool").in(x).run1();
  ASSERT_EQ(avg.shape(), (Shape{2, 3, 1, 1}));
  ASSERT_EQ(max.shape(), (Shape{2, 3, 1, 1}));
  for (int64_t p = 0; p < 6; ++p) {
    const float* plane = x.data<float>() + p * 20;
    EXPECT_NEAR(avg.data<float>()[p], std::accumulate(plane, plane + 20, 0.0) / 20, 1e-6);
    EXPECT_EQ(max.data<float>()[p], *std::max_element(plane, plane + 20));
  }
}

TEST(Pool, Errors) {
  const Tensor x = random_tensor({1, 2, 5, 5}, 1);
  expect_error([&] { OneNode("MaxPool").in(x).infer(); }, ErrorCode::kInvalidModel,
               {"kernel_shape is required"});
  expect_error([&] { OneNode("MaxPool").in(x).attr("kernel_shape", Shape{2}).infer(); },
               ErrorCode::kInvalidModel, {"kernel_shape", "2 values"});
  expect_error(
      [&] {
        OneNode("MaxPool").in(x).attr("kernel_shape", Shape{2, 2}).outputs(2).infer();
      },
      ErrorCode::kUnsupported, {"Indices"});
  expect_error(
      [&] {
        OneNode("AveragePool")
            .in(x)
            .attr("kernel_shape", Shape{2, 2})
            .attr("auto_pad", std::string("SAME"))
            .infer();
      },
      ErrorCode::kInvalidModel, {"auto_pad = 'SAME'"});
}

// ---- Normalizations ----------------------------------------------------------------------

struct Stats {
  double mean = 0.0, var = 0.0;
};

Stats stats(const float* x, int64_t count, int64_t stride = 1) {
  Stats s;
  for (int64_t i = 0; i < count; ++i) s.mean += x[i * stride];
  s.mean /= static_cast<double>(count);
  for (int64_t i = 0; i < count; ++i) s.var += std::pow(x[i * stride] - s.mean, 2);
  s.var /= static_cast<double>(count);
  return s;
}

TEST(LayerNormalization, RowsHaveZeroMeanUnitVarianceBeforeAffine) {
  const Tensor x = random_tensor({2, 3, 8}, 31, -3.0f, 5.0f);
  const float eps = 1e-5f;
  const Tensor ones = from_values({8}, std::vector<float>(8, 1.0f));
  const std::vector<Tensor> out =
      OneNode("LayerNormalization").in(x).in(ones).attr("epsilon", eps).outputs(3).run();
  ASSERT_EQ(out[1].shape(), (Shape{2, 3, 1}));
  for (int64_t row = 0; row < 6; ++row) {
    const Stats in = stats(x.data<float>() + row * 8, 8);
    const Stats s = stats(out[0].data<float>() + row * 8, 8);
    EXPECT_NEAR(s.mean, 0.0, 1e-6);
    EXPECT_NEAR(s.var, in.var / (in.var + eps), 1e-5);
    EXPECT_NEAR(out[1].data<float>()[row], in.mean, 1e-5);
    EXPECT_NEAR(out[2].data<float>()[row], 1 / std::sqrt(in.var + eps), 1e-4);
  }
}

TEST(LayerNormalization, AxisAndBroadcastScaleApplyAffineAfterNormalizing) {
  // axis 1 of [2, 3, 4]: each batch row of 12 values is normalized; scale [4] and bias [3, 1]
  // broadcast over the normalized shape [3, 4].
  const Tensor x = random_tensor({2, 3, 4}, 32);
  const Tensor scale = random_tensor({4}, 33, 0.5f, 2.0f);
  const Tensor bias = random_tensor({3, 1}, 34);
  const Tensor plain = OneNode("LayerNormalization")
                           .in(x)
                           .in(from_values({1}, {1.0f}))
                           .attr("axis", int64_t{1})
                           .run1();
  const Tensor affine =
      OneNode("LayerNormalization").in(x).in(scale).in(bias).attr("axis", int64_t{-2}).run1();
  for (int64_t i = 0; i < 24; ++i) {
    const float s = scale.data<float>()[i % 4], b = bias.data<float>()[(i / 4) % 3];
    EXPECT_NEAR(affine.data<float>()[i], plain.data<float>()[i] * s + b, 1e-5) << i;
  }
  for (int64_t n = 0; n < 2; ++n)
    EXPECT_NEAR(stats(plain.data<float>() + n * 12, 12).mean, 0, 1e-6);
  expect_error([&] { OneNode("LayerNormalization").in(x).in(random_tensor({3}, 1)).infer(); },
               ErrorCode::kShapeMismatch, {"Scale [3]", "normalized shape [4]"});
}

TEST(BatchNormalization, BatchStatisticsNormalizeEachChannel) {
  // Feeding the batch's own per-channel mean and variance must give each channel mean 0 and
  // variance var / (var + eps); then scale and bias shift and stretch it.
  const int64_t n = 3, c = 4, hw = 10;
  const Tensor x = random_tensor({n, c, 2, 5}, 41, -2.0f, 4.0f);
  std::vector<float> mean(c), var(c);
  for (int64_t ch = 0; ch < c; ++ch) {
    std::vector<float> all;
    for (int64_t b = 0; b < n; ++b) {
      all.insert(all.end(), x.data<float>() + (b * c + ch) * hw,
                 x.data<float>() + (b * c + ch + 1) * hw);
    }
    const Stats s = stats(all.data(), n * hw);
    mean[ch] = static_cast<float>(s.mean);
    var[ch] = static_cast<float>(s.var);
  }
  const Tensor scale = random_tensor({c}, 42, 0.5f, 2.0f), bias = random_tensor({c}, 43);
  const float eps = 1e-3f;
  const Tensor y = OneNode("BatchNormalization")
                       .in(x)
                       .in(scale)
                       .in(bias)
                       .in(from_values({c}, mean))
                       .in(from_values({c}, var))
                       .attr("epsilon", eps)
                       .run1();
  for (int64_t ch = 0; ch < c; ++ch) {
    std::vector<float> all;
    for (int64_t b = 0; b < n; ++b) {
      all.insert(all.end(), y.data<float>() + (b * c + ch) * hw,
                 y.data<float>() + (b * c + ch + 1) * hw);
    }
    const Stats s = stats(all.data(), n * hw);
    const double g = scale.data<float>()[ch];
    EXPECT_NEAR(s.mean, bias.data<float>()[ch], 1e-5);
    EXPECT_NEAR(s.var, g * g * var[ch] / (var[ch] + eps), 1e-4);
  }
  expect_error(
      [&] {
        OneNode("BatchNormalization")
            .in(x)
            .in(scale)
            .in(bias)
            .in(from_values({c}, mean))
            .in(from_values({c}, var))
            .attr("training_mode", int64_t{1})
            .infer();
      },
      ErrorCode::kUnsupported, {"training_mode"});
  expect_error(
      [&] {
        OneNode("BatchNormalization")
            .in(x)
            .in(random_tensor({3}, 1))
            .in(bias)
            .in(from_values({c}, mean))
            .in(from_values({c}, var))
            .infer();
      },
      ErrorCode::kShapeMismatch, {"scale must be [4]", "[3]"});
}

TEST(InstanceNormalization, EachPlaneGetsScaleAsStdAndBiasAsMean) {
  const Tensor x = random_tensor({2, 3, 4, 4}, 51, -1.0f, 3.0f);
  const Tensor scale = random_tensor({3}, 52, 0.5f, 2.0f), bias = random_tensor({3}, 53);
  const Tensor y =
      OneNode("InstanceNormalization").in(x).in(scale).in(bias).attr("epsilon", 1e-7f).run1();
  for (int64_t p = 0; p < 6; ++p) {
    const Stats s = stats(y.data<float>() + p * 16, 16);
    EXPECT_NEAR(s.mean, bias.data<float>()[p % 3], 1e-5);
    EXPECT_NEAR(std::sqrt(s.var), scale.data<float>()[p % 3], 1e-4);
  }
}

TEST(Lrn, MatchesDefinitionOnChannelWindows) {
  const Tensor x = random_tensor({1, 5, 2, 1}, 61);
  const float alpha = 0.2f, beta = 0.6f, bias = 1.5f;
  // size 4: channels [c - 1, c + 2] (floor and ceil of 3 / 2).
  const Tensor y = OneNode("LRN")
                       .in(x)
                       .attr("size", int64_t{4})
                       .attr("alpha", alpha)
                       .attr("beta", beta)
                       .attr("bias", bias)
                       .run1();
  for (int64_t c = 0; c < 5; ++c) {
    for (int64_t i = 0; i < 2; ++i) {
      double squares = 0.0;
      for (int64_t j = c - 1; j <= c + 2; ++j) {
        if (j >= 0 && j < 5) squares += std::pow(x.data<float>()[j * 2 + i], 2);
      }
      const double expected =
          x.data<float>()[c * 2 + i] / std::pow(bias + alpha / 4 * squares, beta);
      EXPECT_NEAR(y.data<float>()[c * 2 + i], expected, 1e-6);
    }
  }
}

// ---- Softmax -----------------------------------------------------------------------------

TEST(Softmax, LinesSumToOneAndIgnoreAnAddedConstant) {
  const Tensor x = random_tensor({2, 3, 4}, 71, -5.0f, 5.0f);
  Tensor shifted = x.clone();
  for (int64_t i = 0; i < shifted.numel(); ++i) shifted.data<float>()[i] += 100.0f;
  for (int64_t axis : {0, 1, 2, -1}) {
    const Tensor y = OneNode("Softmax", 13).in(x).attr("axis", axis).run1();
    const Tensor y_shifted = OneNode("Softmax", 13).in(shifted).attr("axis", axis).run1();
    expect_near(y_shifted, y, 1e-5f);
    // Sum along the axis: stride and length from the shape.
    const int64_t a = axis < 0 ? axis + 3 : axis;
    const Shape shape = {2, 3, 4};
    const int64_t stride = strides_of(shape)[static_cast<std::size_t>(a)];
    for (int64_t i = 0; i < 24; ++i) {
      if ((i / stride) % shape[static_cast<std::size_t>(a)] != 0) continue;  // line starts only
      double sum = 0.0;
      for (int64_t k = 0; k < shape[static_cast<std::size_t>(a)]; ++k) {
        sum += y.data<float>()[i + k * stride];
      }
      EXPECT_NEAR(sum, 1.0, 1e-6) << "axis " << axis << " line at " << i;
    }
  }
}

TEST(Softmax, LargeInputsStayFiniteAndLogSoftmaxIsLogOfSoftmax) {
  const Tensor x = from_values({2, 3}, {1000, 1001, 1002, -1000, 0, 1000});
  const Tensor y = OneNode("Softmax").in(x).run1();
  const Tensor log_y = OneNode("LogSoftmax").in(x).run1();
  for (int64_t i = 0; i < 6; ++i) {
    EXPECT_TRUE(std::isfinite(log_y.data<float>()[i]));
    if (y.data<float>()[i] > 1e-30f) {
      EXPECT_NEAR(log_y.data<float>()[i], std::log(y.data<float>()[i]), 1e-5);
    }
  }
  // exp(0), exp(1), exp(2) normalized.
  const double total = 1 + std::exp(1.0) + std::exp(2.0);
  EXPECT_NEAR(y.data<float>()[0], 1 / total, 1e-7);
  EXPECT_NEAR(y.data<float>()[2], std::exp(2.0) / total, 1e-7);
  EXPECT_NEAR(log_y.data<float>()[3], -2000.0, 1e-3);
}

TEST(Softmax, OpsetsBelow13FlattenAtTheAxis) {
  // Opset 11, axis 1 of [2, 3, 4]: each batch's 12 values form one distribution. Opset 13:
  // each 3-long line along axis 1 is one.
  const Tensor x = random_tensor({2, 3, 4}, 81);
  const Tensor old = OneNode("Softmax", 11).in(x).run1();  // default axis 1
  const Tensor now = OneNode("Softmax", 13).in(x).attr("axis", int64_t{1}).run1();
  for (int64_t n = 0; n < 2; ++n) {
    EXPECT_NEAR(std::accumulate(old.data<float>() + n * 12, old.data<float>() + n * 12 + 12, 0.0),
                1.0, 1e-6);
    EXPECT_NEAR(std::accumulate(now.data<float>() + n * 12, now.data<float>() + n * 12 + 12, 0.0),
                4.0, 1e-5);
  }
  // Opset 13's default axis is the last one.
  const Tensor last = OneNode("LogSoftmax", 13).in(x).run1();
  for (int64_t row = 0; row < 6; ++row) {
    double sum = 0.0;
    for (int64_t k = 0; k < 4; ++k) sum += std::exp(last.data<float>()[row * 4 + k]);
    EXPECT_NEAR(sum, 1.0, 1e-6);
  }
  expect_error([&] { OneNode("Softmax").in(x).attr("axis", int64_t{3}).infer(); },
               ErrorCode::kInvalidModel, {"axis = 3", "rank 3"});
}

// ---- Gemm and MatMul ---------------------------------------------------------------------

// dst[m x n] = a[m x k] * b[k x n], a triple loop in double.
std::vector<double> naive_product(const float* a, const float* b, int64_t m, int64_t k, int64_t n) {
  std::vector<double> dst(static_cast<std::size_t>(m * n), 0.0);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      for (int64_t p = 0; p < k; ++p) dst[i * n + j] += double{a[i * k + p]} * b[p * n + j];
    }
  }
  return dst;
}

Tensor transpose(const Tensor& t) {
  Tensor out = Tensor::zeros(DType::kFloat32, {t.dim(1), t.dim(0)});
  for (int64_t i = 0; i < t.dim(0); ++i) {
    for (int64_t j = 0; j < t.dim(1); ++j)
      out.data<float>()[j * t.dim(0) + i] = t.data<float>()[i * t.dim(1) + j];
  }
  return out;
}

TEST(Gemm, TransposesAlphaBetaAndBroadcastBias) {
  const int64_t m = 5, k = 7, n = 6;
  const Tensor a = random_tensor({m, k}, 91), b = random_tensor({k, n}, 92);
  const std::vector<double> ab = naive_product(a.data<float>(), b.data<float>(), m, k, n);
  const float alpha = 0.5f, beta = -2.0f;
  // C of every broadcastable shape, and where element (i, j) of the broadcast C comes from.
  const std::vector<std::pair<Shape, int64_t (*)(int64_t, int64_t)>> biases = {
      {{}, [](int64_t, int64_t) -> int64_t { return 0; }},
      {{n}, [](int64_t, int64_t j) { return j; }},
      {{m, 1}, [](int64_t i, int64_t) { return i; }},
      {{m, n}, [](int64_t i, int64_t j) { return i * 6 + j; }},
  };
  for (const auto& [c_shape, c_index] : biases) {
    const Tensor c = random_tensor(c_shape, 93);
    for (int trans = 0; trans < 4; ++trans) {
      const bool ta = trans & 1, tb = trans & 2;
      const Tensor y = OneNode("Gemm")
                           .in(ta ? transpose(a) : a)
                           .in(tb ? transpose(b) : b)
                           .in(c)
                           .attr("transA", int64_t{ta})
                           .attr("transB", int64_t{tb})
                           .attr("alpha", alpha)
                           .attr("beta", beta)
                           .run1();
      ASSERT_EQ(y.shape(), (Shape{m, n}));
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = 0; j < n; ++j) {
          const double expected = alpha * ab[i * n + j] + beta * c.data<float>()[c_index(i, j)];
          EXPECT_NEAR(y.data<float>()[i * n + j], expected, 1e-5) << trans;
        }
      }
    }
  }
  const Tensor no_c = OneNode("Gemm").in(a).in(b).run1();
  for (int64_t i = 0; i < m * n; ++i) EXPECT_NEAR(no_c.data<float>()[i], ab[i], 1e-5);
  expect_error([&] { OneNode("Gemm").in(a).in(b).attr("transB", int64_t{1}).infer(); },
               ErrorCode::kShapeMismatch, {"K = 7", "K = 6"});
  expect_error([&] { OneNode("Gemm").in(a).in(b).in(random_tensor({m}, 1)).infer(); },
               ErrorCode::kShapeMismatch, {"C [5] does not broadcast to the output [5, 6]"});
}

struct MatMulCase {
  Shape a, b, out;
};

void PrintTo(const MatMulCase& c, std::ostream* os) {  // NOLINT: name required by gtest
  *os << fmt::format("[{}] x [{}]", fmt::join(c.a, ", "), fmt::join(c.b, ", "));
}

class MatMulBroadcast : public ::testing::TestWithParam<MatMulCase> {};

// Every matrix of the batched product equals the 2-D product of the operand matrices that the
// numpy rules pair with it (index modulo each operand's own batch dimension).
TEST_P(MatMulBroadcast, EachBatchIsThePlainProductOfItsOperands) {
  const MatMulCase& c = GetParam();
  const Tensor a = random_tensor(c.a, 101), b = random_tensor(c.b, 102);
  const Tensor y = OneNode("MatMul").in(a).in(b).run1();
  ASSERT_EQ(y.shape(), c.out);
  // Promote 1-D operands: A to [1, K], B to [K, 1].
  const Shape a2 = c.a.size() == 1 ? Shape{1, c.a[0]} : c.a;
  const Shape b2 = c.b.size() == 1 ? Shape{c.b[0], 1} : c.b;
  const int64_t m = a2[a2.size() - 2], k = a2.back(), n = b2.back();
  const Shape a_batch(a2.begin(), a2.end() - 2), b_batch(b2.begin(), b2.end() - 2);
  const std::size_t rank = std::max(a_batch.size(), b_batch.size());
  Shape batch(rank);
  for (std::size_t d = 0; d < rank; ++d) {
    const int64_t da = d + a_batch.size() >= rank ? a_batch[d + a_batch.size() - rank] : 1;
    const int64_t db = d + b_batch.size() >= rank ? b_batch[d + b_batch.size() - rank] : 1;
    batch[d] = std::max(da, db);
  }
  // The flat matrix index of `index` within an operand's batch dims (right-aligned).
  auto operand_matrix = [&](const Shape& index, const Shape& operand) {
    int64_t flat = 0;
    for (std::size_t d = 0; d < operand.size(); ++d) {
      flat = flat * operand[d] + index[rank - operand.size() + d] % operand[d];
    }
    return flat;
  };
  for (int64_t i = 0; i < numel(batch); ++i) {
    const Shape index = unravel(i, batch);
    const std::vector<double> expected =
        naive_product(a.data<float>() + operand_matrix(index, a_batch) * m * k,
                      b.data<float>() + operand_matrix(index, b_batch) * k * n, m, k, n);
    for (int64_t j = 0; j < m * n; ++j) {
      EXPECT_NEAR(y.data<float>()[i * m * n + j], expected[j], 1e-5) << "batch " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, MatMulBroadcast,
    ::testing::Values(MatMulCase{{3, 4}, {4, 5}, {3, 5}}, MatMulCase{{2, 3, 4}, {4, 5}, {2, 3, 5}},
                      MatMulCase{{3, 4}, {2, 4, 5}, {2, 3, 5}},
                      MatMulCase{{2, 1, 3, 4}, {5, 4, 2}, {2, 5, 3, 2}},
                      MatMulCase{{1, 3, 2, 4}, {2, 1, 4, 3}, {2, 3, 2, 3}},
                      MatMulCase{{4}, {4, 2}, {2}}, MatMulCase{{2, 3, 4}, {4}, {2, 3}},
                      MatMulCase{{4}, {2, 4, 3}, {2, 3}}, MatMulCase{{4}, {4}, {}}));

TEST(MatMul, Errors) {
  expect_error(
      [] {
        OneNode("MatMul").in(random_tensor({3, 4}, 1)).in(random_tensor({5, 2}, 2)).infer();
      },
      ErrorCode::kShapeMismatch, {"A [3, 4] has K = 4", "B [5, 2] has K = 5"});
  expect_error(
      [] {
        OneNode("MatMul").in(random_tensor({2, 3, 4}, 1)).in(random_tensor({3, 4, 2}, 2)).infer();
      },
      ErrorCode::kShapeMismatch, {"do not broadcast"});
  expect_error([] { OneNode("MatMul").in(random_tensor({}, 1)).in(random_tensor({2}, 2)).infer(); },
               ErrorCode::kShapeMismatch, {"rank 1 or more"});
}

// ---- Hardmax, Shrink ----

// Opset 13 takes one axis; below 13 the input is flattened to 2-D at the axis, so the whole
// trailing block is one line. The first of equal maxima wins, a NaN over any number.
TEST(ReferenceHardmax, OneAxisFromOpset13AFlattenedBlockBefore) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  Tensor x = Tensor::zeros(DType::kFloat32, {1, 2, 3});
  const std::vector<float> v = {1, 7, 7, /**/ 9, nan, 2};
  std::copy(v.begin(), v.end(), x.data<float>());
  auto hardmax = [&](int64_t opset, int64_t axis) {
    const Tensor y = OneNode("Hardmax", opset).in(x).attr("axis", axis).run1();
    return std::vector<float>(y.data<float>(), y.data<float>() + y.numel());
  };
  EXPECT_EQ(hardmax(13, -1), (std::vector<float>{0, 1, 0, 0, 1, 0}));
  EXPECT_EQ(hardmax(13, 1), (std::vector<float>{0, 0, 1, 1, 1, 0}));
  EXPECT_EQ(hardmax(11, 1), (std::vector<float>{0, 0, 0, 0, 1, 0}));  // one line of 6
}

// Shrink: x + bias below -lambd, x - bias above lambd, 0 between (both bounds included).
TEST(ReferenceShrink, MovesTheTailsInByBiasAndZeroesTheMiddle) {
  Tensor x = Tensor::zeros(DType::kFloat32, {6});
  const std::vector<float> v = {-3, -1.5f, -1, 0.5f, 1, 2};
  std::copy(v.begin(), v.end(), x.data<float>());
  const Tensor y = OneNode("Shrink").in(x).attr("lambd", 1.0f).attr("bias", 0.5f).run1();
  EXPECT_EQ(std::vector<float>(y.data<float>(), y.data<float>() + 6),
            (std::vector<float>{-2.5f, -1, 0, 0, 0, 1.5f}));
}

// ---- RNN, GRU, LSTM ----------------------------------------------------------------------

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// One step of hidden size 1 checked against the ONNX equations written out by hand: LSTM with
// peepholes (and with the coupled input-forget gate, and with clip), GRU both ways of applying
// the reset gate, RNN with a LeakyRelu whose alpha comes from activation_alpha.
TEST(ReferenceRecurrent, OneStepFollowsTheOnnxEquations) {
  const Tensor x = from_values({1, 1, 1}, {1.0f});
  {
    const Tensor w = from_values({1, 4, 1}, {0.5f, -0.5f, 1.0f, 2.0f});  // i, o, f, c
    const Tensor r = from_values({1, 4, 1}, {0.1f, 0.2f, 0.3f, 0.4f});
    const Tensor h0 = from_values({1, 1, 1}, {0.25f}), c0 = from_values({1, 1, 1}, {0.5f});
    const Tensor p = from_values({1, 3}, {0.1f, 0.2f, 0.3f});  // i, o, f
    auto lstm = [&](const Attrs& attrs) {
      return OneNode("LSTM", 14)
          .in(x)
          .in(w)
          .in(r)
          .omitted()
          .omitted()
          .in(h0)
          .in(c0)
          .in(p)
          .attrs(attrs)
          .outputs(3)
          .run();
    };
    for (const auto& [input_forget, clip] : {std::pair{0, 0.0}, {1, 0.0}, {0, 0.7}}) {
      auto clipped = [&](double v) { return clip > 0.0 ? std::clamp(v, -clip, clip) : v; };
      const double i = sigmoid(clipped(0.5 + 0.1 * 0.25 + 0.1 * 0.5));
      const double f = input_forget ? 1.0 - i : sigmoid(clipped(1.0 + 0.3 * 0.25 + 0.3 * 0.5));
      const double c = f * 0.5 + i * std::tanh(clipped(2.0 + 0.4 * 0.25));
      const double o = sigmoid(clipped(-0.5 + 0.2 * 0.25 + 0.2 * c));
      Attrs attrs = {{"hidden_size", int64_t{1}}, {"input_forget", int64_t{input_forget}}};
      if (clip > 0.0) attrs["clip"] = static_cast<float>(clip);
      const std::vector<Tensor> out = lstm(attrs);
      SCOPED_TRACE(fmt::format("input_forget {}, clip {}", input_forget, clip));
      EXPECT_NEAR(values(out[0])[0], o * std::tanh(c), 1e-6);  // Y
      EXPECT_NEAR(values(out[1])[0], o * std::tanh(c), 1e-6);  // Y_h
      EXPECT_NEAR(values(out[2])[0], c, 1e-6);                 // Y_c
    }
  }
  {
    const Tensor w = from_values({1, 3, 1}, {0.3f, -0.4f, 0.8f});  // z, r, h
    const Tensor r = from_values({1, 3, 1}, {0.5f, 0.6f, -0.7f});
    const Tensor b = from_values({1, 6}, {0, 0, 0.1f, 0, 0, 0.2f});
    const Tensor h0 = from_values({1, 1, 1}, {0.5f});
    const double z = sigmoid(0.3 + 0.5 * 0.5), reset = sigmoid(-0.4 + 0.6 * 0.5);
    for (int64_t linear_before_reset : {0, 1}) {
      const double candidate = linear_before_reset
                                   ? std::tanh(0.8 + 0.1 + reset * (-0.7 * 0.5 + 0.2))
                                   : std::tanh(0.8 + 0.1 + -0.7 * (reset * 0.5) + 0.2);
      const Tensor y = OneNode("GRU", 14)
                           .in(x)
                           .in(w)
                           .in(r)
                           .in(b)
                           .omitted()
                           .in(h0)
                           .attr("linear_before_reset", linear_before_reset)
                           .run1();
      EXPECT_NEAR(values(y)[0], (1.0 - z) * candidate + z * 0.5, 1e-6)
          << "linear_before_reset " << linear_before_reset;
    }
  }
  const Tensor y = OneNode("RNN", 14)
                       .in(from_values({1, 1, 1}, {-2.0f}))
                       .in(from_values({1, 1, 1}, {1.0f}))
                       .in(from_values({1, 1, 1}, {1.0f}))
                       .attr("activations", std::vector<std::string>{"LeakyRelu"})
                       .attr("activation_alpha", std::vector<float>{0.1f})
                       .run1();
  EXPECT_NEAR(values(y)[0], -0.2f, 1e-7);
}

// Random LSTMs and GRUs over several steps, checked by how their variants must relate: a
// bidirectional run is a forward run with the first direction's weights beside a reverse run
// with the second's; a reverse run is a forward run over the time-reversed sequence; layout 1
// is layout 0 with batch first; a sequence cut short by sequence_lens leaves zeros in Y past its
// end and its last state in Y_h, as if the input had been that short.
class ReferenceRecurrentVariants : public ::testing::TestWithParam<std::string> {};

TEST_P(ReferenceRecurrentVariants, AgreeWithEachOther) {
  const std::string op = GetParam();
  const bool lstm = op == "LSTM";
  const int64_t steps = 5, batch = 3, in = 4, hidden = 3, gates = lstm ? 4 : 3;
  const Tensor x = random_tensor({steps, batch, in}, 1);
  const Tensor w = random_tensor({2, gates * hidden, in}, 2);
  const Tensor r = random_tensor({2, gates * hidden, hidden}, 3);
  const Tensor b = random_tensor({2, 2 * gates * hidden}, 4);
  const Tensor h0 = random_tensor({2, batch, hidden}, 5), c0 = random_tensor({2, batch, hidden}, 6);
  // Direction d of a [2, ...] tensor.
  auto half = [](const Tensor& t, int64_t d) {
    Shape shape = t.shape();
    shape[0] = 1;
    Tensor out = Tensor::zeros(DType::kFloat32, shape);
    std::copy_n(t.data<float>() + d * out.numel(), out.numel(), out.data<float>());
    return out;
  };
  // Runs the op: Y then Y_h (then Y_c).
  auto run = [&](const Tensor& xs, int64_t d, const std::string& direction,
                 const Tensor* lens = nullptr, int64_t layout = 0, const Tensor* h = nullptr) {
    const bool both = direction == "bidirectional";
    OneNode node(op, 14);
    node.in(xs).in(both ? w : half(w, d)).in(both ? r : half(r, d)).in(both ? b : half(b, d));
    if (lens != nullptr) {
      node.in(*lens);
    } else {
      node.omitted();
    }
    node.in(h != nullptr ? *h : both ? h0 : half(h0, d));
    if (lstm) node.in(both ? c0 : half(c0, d));
    return node.attr("direction", direction).attr("layout", layout).outputs(lstm ? 3 : 2).run();
  };
  // [T, D, B, H] -> step t, direction d, batch b, unit u.
  auto at = [&](const Tensor& y, int64_t t, int64_t d, int64_t bi, int64_t u) {
    const Shape& s = y.shape();
    return y.data<float>()[((t * s[1] + d) * s[2] + bi) * s[3] + u];
  };

  const std::vector<Tensor> both = run(x, 0, "bidirectional");
  const std::vector<Tensor> forward = run(x, 0, "forward"), reverse = run(x, 1, "reverse");
  // Time-reversed X, run forward with the second direction's weights.
  Tensor x_flipped = Tensor::zeros(DType::kFloat32, x.shape());
  for (int64_t t = 0; t < steps; ++t) {
    std::copy_n(x.data<float>() + (steps - 1 - t) * batch * in, batch * in,
                x_flipped.data<float>() + t * batch * in);
  }
  const std::vector<Tensor> flipped = run(x_flipped, 1, "forward");
  for (int64_t t = 0; t < steps; ++t) {
    for (int64_t bi = 0; bi < batch; ++bi) {
      for (int64_t u = 0; u < hidden; ++u) {
        EXPECT_EQ(at(both[0], t, 0, bi, u), at(forward[0], t, 0, bi, u));
        EXPECT_EQ(at(both[0], t, 1, bi, u), at(reverse[0], t, 0, bi, u));
        EXPECT_EQ(at(reverse[0], t, 0, bi, u), at(flipped[0], steps - 1 - t, 0, bi, u));
      }
    }
  }
  EXPECT_EQ(values(reverse[1]), values(flipped[1]));
  for (std::size_t k = 1; k < both.size(); ++k) {  // Y_h (and Y_c): the two directions stacked
    std::vector<float> stacked = values(forward[k]);
    const std::vector<float> second = values(reverse[k]);
    stacked.insert(stacked.end(), second.begin(), second.end());
    EXPECT_EQ(values(both[k]), stacked);
  }

  // Layout 1: X [B, T, I], Y [B, T, D, H], states [B, D, H].
  Tensor x_batch_major = Tensor::zeros(DType::kFloat32, {batch, steps, in});
  for (int64_t t = 0; t < steps; ++t) {
    for (int64_t bi = 0; bi < batch; ++bi) {
      std::copy_n(x.data<float>() + (t * batch + bi) * in, in,
                  x_batch_major.data<float>() + (bi * steps + t) * in);
    }
  }
  // Both directions, so that the states' [B, D, H] order differs from [D, B, H].
  Tensor h0_batch_major = Tensor::zeros(DType::kFloat32, {batch, 2, hidden});
  for (int64_t d = 0; d < 2; ++d) {
    for (int64_t bi = 0; bi < batch; ++bi) {
      std::copy_n(h0.data<float>() + (d * batch + bi) * hidden, hidden,
                  h0_batch_major.data<float>() + (bi * 2 + d) * hidden);
    }
  }
  if (!lstm) {  // LSTM's initial_c would need the same transpose; the GRU covers the layout
    const std::vector<Tensor> batch_major =
        run(x_batch_major, 0, "bidirectional", nullptr, 1, &h0_batch_major);
    ASSERT_EQ(batch_major[0].shape(), (Shape{batch, steps, 2, hidden}));
    for (int64_t t = 0; t < steps; ++t) {
      for (int64_t d = 0; d < 2; ++d) {
        for (int64_t bi = 0; bi < batch; ++bi) {
          for (int64_t u = 0; u < hidden; ++u) {
            EXPECT_EQ(batch_major[0].data<float>()[((bi * steps + t) * 2 + d) * hidden + u],
                      at(both[0], t, d, bi, u));
            if (t == 0) {
              EXPECT_EQ(batch_major[1].data<float>()[(bi * 2 + d) * hidden + u],
                        both[1].data<float>()[(d * batch + bi) * hidden + u]);
            }
          }
        }
      }
    }
  }

  // sequence_lens 5, 2, 0 in both directions.
  Tensor lens = Tensor::zeros(DType::kInt32, {batch});
  const std::vector<int32_t> lengths = {5, 2, 0};
  std::copy(lengths.begin(), lengths.end(), lens.data<int32_t>());
  const std::vector<Tensor> cut = run(x, 0, "bidirectional", &lens);
  for (int64_t bi = 0; bi < batch; ++bi) {
    // Sample bi alone, its first lengths[bi] steps, in each direction.
    const int64_t length = lengths[static_cast<std::size_t>(bi)];
    for (int64_t d = 0; d < 2; ++d) {
      for (int64_t u = 0; u < hidden; ++u) {
        const float initial = h0.data<float>()[(d * batch + bi) * hidden + u];
        const float expected_h =
            length == 0 ? initial : at(cut[0], d == 0 ? length - 1 : 0, d, bi, u);
        EXPECT_EQ(cut[1].data<float>()[(d * batch + bi) * hidden + u], expected_h);
        for (int64_t t = length; t < steps; ++t) EXPECT_EQ(at(cut[0], t, d, bi, u), 0.0f);
      }
    }
    if (length > 0) {
      Tensor short_x = Tensor::zeros(DType::kFloat32, {length, 1, in});
      Tensor h = Tensor::zeros(DType::kFloat32, {1, 1, hidden});
      for (int64_t t = 0; t < length; ++t) {
        std::copy_n(x.data<float>() + (t * batch + bi) * in, in, short_x.data<float>() + t * in);
      }
      std::copy_n(h0.data<float>() + (1 * batch + bi) * hidden, hidden, h.data<float>());
      if (!lstm) {  // the reverse direction of sample bi alone, from its last real step
        const std::vector<Tensor> alone = run(short_x, 1, "reverse", nullptr, 0, &h);
        for (int64_t t = 0; t < length; ++t) {
          for (int64_t u = 0; u < hidden; ++u) {
            EXPECT_NEAR(at(cut[0], t, 1, bi, u), at(alone[0], t, 0, 0, u), 1e-6f);
          }
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Cells, ReferenceRecurrentVariants, ::testing::Values("GRU", "LSTM"));

TEST(ReferenceRecurrent, Errors) {
  const Tensor x = random_tensor({2, 1, 3}, 1), w = random_tensor({1, 4, 3}, 2),
               r = random_tensor({1, 4, 4}, 3);
  expect_error(
      [&] {
        OneNode("RNN", 14)
            .in(x)
            .in(w)
            .in(random_tensor({1, 4, 3}, 3))
            .attr("hidden_size", int64_t{4})
            .run();
      },
      ErrorCode::kShapeMismatch, {"input R", "[1, 4, 3]", "expected [1, 4, 4]"});
  expect_error([&] { OneNode("LSTM", 14).in(x).in(w).in(r).run(); }, ErrorCode::kShapeMismatch,
               {"input W", "expected [1, 16, 3]"});
  expect_error([&] { OneNode("RNN", 14).in(x).in(w).in(r).attr("direction", "backward").run(); },
               ErrorCode::kInvalidModel, {"direction", "backward"});
  auto rnn_with_activations = [&](const std::vector<std::string>& names) {
    OneNode("RNN", 14).in(x).in(w).in(r).attr("activations", names).run();
  };
  expect_error([&] { rnn_with_activations({"Gelu"}); }, ErrorCode::kUnsupported,
               {"activation function 'Gelu'"});
  expect_error(
      [&] {
        rnn_with_activations({"Tanh", "Tanh", "Tanh"});
      },
      ErrorCode::kInvalidModel, {"names 3 functions, expected 1"});
  Tensor lens = Tensor::zeros(DType::kInt32, {1});
  lens.data<int32_t>()[0] = 3;
  expect_error([&] { OneNode("RNN", 14).in(x).in(w).in(r).omitted().in(lens).run(); },
               ErrorCode::kInvalidArgument, {"sequence_lens[0] = 3", "[0, 2]"});
}

// ---- NegativeLogLikelihoodLoss, SoftmaxCrossEntropyLoss ----

Tensor int64s(Shape shape, const std::vector<int64_t>& values) {
  Tensor t = Tensor::zeros(DType::kInt64, std::move(shape));
  std::copy(values.begin(), values.end(), t.data<int64_t>());
  return t;
}

// [N=2, C=3, d=2] log-probabilities, hand-summed: each reduction, class weights, and an ignored
// (negative) index that drops its element from the sum and from the weights that divide it.
TEST(ReferenceLoss, NllReductionsWeightsAndIgnoredTargets) {
  const Tensor input =
      from_values({2, 3, 2}, {-1, -2, -3, -4, -5, -6, /**/ -7, -8, -9, -10, -11, -12});
  const Tensor target = int64s({2, 2}, {0, 2, -1, 1});
  const Tensor weight = from_values({3}, {0.5f, 1, 2});
  auto loss = [&](const std::string& reduction, bool weighted) {
    OneNode node("NegativeLogLikelihoodLoss", 13);
    node.in(input).in(target);
    if (weighted) node.in(weight);
    return values(node.attr("reduction", reduction).attr("ignore_index", int64_t{-1}).run1());
  };
  // Picks: (0, class 0, d0) = -1, (0, class 2, d1) = -6, ignored, (1, class 1, d1) = -10.
  EXPECT_EQ(loss("none", false), (std::vector<float>{1, 6, 0, 10}));
  EXPECT_EQ(loss("sum", false), (std::vector<float>{17}));
  EXPECT_FLOAT_EQ(loss("mean", false)[0], 17.0f / 3.0f);
  EXPECT_EQ(loss("none", true), (std::vector<float>{0.5f, 12, 0, 10}));
  EXPECT_FLOAT_EQ(loss("mean", true)[0], 22.5f / 3.5f);
}

// SoftmaxCrossEntropyLoss is NegativeLogLikelihoodLoss of LogSoftmax over the classes, and its
// second output is that LogSoftmax.
TEST(ReferenceLoss, SoftmaxCrossEntropyIsNllOfLogSoftmax) {
  const Tensor scores = random_tensor({3, 4, 5}, 31, -3.0f, 3.0f);
  const Tensor labels = int64s({3, 5}, {0, 1, 2, 3, 0, 3, 3, 1, 2, 0, 1, 1, 2, 2, 3});
  const Tensor weights = random_tensor({4}, 32, 0.5f, 2.0f);
  const std::vector<Tensor> sce =
      OneNode("SoftmaxCrossEntropyLoss", 13).in(scores).in(labels).in(weights).outputs(2).run();
  const Tensor log_prob = OneNode("LogSoftmax", 13).in(scores).attr("axis", int64_t{1}).run1();
  expect_near(sce[1], log_prob, 1e-6f);
  const Tensor nll =
      OneNode("NegativeLogLikelihoodLoss", 13).in(log_prob).in(labels).in(weights).run1();
  expect_near(sce[0], nll, 1e-6f);
}

TEST(ReferenceLoss, Errors) {
  const Tensor input = from_values({1, 2}, {-1, -2});
  expect_error(
      [&] { OneNode("NegativeLogLikelihoodLoss", 13).in(input).in(int64s({1}, {2})).run(); },
      ErrorCode::kInvalidArgument, {"target 2 (element 0) is not a class in [0, 2)"});
  expect_error(
      [&] {
        OneNode("NegativeLogLikelihoodLoss", 13).in(input).in(int64s({2}, {0, 1})).run();
      },
      ErrorCode::kShapeMismatch, {"target [2]", "[N, d1, ...]"});
  expect_error(
      [&] {
        OneNode("SoftmaxCrossEntropyLoss", 13)
            .in(input)
            .in(int64s({1}, {0}))
            .attr("reduction", "max")
            .run();
      },
      ErrorCode::kInvalidModel, {"reduction = 'max'"});
}

// ---- Threads -----------------------------------------------------------------------------

// Large enough for the kernels to use their thread team: every output is still summed in
// one fixed order, so the result must be bit-identical to the single-threaded one.
TEST(ReferenceThreads, ResultsDoNotDependOnThreadCount) {
  const Tensor x = random_tensor({2, 16, 20, 20}, 111), w = random_tensor({32, 16, 3, 3}, 112);
  const Tensor a = random_tensor({3, 64, 128}, 113), b = random_tensor({128, 96}, 114);
  const Attrs pads = {{"pads", Shape{1, 1, 1, 1}}};
  Tensor scales = Tensor::zeros(DType::kFloat32, {4});  // to 2 x 16 x 50 x 45: cubic, 4 taps
  const std::vector<float> factors = {1.0f, 1.0f, 2.5f, 2.25f};
  std::copy(factors.begin(), factors.end(), scales.data<float>());
  auto run_all = [&] {
    return std::vector<Tensor>{
        OneNode("Conv").in(x).in(w).attrs(pads).run1(), OneNode("MatMul").in(a).in(b).run1(),
        OneNode("Gemm").in(a.reshaped({192, 128})).in(b).run1(),
        OneNode("AveragePool").in(x).attr("kernel_shape", Shape{5, 5}).attrs(pads).run1(),
        OneNode("Resize").in(x).omitted().in(scales).attr("mode", std::string("cubic")).run1()};
  };
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  const std::vector<Tensor> serial = run_all();
  omp_set_num_threads(std::max(threads, 4));  // several threads even on a small machine
  const std::vector<Tensor> parallel = run_all();
  omp_set_num_threads(threads);
  for (std::size_t i = 0; i < serial.size(); ++i) {
    EXPECT_EQ(values(serial[i]), values(parallel[i])) << "op " << i;
  }
}

}  // namespace
}  // namespace sparsecol::testing
