// The tensor (data movement) ops end to end on one node: shape inference (graph/ops_tensor.cc),
// then the reference op (runtime/reference/ops_tensor.cc) on the allocated outputs. Results are
// checked element by element against index arithmetic written here, independently of the
// kernels' strided walks, on seeded random shapes and on small hand-checked cases.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <optional>
#include <random>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "../test_util.h"
#include "graph/ops.h"
#include "runtime/reference/reference_ops.h"

namespace sparsecol {
namespace {

constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
constexpr int64_t kMin = std::numeric_limits<int64_t>::min();

// ---- building and running one node ----

struct Operand {
  std::optional<Tensor> tensor;  // nullopt: an omitted optional input
  bool constant = true;          // whether shape inference sees the contents
};
Operand constant(Tensor t) { return {std::move(t), true}; }
Operand runtime_input(Tensor t) { return {std::move(t), false}; }
Operand omitted() { return {std::nullopt, false}; }

struct OpSpec {
  std::string op = {};
  std::vector<Operand> inputs = {};
  std::map<std::string, graph::AttrValue> attrs = {};
  std::size_t outputs = 1;
  int64_t opset = 13;
};

const graph::OpDef& op_def(const std::string& op) {
  for (const graph::OpDef& def : graph::tensor_op_defs()) {
    if (def.op_type == op) return def;
  }
  throw std::runtime_error("no OpDef for " + op);
}

const runtime::RefOp& ref_op(const std::string& op) {
  for (const runtime::RefOp& ref : runtime::tensor_reference_ops()) {
    if (ref.op_type == op) return ref;
  }
  throw std::runtime_error("no RefOp for " + op);
}

// What the executor does for one node: infer, allocate the outputs, run the reference op.
std::vector<Tensor> evaluate(const graph::Graph& graph, const graph::Node& node,
                             const std::vector<const Tensor*>& inputs) {
  graph::InferContext ctx(graph, node);
  op_def(node.op_type).infer(ctx);
  std::vector<Tensor> outputs;
  for (const graph::InferContext::Output& out : ctx.outputs()) {
    if (!out.set) throw std::runtime_error("inference left an output unset");
    outputs.push_back(Tensor::zeros(out.dtype, out.shape));
  }
  runtime::RefOpContext run{graph, node, inputs, {}};
  for (Tensor& t : outputs) run.outputs.push_back(&t);
  ref_op(node.op_type).run(run);
  return outputs;
}

std::vector<Tensor> run(const OpSpec& spec) {
  graph::Graph g;
  g.source = "test.onnx";
  g.opset = spec.opset;
  graph::Node node{"n0", spec.op, "", {}, {}, spec.attrs, {}};
  std::vector<const Tensor*> inputs;
  for (std::size_t i = 0; i < spec.inputs.size(); ++i) {
    const Operand& in = spec.inputs[i];
    if (!in.tensor) {
      node.inputs.push_back(-1);
      inputs.push_back(nullptr);
      continue;
    }
    node.inputs.push_back(g.add_value({fmt::format("in{}", i), in.tensor->dtype(), true,
                                       graph::make_shape(in.tensor->shape()),
                                       in.constant ? in.tensor : std::nullopt, -1}));
    inputs.push_back(&*in.tensor);
  }
  for (std::size_t i = 0; i < spec.outputs; ++i) {
    graph::Value out;
    out.name = fmt::format("out{}", i);
    node.outputs.push_back(g.add_value(std::move(out)));
  }
  g.nodes.push_back(node);
  return evaluate(g, g.nodes[0], inputs);
}

Tensor run1(const OpSpec& spec) { return run(spec).at(0); }

// Expects spec to fail with `code` and a message naming the node, the op and each fragment.
void expect_error(const OpSpec& spec, ErrorCode code, const std::vector<std::string>& fragments) {
  try {
    run(spec);
    ADD_FAILURE() << spec.op << ": expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    const std::string message = e.what();
    EXPECT_NE(message.find(fmt::format("node 'n0' ({})", spec.op)), std::string::npos) << message;
    for (const std::string& fragment : fragments) {
      EXPECT_NE(message.find(fragment), std::string::npos)
          << "'" << fragment << "' not in: " << message;
    }
  }
}

// ---- tensors ----

template <typename T>
Tensor make(std::vector<int64_t> shape, const std::vector<T>& values) {
  Tensor t = Tensor::zeros(DTypeOf<T>::kValue, std::move(shape));
  EXPECT_EQ(static_cast<std::size_t>(t.numel()), values.size());
  std::copy(values.begin(), values.end(), t.data<T>());
  return t;
}
Tensor ints(const std::vector<int64_t>& values) {
  return make<int64_t>({static_cast<int64_t>(values.size())}, values);
}
Tensor int_scalar(int64_t v) { return make<int64_t>({}, {v}); }
Tensor floats(std::vector<int64_t> shape, const std::vector<float>& values) {
  return make<float>(std::move(shape), values);
}
template <typename T>
std::vector<T> values(const Tensor& t) {
  return std::vector<T>(t.data<T>(), t.data<T>() + t.numel());
}

// Random bytes (0/1 for bool), so that a misplaced element almost surely shows.
Tensor random_tensor(DType dtype, std::vector<int64_t> shape, std::mt19937& rng) {
  Tensor t = Tensor::zeros(dtype, std::move(shape));
  auto* bytes = static_cast<unsigned char*>(t.raw_data());
  for (std::size_t i = 0; i < t.nbytes(); ++i) {
    bytes[i] = static_cast<unsigned char>(dtype == DType::kBool ? rng() % 2 : rng() % 256);
  }
  return t;
}

std::vector<int64_t> random_shape(std::mt19937& rng, int rank, int64_t lo, int64_t hi) {
  std::uniform_int_distribution<int64_t> dim(lo, hi);
  std::vector<int64_t> shape(static_cast<std::size_t>(rank));
  for (int64_t& d : shape) d = dim(rng);
  return shape;
}

int64_t uniform(std::mt19937& rng, int64_t lo, int64_t hi) {
  return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
}

// ---- index arithmetic ----

using test::ravel;
using test::unravel;

// Every element of `out` equals the element of `src` at the flat index that source(index of
// the output element) names.
template <typename Source>
::testing::AssertionResult each_element_from(const Tensor& out, const Tensor& src,
                                             Source&& source) {
  if (out.dtype() != src.dtype()) return ::testing::AssertionFailure() << "dtypes differ";
  const std::size_t size = dtype_size(out.dtype());
  const auto* o = static_cast<const unsigned char*>(out.raw_data());
  const auto* s = static_cast<const unsigned char*>(src.raw_data());
  for (int64_t j = 0; j < out.numel(); ++j) {
    const std::vector<int64_t> index = unravel(j, out.shape());
    const int64_t i = source(index);
    if (i < 0 || i >= src.numel()) {
      return ::testing::AssertionFailure() << "bad source index " << i << " in the test";
    }
    if (std::memcmp(o + j * size, s + i * size, size) != 0) {
      return ::testing::AssertionFailure()
             << "output element [" << fmt::format("{}", fmt::join(index, ", "))
             << "] differs from source element " << i;
    }
  }
  return ::testing::AssertionSuccess();
}

const DType kAllDTypes[] = {DType::kFloat32, DType::kFloat64, DType::kInt64, DType::kInt32,
                            DType::kInt8,    DType::kUInt8,   DType::kBool};

// ---- Transpose ----

TEST(ReferenceTensor, TransposeOfRandomRank4MatchesIndexArithmetic) {
  std::mt19937 rng(1);
  for (int trial = 0; trial < 40; ++trial) {
    const DType dtype = kAllDTypes[trial % std::size(kAllDTypes)];
    const std::vector<int64_t> shape = random_shape(rng, 4, 1, 5);
    std::vector<int64_t> perm = {0, 1, 2, 3};
    std::shuffle(perm.begin(), perm.end(), rng);
    const Tensor x = random_tensor(dtype, shape, rng);
    const Tensor y =
        run1({.op = "Transpose", .inputs = {runtime_input(x)}, .attrs = {{"perm", perm}}});
    ASSERT_EQ(y.shape(), (std::vector<int64_t>{shape[perm[0]], shape[perm[1]], shape[perm[2]],
                                               shape[perm[3]]}));
    EXPECT_TRUE(each_element_from(y, x,
                                  [&](const std::vector<int64_t>& j) {
                                    std::vector<int64_t> i(4);
                                    for (std::size_t k = 0; k < 4; ++k)
                                      i[static_cast<std::size_t>(perm[k])] = j[k];
                                    return ravel(i, shape);
                                  }))
        << "dtype " << to_string(dtype) << ", perm " << fmt::format("{}", fmt::join(perm, ","));
  }
}

TEST(ReferenceTensor, TransposeWithoutPermReversesAxes) {
  std::mt19937 rng(2);
  const Tensor x = random_tensor(DType::kFloat32, {2, 3, 4}, rng);
  const Tensor y = run1({.op = "Transpose", .inputs = {runtime_input(x)}});
  ASSERT_EQ(y.shape(), (std::vector<int64_t>{4, 3, 2}));
  EXPECT_TRUE(each_element_from(y, x, [&](const std::vector<int64_t>& j) {
    return ravel({j[2], j[1], j[0]}, x.shape());
  }));
}

TEST(ReferenceTensor, TransposeRejectsPermsThatAreNotPermutations) {
  const Tensor x = Tensor::zeros(DType::kFloat32, {2, 3, 4});
  for (const std::vector<int64_t>& perm :
       std::vector<std::vector<int64_t>>{{0, 0, 1}, {0, 1}, {0, 1, 3}, {-1, 0, 1}, {0, 1, 2, 3}}) {
    expect_error({.op = "Transpose", .inputs = {runtime_input(x)}, .attrs = {{"perm", perm}}},
                 ErrorCode::kInvalidModel, {"perm", "not a permutation"});
  }
}

// ---- Slice ----

// The elements ONNX Slice reads along an axis of `dim`, by enumeration. The clamping follows
// the spec (and onnxruntime): for negative steps the start is clamped to [0, dim - 1], where
// Python would clamp a start before the beginning to -1 and read nothing.
std::vector<int64_t> onnx_slice(int64_t start, int64_t end, int64_t step, int64_t dim) {
  if (dim == 0) return {};
  if (start < 0) start += dim;
  if (end < 0) end += dim;
  if (step > 0) {
    start = std::clamp<int64_t>(start, 0, dim);
    end = std::clamp<int64_t>(end, 0, dim);
  } else {
    start = std::clamp<int64_t>(start, 0, dim - 1);
    end = std::clamp<int64_t>(end, -1, dim - 1);
  }
  std::vector<int64_t> picked;
  for (int64_t i = start; step > 0 ? i < end : i > end; i += step) picked.push_back(i);
  return picked;
}

TEST(ReferenceTensor, SliceWithRandomStartsEndsAndStepsMatchesEnumeration) {
  std::mt19937 rng(3);
  for (int trial = 0; trial < 200; ++trial) {
    const int rank = static_cast<int>(uniform(rng, 1, 4));
    const std::vector<int64_t> shape = random_shape(rng, rank, 0, 6);
    const Tensor x = random_tensor(DType::kInt64, shape, rng);
    std::vector<int64_t> axes(static_cast<std::size_t>(rank));
    std::iota(axes.begin(), axes.end(), 0);
    std::shuffle(axes.begin(), axes.end(), rng);
    axes.resize(static_cast<std::size_t>(uniform(rng, 1, rank)));
    std::vector<int64_t> starts, ends, steps;
    const auto position = [&](int64_t dim) {
      switch (uniform(rng, 0, 9)) {
        case 0:
          return kMax;
        case 1:
          return kMin;
        default:
          return uniform(rng, -dim - 3, dim + 3);
      }
    };
    for (int64_t a : axes) {
      starts.push_back(position(shape[static_cast<std::size_t>(a)]));
      ends.push_back(position(shape[static_cast<std::size_t>(a)]));
      int64_t step = 0;
      while (step == 0) step = uniform(rng, -3, 3);
      steps.push_back(step);
    }
    // Axes given as negative numbers half of the time, indices as int32 a third of the time.
    std::vector<int64_t> named_axes = axes;
    if (trial % 2 == 0) {
      for (int64_t& a : named_axes) a -= rank;
    }
    const auto index_tensor = [&](const std::vector<int64_t>& v) {
      if (trial % 3 != 0) return ints(v);
      std::vector<int32_t> narrow;
      for (int64_t e : v)
        narrow.push_back(static_cast<int32_t>(std::clamp<int64_t>(e, INT32_MIN, INT32_MAX)));
      return make<int32_t>({static_cast<int64_t>(v.size())}, narrow);
    };
    std::vector<std::vector<int64_t>> picked(static_cast<std::size_t>(rank));
    for (int a = 0; a < rank; ++a) {
      picked[static_cast<std::size_t>(a)] =
          onnx_slice(0, kMax, 1, shape[static_cast<std::size_t>(a)]);
    }
    for (std::size_t k = 0; k < axes.size(); ++k) {
      const auto a = static_cast<std::size_t>(axes[k]);
      const Tensor s = index_tensor({starts[k]}), e = index_tensor({ends[k]});
      // The int32 case clamps the extremes; slice them the way the tensor says.
      picked[a] = onnx_slice(trial % 3 == 0 ? values<int32_t>(s)[0] : starts[k],
                             trial % 3 == 0 ? values<int32_t>(e)[0] : ends[k], steps[k], shape[a]);
    }
    const Tensor y = run1(
        {.op = "Slice",
         .inputs = {runtime_input(x), constant(index_tensor(starts)), constant(index_tensor(ends)),
                    constant(index_tensor(named_axes)), constant(index_tensor(steps))}});
    std::vector<int64_t> expected_shape;
    for (const auto& p : picked) expected_shape.push_back(static_cast<int64_t>(p.size()));
    ASSERT_EQ(y.shape(), expected_shape)
        << "shape " << fmt::format("{}", fmt::join(shape, ",")) << " trial " << trial;
    EXPECT_TRUE(each_element_from(y, x,
                                  [&](const std::vector<int64_t>& j) {
                                    std::vector<int64_t> i(j.size());
                                    for (std::size_t a = 0; a < j.size(); ++a)
                                      i[a] = picked[a][static_cast<std::size_t>(j[a])];
                                    return ravel(i, shape);
                                  }))
        << "trial " << trial;
  }
}

TEST(ReferenceTensor, SliceWithoutAxesAndStepsUsesLeadingAxesAndUnitSteps) {
  const Tensor x = make<int64_t>({3, 4}, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11});
  const Tensor y = run1({.op = "Slice",
                         .inputs = {runtime_input(x), constant(ints({1, -3})),
                                    constant(ints({kMax, -1})), omitted(), omitted()}});
  ASSERT_EQ(y.shape(), (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(values<int64_t>(y), (std::vector<int64_t>{5, 6, 9, 10}));
}

TEST(ReferenceTensor, SliceWithNegativeStepToMinimumReversesTheAxis) {
  const Tensor x = make<int64_t>({5}, {10, 11, 12, 13, 14});
  const Tensor y = run1({.op = "Slice",
                         .inputs = {runtime_input(x), constant(ints({-1})), constant(ints({kMin})),
                                    constant(ints({0})), constant(ints({-1}))}});
  EXPECT_EQ(values<int64_t>(y), (std::vector<int64_t>{14, 13, 12, 11, 10}));
}

TEST(ReferenceTensor, SliceRejectsZeroStepsAndRepeatedAxes) {
  const Tensor x = Tensor::zeros(DType::kFloat32, {4, 4});
  expect_error({.op = "Slice",
                .inputs = {runtime_input(x), constant(ints({0})), constant(ints({2})),
                           constant(ints({0})), constant(ints({0}))}},
               ErrorCode::kInvalidModel, {"steps"});
  expect_error({.op = "Slice",
                .inputs = {runtime_input(x), constant(ints({0, 0})), constant(ints({2, 2})),
                           constant(ints({1, -1}))}},
               ErrorCode::kInvalidModel, {"more than once"});
  expect_error(
      {.op = "Slice",
       .inputs = {runtime_input(x), constant(ints({0})), constant(ints({2})), constant(ints({2}))}},
      ErrorCode::kInvalidModel, {"out of range"});
}

// ---- Concat and Split ----

TEST(ReferenceTensor, SplitThenConcatRoundTripsAndPartsMatchIndexArithmetic) {
  std::mt19937 rng(4);
  for (int trial = 0; trial < 40; ++trial) {
    const int rank = static_cast<int>(uniform(rng, 1, 4));
    const std::vector<int64_t> shape = random_shape(rng, rank, 1, 6);
    const int64_t axis = uniform(rng, -rank, rank - 1);
    const auto a = static_cast<std::size_t>(axis < 0 ? axis + rank : axis);
    // Random sizes summing to the axis, zero-sized parts included.
    std::vector<int64_t> sizes;
    for (int64_t left = shape[a]; left > 0;) {
      sizes.push_back(uniform(rng, 0, left));
      left -= sizes.back();
    }
    const DType dtype = kAllDTypes[trial % std::size(kAllDTypes)];
    const Tensor x = random_tensor(dtype, shape, rng);
    // Opset 11 takes the sizes as an attribute, opset 13 as an input.
    const bool attribute = trial % 2 == 0;
    OpSpec split{.op = "Split",
                 .inputs = {runtime_input(x)},
                 .attrs = {{"axis", axis}},
                 .outputs = sizes.size(),
                 .opset = attribute ? 11 : 13};
    if (attribute) {
      split.attrs["split"] = sizes;
    } else {
      split.inputs.push_back(constant(ints(sizes)));
    }
    const std::vector<Tensor> parts = run(split);
    ASSERT_EQ(parts.size(), sizes.size());
    int64_t offset = 0;
    for (std::size_t k = 0; k < parts.size(); ++k) {
      std::vector<int64_t> expected = shape;
      expected[a] = sizes[k];
      ASSERT_EQ(parts[k].shape(), expected);
      EXPECT_TRUE(each_element_from(parts[k], x,
                                    [&](std::vector<int64_t> j) {
                                      j[a] += offset;
                                      return ravel(j, shape);
                                    }))
          << "part " << k << " of trial " << trial;
      offset += sizes[k];
    }
    std::vector<Operand> pieces;
    for (const Tensor& p : parts) pieces.push_back(runtime_input(p));
    const Tensor joined = run1({.op = "Concat", .inputs = pieces, .attrs = {{"axis", axis}}});
    ASSERT_EQ(joined.shape(), shape);
    EXPECT_EQ(std::memcmp(joined.raw_data(), x.raw_data(), x.nbytes()), 0) << "trial " << trial;
  }
}

TEST(ReferenceTensor, SplitWithoutSizesMakesEqualPartsOrFails) {
  const Tensor x = make<int64_t>({2, 6}, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11});
  const std::vector<Tensor> parts = run(
      {.op = "Split", .inputs = {runtime_input(x)}, .attrs = {{"axis", int64_t{1}}}, .outputs = 3});
  ASSERT_EQ(parts.size(), 3u);
  EXPECT_EQ(values<int64_t>(parts[1]), (std::vector<int64_t>{2, 3, 8, 9}));
  expect_error(
      {.op = "Split", .inputs = {runtime_input(x)}, .attrs = {{"axis", int64_t{1}}}, .outputs = 4},
      ErrorCode::kShapeMismatch, {"4 equal parts"});
  expect_error({.op = "Split",
                .inputs = {runtime_input(x), constant(ints({2, 2}))},
                .attrs = {{"axis", int64_t{1}}},
                .outputs = 2},
               ErrorCode::kShapeMismatch, {"sums to 4", "size 6"});
}

TEST(ReferenceTensor, ConcatRejectsMismatchedShapesAndDtypes) {
  const Tensor a = Tensor::zeros(DType::kFloat32, {2, 3});
  expect_error({.op = "Concat",
                .inputs = {runtime_input(a), runtime_input(Tensor::zeros(DType::kFloat32, {3, 3}))},
                .attrs = {{"axis", int64_t{1}}}},
               ErrorCode::kShapeMismatch, {"input 1", "[3, 3]"});
  expect_error({.op = "Concat",
                .inputs = {runtime_input(a), runtime_input(Tensor::zeros(DType::kInt64, {2, 3}))},
                .attrs = {{"axis", int64_t{0}}}},
               ErrorCode::kDtypeMismatch, {"int64"});
  expect_error({.op = "Concat", .inputs = {runtime_input(a)}, .attrs = {{"axis", int64_t{2}}}},
               ErrorCode::kInvalidModel, {"axis 2"});
}

// ---- Gather and GatherElements ----

TEST(ReferenceTensor, GatherWithNegativeIndicesMatchesIndexArithmetic) {
  std::mt19937 rng(5);
  for (int trial = 0; trial < 60; ++trial) {
    const int rank = static_cast<int>(uniform(rng, 1, 3));
    const std::vector<int64_t> shape = random_shape(rng, rank, 1, 5);
    const int64_t axis = uniform(rng, -rank, rank - 1);
    const auto a = static_cast<std::size_t>(axis < 0 ? axis + rank : axis);
    const std::vector<int64_t> index_shape =
        random_shape(rng, static_cast<int>(uniform(rng, 0, 2)), 0, 3);
    std::vector<int64_t> index_values(static_cast<std::size_t>(checked_numel(index_shape)));
    for (int64_t& i : index_values) i = uniform(rng, -shape[a], shape[a] - 1);
    Tensor indices = make<int64_t>(index_shape, index_values);
    if (trial % 2 == 0) {
      std::vector<int32_t> narrow(index_values.begin(), index_values.end());
      indices = make<int32_t>(index_shape, narrow);
    }
    const Tensor x = random_tensor(kAllDTypes[trial % std::size(kAllDTypes)], shape, rng);
    // Constant indices are checked at inference, run-time ones by the reference op.
    const Operand idx = trial % 3 == 0 ? constant(indices) : runtime_input(indices);
    const Tensor y =
        run1({.op = "Gather", .inputs = {runtime_input(x), idx}, .attrs = {{"axis", axis}}});
    std::vector<int64_t> expected(shape.begin(), shape.begin() + static_cast<std::ptrdiff_t>(a));
    expected.insert(expected.end(), index_shape.begin(), index_shape.end());
    expected.insert(expected.end(), shape.begin() + static_cast<std::ptrdiff_t>(a) + 1,
                    shape.end());
    ASSERT_EQ(y.shape(), expected);
    EXPECT_TRUE(each_element_from(
        y, x,
        [&](const std::vector<int64_t>& j) {
          // j = data[:axis] ++ index position ++ data[axis+1:]
          const auto q = index_shape.size();
          const std::vector<int64_t> position(j.begin() + static_cast<std::ptrdiff_t>(a),
                                              j.begin() + static_cast<std::ptrdiff_t>(a + q));
          int64_t chosen = index_values[static_cast<std::size_t>(ravel(position, index_shape))];
          if (chosen < 0) chosen += shape[a];
          std::vector<int64_t> i(j.begin(), j.begin() + static_cast<std::ptrdiff_t>(a));
          i.push_back(chosen);
          i.insert(i.end(), j.begin() + static_cast<std::ptrdiff_t>(a + q), j.end());
          return ravel(i, shape);
        }))
        << "trial " << trial;
  }
}

TEST(ReferenceTensor, GatherWithConstantOutOfRangeIndexFailsAtInference) {
  const Tensor x = Tensor::zeros(DType::kFloat32, {4, 3});
  expect_error({.op = "Gather", .inputs = {runtime_input(x), constant(ints({0, 4}))}},
               ErrorCode::kInvalidModel, {"index 4", "out of range [-4, 3]"});
  expect_error({.op = "Gather", .inputs = {runtime_input(x), constant(ints({-5}))}},
               ErrorCode::kInvalidModel, {"index -5"});
}

TEST(ReferenceTensor, GatherWithRuntimeOutOfRangeIndexFailsCleanly) {
  // Inference cannot see the indices; the reference op must refuse to read out of bounds.
  const Tensor x = Tensor::zeros(DType::kFloat32, {4, 3});
  expect_error({.op = "Gather",
                .inputs = {runtime_input(x), runtime_input(ints({1, 3}))},
                .attrs = {{"axis", int64_t{1}}}},
               ErrorCode::kInvalidArgument, {"index 3", "element 1", "size 3"});
  expect_error({.op = "Gather", .inputs = {runtime_input(x), runtime_input(ints({kMin}))}},
               ErrorCode::kInvalidArgument, {"out of range"});
}

TEST(ReferenceTensor, GatherAndGatherElementsRejectScalarsAxesAndIndexTypes) {
  const Tensor x = Tensor::zeros(DType::kFloat32, {2, 3});
  for (const char* op : {"Gather", "GatherElements"}) {
    SCOPED_TRACE(op);
    expect_error({.op = op, .inputs = {runtime_input(int_scalar(1)), runtime_input(int_scalar(0))}},
                 ErrorCode::kShapeMismatch, {"cannot gather from a scalar"});
    expect_error({.op = op,
                  .inputs = {runtime_input(x), runtime_input(make<int64_t>({2, 1}, {0, 1}))},
                  .attrs = {{"axis", int64_t{2}}}},
                 ErrorCode::kInvalidModel, {"axis"});
    expect_error({.op = op, .inputs = {runtime_input(x), runtime_input(floats({2, 1}, {0, 1}))}},
                 ErrorCode::kUnsupported, {"input 1", "supported: int32, int64"});
  }
}

TEST(ReferenceTensor, GatherElementsMatchesIndexArithmetic) {
  std::mt19937 rng(6);
  for (int trial = 0; trial < 40; ++trial) {
    const int rank = static_cast<int>(uniform(rng, 1, 3));
    const std::vector<int64_t> shape = random_shape(rng, rank, 1, 5);
    const int64_t axis = uniform(rng, -rank, rank - 1);
    const auto a = static_cast<std::size_t>(axis < 0 ? axis + rank : axis);
    std::vector<int64_t> index_shape(shape.size());
    for (std::size_t d = 0; d < shape.size(); ++d) {
      index_shape[d] = d == a ? uniform(rng, 0, 6) : uniform(rng, 1, shape[d]);
    }
    std::vector<int64_t> index_values(static_cast<std::size_t>(checked_numel(index_shape)));
    for (int64_t& i : index_values) i = uniform(rng, -shape[a], shape[a] - 1);
    const Tensor x = random_tensor(kAllDTypes[trial % std::size(kAllDTypes)], shape, rng);
    const Tensor y =
        run1({.op = "GatherElements",
              .inputs = {runtime_input(x), runtime_input(make<int64_t>(index_shape, index_values))},
              .attrs = {{"axis", axis}}});
    ASSERT_EQ(y.shape(), index_shape);
    EXPECT_TRUE(each_element_from(
        y, x,
        [&](std::vector<int64_t> j) {
          int64_t chosen = index_values[static_cast<std::size_t>(ravel(j, index_shape))];
          j[a] = chosen < 0 ? chosen + shape[a] : chosen;
          return ravel(j, shape);
        }))
        << "trial " << trial;
  }
}

TEST(ReferenceTensor, GatherElementsRejectsOutOfRangeIndicesAndOversizedIndexShapes) {
  const Tensor x = Tensor::zeros(DType::kFloat32, {2, 3});
  expect_error({.op = "GatherElements",
                .inputs = {runtime_input(x), runtime_input(make<int64_t>({2, 1}, {0, 2}))}},
               ErrorCode::kInvalidArgument, {"index 2", "out of range"});
  expect_error({.op = "GatherElements",
                .inputs = {runtime_input(x), runtime_input(make<int64_t>({1, 4}, {0, 0, 0, 0}))}},
               ErrorCode::kShapeMismatch, {"no larger"});
}

// ---- ScatterND ----

// ScatterND by its definition: a copy of data, then each index tuple's slice of data[k:] combined
// with its slice of updates, tuples in order.
template <typename T>
std::vector<T> scatter_nd_by_definition(const std::vector<T>& data,
                                        const std::vector<int64_t>& shape,
                                        const std::vector<int64_t>& tuples, std::size_t k,
                                        const std::vector<T>& updates,
                                        const std::string& reduction) {
  std::vector<T> out = data;
  int64_t slice = 1;
  for (std::size_t a = k; a < shape.size(); ++a) slice *= shape[a];
  const std::size_t count =
      k == 0 ? updates.size() / static_cast<std::size_t>(slice) : tuples.size() / k;
  for (std::size_t t = 0; t < count; ++t) {
    std::vector<int64_t> at(shape.size(), 0);
    for (std::size_t a = 0; a < k; ++a) {
      const int64_t i = tuples[t * k + a];
      at[a] = i < 0 ? i + shape[a] : i;
    }
    const auto base = static_cast<std::size_t>(ravel(at, shape));
    for (int64_t j = 0; j < slice; ++j) {
      T& o = out[base + static_cast<std::size_t>(j)];
      const T u = updates[t * static_cast<std::size_t>(slice) + static_cast<std::size_t>(j)];
      o = reduction == "add"   ? o + u
          : reduction == "mul" ? o * u
          : reduction == "max" ? std::max(o, u)
          : reduction == "min" ? std::min(o, u)
                               : u;
    }
  }
  return out;
}

TEST(ReferenceTensor, ScatterNdMatchesItsDefinition) {
  std::mt19937 rng(11);
  const char* reductions[] = {"none", "add", "mul", "max", "min"};
  for (int trial = 0; trial < 80; ++trial) {
    const int rank = static_cast<int>(uniform(rng, 1, 3));
    const std::vector<int64_t> shape = random_shape(rng, rank, 1, 4);
    const auto k = static_cast<std::size_t>(uniform(rng, 0, rank));
    std::vector<int64_t> index_shape =
        random_shape(rng, static_cast<int>(uniform(rng, 0, 2)), 1, 4);
    index_shape.push_back(static_cast<int64_t>(k));
    std::vector<int64_t> tuples(static_cast<std::size_t>(checked_numel(index_shape)));
    for (std::size_t i = 0; i < tuples.size(); ++i) {
      const int64_t dim = shape[i % k];
      tuples[i] = uniform(rng, -dim, dim - 1);  // repeated tuples too
    }
    std::vector<int64_t> update_shape(index_shape.begin(), index_shape.end() - 1);
    update_shape.insert(update_shape.end(), shape.begin() + static_cast<std::ptrdiff_t>(k),
                        shape.end());
    const std::string reduction = reductions[trial % std::size(reductions)];
    const Tensor data = test::random_tensor(shape, static_cast<uint32_t>(2 * trial));
    const Tensor updates = test::random_tensor(update_shape, static_cast<uint32_t>(2 * trial + 1));
    // Constant indices are checked at inference, run-time ones by the reference op.
    const Tensor indices = make<int64_t>(index_shape, tuples);
    const Tensor y = run1({.op = "ScatterND",
                           .inputs = {runtime_input(data),
                                      trial % 3 == 0 ? constant(indices) : runtime_input(indices),
                                      runtime_input(updates)},
                           .attrs = {{"reduction", reduction}},
                           .opset = 16});
    ASSERT_EQ(y.shape(), shape);
    EXPECT_EQ(values<float>(y), scatter_nd_by_definition(values<float>(data), shape, tuples, k,
                                                         values<float>(updates), reduction))
        << "trial " << trial << ", " << reduction << ", k " << k;
  }
}

TEST(ReferenceTensor, ScatterNdAddsIntegersAndAssignsAnyDtype) {
  const Tensor data = make<int64_t>({4}, {1, 2, 3, 4});
  const Tensor indices = make<int64_t>({3, 1}, {3, -1, 0});
  const Tensor y = run1({.op = "ScatterND",
                         .inputs = {runtime_input(data), runtime_input(indices),
                                    runtime_input(make<int64_t>({3}, {10, 20, 30}))},
                         .attrs = {{"reduction", std::string("add")}},
                         .opset = 16});
  EXPECT_EQ(values<int64_t>(y), (std::vector<int64_t>{31, 2, 3, 34}));
  const Tensor flags = make<bool>({2, 2}, {false, false, false, false});
  const Tensor z = run1({.op = "ScatterND",
                         .inputs = {runtime_input(flags), runtime_input(make<int64_t>({1, 1}, {1})),
                                    runtime_input(make<bool>({1, 2}, {true, false}))}});
  EXPECT_EQ(values<bool>(z), (std::vector<bool>{false, false, true, false}));
}

TEST(ReferenceTensor, ScatterNdRejectsBadIndicesShapesAndReductions) {
  const Tensor x = Tensor::zeros(DType::kFloat32, {2, 3});
  const Tensor row = Tensor::zeros(DType::kFloat32, {1, 3});
  expect_error(
      {.op = "ScatterND",
       .inputs = {runtime_input(x), runtime_input(make<int64_t>({1, 1}, {2})), runtime_input(row)}},
      ErrorCode::kInvalidArgument, {"index 2", "tuple 0", "out of range [-2, 1]"});
  expect_error({.op = "ScatterND",
                .inputs = {runtime_input(x), constant(make<int64_t>({1, 2}, {0, -4})),
                           runtime_input(Tensor::zeros(DType::kFloat32, {1}))}},
               ErrorCode::kInvalidModel, {"index -4", "component 1"});
  expect_error({.op = "ScatterND",
                .inputs = {runtime_input(x), runtime_input(make<int64_t>({1, 1}, {0})),
                           runtime_input(Tensor::zeros(DType::kFloat32, {1, 2}))}},
               ErrorCode::kShapeMismatch, {"updates have shape [1, 2], expected [1, 3]"});
  expect_error({.op = "ScatterND",
                .inputs = {runtime_input(x), runtime_input(make<int64_t>({1, 3}, {0, 0, 0})),
                           runtime_input(Tensor::zeros(DType::kFloat32, {1}))}},
               ErrorCode::kShapeMismatch, {"no longer than the rank"});
  expect_error(
      {.op = "ScatterND",
       .inputs = {runtime_input(x), runtime_input(make<int32_t>({1, 1}, {0})), runtime_input(row)}},
      ErrorCode::kUnsupported, {"input 1", "int64"});
  expect_error({.op = "ScatterND",
                .inputs = {runtime_input(x), runtime_input(make<int64_t>({1, 1}, {0})),
                           runtime_input(Tensor::zeros(DType::kInt64, {1, 3}))}},
               ErrorCode::kDtypeMismatch, {"updates are int64 but data is float32"});
  expect_error(
      {.op = "ScatterND",
       .inputs = {runtime_input(x), runtime_input(make<int64_t>({1, 1}, {0})), runtime_input(row)},
       .attrs = {{"reduction", std::string("sum")}},
       .opset = 16},
      ErrorCode::kInvalidModel, {"reduction 'sum'"});
}

// ---- Reshape, Flatten, Squeeze, Unsqueeze ----

std::vector<int64_t> reshaped_shape(const Tensor& x, const std::vector<int64_t>& target,
                                    int64_t allowzero = 0) {
  const Tensor y = run1({.op = "Reshape",
                         .inputs = {runtime_input(x), constant(ints(target))},
                         .attrs = {{"allowzero", allowzero}},
                         .opset = 14});
  EXPECT_EQ(std::memcmp(y.raw_data(), x.raw_data(), x.nbytes()), 0);
  return y.shape();
}

TEST(ReferenceTensor, ReshapeCopiesZerosAndInfersMinusOne) {
  std::mt19937 rng(7);
  const Tensor x = random_tensor(DType::kFloat32, {2, 3, 4}, rng);
  EXPECT_EQ(reshaped_shape(x, {0, -1}), (std::vector<int64_t>{2, 12}));
  EXPECT_EQ(reshaped_shape(x, {-1, 0}), (std::vector<int64_t>{8, 3}));
  EXPECT_EQ(reshaped_shape(x, {0, 0, 2, 2}), (std::vector<int64_t>{2, 3, 2, 2}));
  EXPECT_EQ(reshaped_shape(x, {24}), (std::vector<int64_t>{24}));
  // allowzero: 0 is a real size, legal here because the input is empty too.
  const Tensor empty = Tensor::zeros(DType::kFloat32, {0, 3});
  EXPECT_EQ(reshaped_shape(empty, {3, 0}, 1), (std::vector<int64_t>{3, 0}));
  // Without allowzero the same 0 copies the input's 3: [3, 3] holds 9 elements, not 0.
  expect_error({.op = "Reshape", .inputs = {runtime_input(empty), constant(ints({3, 0}))}},
               ErrorCode::kShapeMismatch, {"0 elements", "9 elements"});
}

TEST(ReferenceTensor, ReshapeRejectsBadTargets) {
  const Tensor x = Tensor::zeros(DType::kFloat32, {2, 3, 4});
  const auto reshape = [&](const std::vector<int64_t>& target) {
    return OpSpec{.op = "Reshape", .inputs = {runtime_input(x), constant(ints(target))}};
  };
  expect_error(reshape({5, 5}), ErrorCode::kShapeMismatch, {"24 elements", "25 elements"});
  expect_error(reshape({-1, -1}), ErrorCode::kInvalidModel, {"more than one -1"});
  expect_error(reshape({5, -1}), ErrorCode::kShapeMismatch, {"cannot infer the -1"});
  expect_error(reshape({0, 0, 0, 0}), ErrorCode::kShapeMismatch, {"copies dimension 3"});
  expect_error(reshape({-2, 12}), ErrorCode::kInvalidModel, {"negative dimension -2"});
  expect_error(reshape({kMax, kMax}), ErrorCode::kShapeMismatch, {"overflows"});
  expect_error({.op = "Reshape", .inputs = {runtime_input(x), runtime_input(ints({24}))}},
               ErrorCode::kUnsupported, {"must be a constant"});
}

TEST(ReferenceTensor, FlattenAcceptsNegativeAxisAndAxisEqualToRank) {
  const Tensor x = Tensor::zeros(DType::kInt8, {2, 3, 4, 5});
  const auto flat = [&](int64_t axis) {
    return run1({.op = "Flatten", .inputs = {runtime_input(x)}, .attrs = {{"axis", axis}}}).shape();
  };
  EXPECT_EQ(flat(-1), (std::vector<int64_t>{24, 5}));
  EXPECT_EQ(flat(0), (std::vector<int64_t>{1, 120}));
  EXPECT_EQ(flat(4), (std::vector<int64_t>{120, 1}));
  EXPECT_EQ(flat(-4), (std::vector<int64_t>{1, 120}));
  expect_error({.op = "Flatten", .inputs = {runtime_input(x)}, .attrs = {{"axis", int64_t{5}}}},
               ErrorCode::kInvalidModel, {"axis 5"});
}

TEST(ReferenceTensor, SqueezeAndUnsqueezeTakeAxesFromAttributeBeforeOpset13AndInputAfter) {
  const Tensor x = Tensor::zeros(DType::kFloat32, {1, 3, 1, 2});
  const std::vector<int64_t> axes = {0, -2};
  EXPECT_EQ(
      run1({.op = "Squeeze", .inputs = {runtime_input(x)}, .attrs = {{"axes", axes}}, .opset = 11})
          .shape(),
      (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(run1({.op = "Squeeze", .inputs = {runtime_input(x), constant(ints(axes))}}).shape(),
            (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(run1({.op = "Squeeze", .inputs = {runtime_input(x)}}).shape(),
            (std::vector<int64_t>{3, 2}));
  expect_error({.op = "Squeeze", .inputs = {runtime_input(x), constant(ints({1}))}},
               ErrorCode::kShapeMismatch, {"axis 1", "size is 3"});

  const Tensor y = Tensor::zeros(DType::kFloat32, {3, 2});
  const std::vector<int64_t> where = {-1, 0, 2};
  EXPECT_EQ(run1({.op = "Unsqueeze",
                  .inputs = {runtime_input(y)},
                  .attrs = {{"axes", where}},
                  .opset = 11})
                .shape(),
            (std::vector<int64_t>{1, 3, 1, 2, 1}));
  EXPECT_EQ(run1({.op = "Unsqueeze", .inputs = {runtime_input(y), constant(ints(where))}}).shape(),
            (std::vector<int64_t>{1, 3, 1, 2, 1}));
  expect_error({.op = "Unsqueeze", .inputs = {runtime_input(y), constant(ints({1, 1}))}},
               ErrorCode::kInvalidModel, {"more than once"});
  expect_error({.op = "Unsqueeze", .inputs = {runtime_input(y), constant(ints({3}))}},
               ErrorCode::kInvalidModel, {"out of range"});
}

// ---- Pad ----

std::vector<int64_t> pad1d(const std::string& mode, std::vector<int64_t> pads) {
  const Tensor x = make<int64_t>({3}, {1, 2, 3});
  return values<int64_t>(
      run1({.op = "Pad",
            .inputs = {runtime_input(x), constant(ints(pads)), constant(int_scalar(9))},
            .attrs = {{"mode", mode}}}));
}

TEST(ReferenceTensor, PadModesOnAHandCheckedVector) {
  using V = std::vector<int64_t>;
  EXPECT_EQ(pad1d("constant", {2, 2}), (V{9, 9, 1, 2, 3, 9, 9}));
  EXPECT_EQ(pad1d("reflect", {2, 2}), (V{3, 2, 1, 2, 3, 2, 1}));
  EXPECT_EQ(pad1d("edge", {2, 2}), (V{1, 1, 1, 2, 3, 3, 3}));
  EXPECT_EQ(pad1d("wrap", {2, 2}), (V{2, 3, 1, 2, 3, 1, 2}));
  // Reflection beyond one period keeps bouncing, as numpy.pad does.
  EXPECT_EQ(pad1d("reflect", {4, 0}), (V{1, 2, 3, 2, 1, 2, 3}));
  // Negative pads crop.
  EXPECT_EQ(pad1d("constant", {-1, 1}), (V{2, 3, 9}));
  EXPECT_EQ(pad1d("edge", {-2, -1}), (V{}));
}

TEST(ReferenceTensor, PadTwoDimensionalReflectAndDefaultZero) {
  const Tensor x = floats({2, 3}, {1, 2, 3, 4, 5, 6});
  const Tensor reflected = run1({.op = "Pad",
                                 .inputs = {runtime_input(x), constant(ints({1, 1, 1, 0}))},
                                 .attrs = {{"mode", std::string("reflect")}}});
  ASSERT_EQ(reflected.shape(), (std::vector<int64_t>{4, 4}));
  EXPECT_EQ(values<float>(reflected),
            (std::vector<float>{5, 4, 5, 6, 2, 1, 2, 3, 5, 4, 5, 6, 2, 1, 2, 3}));
  const Tensor zero_padded =
      run1({.op = "Pad", .inputs = {runtime_input(x), constant(ints({0, 1, 0, 0}))}});
  EXPECT_EQ(values<float>(zero_padded), (std::vector<float>{0, 1, 2, 3, 0, 4, 5, 6}));
  // Opset 2: pads and value as attributes.
  const Tensor attr_padded =
      run1({.op = "Pad",
            .inputs = {runtime_input(x)},
            .attrs = {{"pads", std::vector<int64_t>{0, 0, 1, 0}}, {"value", 7.0f}},
            .opset = 2});
  EXPECT_EQ(values<float>(attr_padded), (std::vector<float>{1, 2, 3, 4, 5, 6, 7, 7, 7}));
}

TEST(ReferenceTensor, PadRejectsBadPadsAndModes) {
  const Tensor x = Tensor::zeros(DType::kFloat32, {2, 3});
  expect_error({.op = "Pad", .inputs = {runtime_input(x), constant(ints({1, 1}))}},
               ErrorCode::kInvalidModel, {"2 values", "= 4"});
  expect_error({.op = "Pad", .inputs = {runtime_input(x), constant(ints({0, -4, 0, 0}))}},
               ErrorCode::kShapeMismatch, {"below zero"});
  expect_error({.op = "Pad",
                .inputs = {runtime_input(x), constant(ints({0, 0, 0, 0}))},
                .attrs = {{"mode", std::string("mirror")}}},
               ErrorCode::kUnsupported, {"mirror"});
  expect_error({.op = "Pad",
                .inputs = {runtime_input(Tensor::zeros(DType::kFloat32, {0, 3})),
                           constant(ints({1, 0, 0, 0}))},
                .attrs = {{"mode", std::string("edge")}}},
               ErrorCode::kShapeMismatch, {"empty axis 0"});
  expect_error({.op = "Pad", .inputs = {runtime_input(x), constant(ints({0, kMax, 0, 0}))}},
               ErrorCode::kShapeMismatch, {"overflows"});
}

// ---- Expand and Tile ----

TEST(ReferenceTensor, ExpandMatchesExplicitBroadcastLoops) {
  std::mt19937 rng(8);
  for (int trial = 0; trial < 40; ++trial) {
    const int rank = static_cast<int>(uniform(rng, 1, 4));
    std::vector<int64_t> target = random_shape(rng, rank, 1, 4);
    // The input: a suffix of the target's axes, each either the target's size or 1.
    const int in_rank = static_cast<int>(uniform(rng, 0, rank));
    std::vector<int64_t> shape(target.end() - in_rank, target.end());
    for (int64_t& d : shape) d = uniform(rng, 0, 1) ? 1 : d;
    // ... and the requested shape may itself say 1 where the input is larger.
    std::vector<int64_t> request = target;
    for (int k = 0; k < in_rank; ++k) {
      const auto t = static_cast<std::size_t>(rank - in_rank + k);
      if (uniform(rng, 0, 3) == 0) request[t] = 1;
      target[t] = std::max(request[t], shape[static_cast<std::size_t>(k)]);
    }
    const Tensor x = random_tensor(kAllDTypes[trial % std::size(kAllDTypes)], shape, rng);
    const Tensor y = run1({.op = "Expand", .inputs = {runtime_input(x), constant(ints(request))}});
    ASSERT_EQ(y.shape(), target);
    EXPECT_TRUE(each_element_from(y, x,
                                  [&](const std::vector<int64_t>& j) {
                                    std::vector<int64_t> i;
                                    for (int k = 0; k < in_rank; ++k) {
                                      i.push_back(
                                          shape[static_cast<std::size_t>(k)] == 1
                                              ? 0
                                              : j[static_cast<std::size_t>(rank - in_rank + k)]);
                                    }
                                    return ravel(i, shape);
                                  }))
        << "trial " << trial;
  }
}

TEST(ReferenceTensor, TileMatchesExplicitModuloLoops) {
  std::mt19937 rng(9);
  for (int trial = 0; trial < 40; ++trial) {
    const int rank = static_cast<int>(uniform(rng, 1, 4));
    const std::vector<int64_t> shape = random_shape(rng, rank, 1, 4);
    const std::vector<int64_t> repeats = random_shape(rng, rank, 0, 3);
    const Tensor x = random_tensor(kAllDTypes[trial % std::size(kAllDTypes)], shape, rng);
    const Tensor y = run1({.op = "Tile", .inputs = {runtime_input(x), constant(ints(repeats))}});
    std::vector<int64_t> expected(shape.size());
    for (std::size_t a = 0; a < shape.size(); ++a) expected[a] = shape[a] * repeats[a];
    ASSERT_EQ(y.shape(), expected);
    EXPECT_TRUE(each_element_from(y, x,
                                  [&](std::vector<int64_t> j) {
                                    for (std::size_t a = 0; a < j.size(); ++a) j[a] %= shape[a];
                                    return ravel(j, shape);
                                  }))
        << "trial " << trial;
  }
}

TEST(ReferenceTensor, ExpandAndTileRefuseShapesThatOverflow) {
  const Tensor x = Tensor::zeros(DType::kFloat32, {1, 1});
  expect_error({.op = "Expand",
                .inputs = {runtime_input(x), constant(ints({int64_t{1} << 40, int64_t{1} << 40}))}},
               ErrorCode::kShapeMismatch, {"overflows"});
  expect_error(
      {.op = "Expand",
       .inputs = {runtime_input(Tensor::zeros(DType::kFloat32, {3})), constant(ints({2}))}},
      ErrorCode::kShapeMismatch, {"do not broadcast"});
  expect_error({.op = "Tile",
                .inputs = {runtime_input(Tensor::zeros(DType::kFloat32, {3, 1})),
                           constant(ints({kMax, 1}))}},
               ErrorCode::kShapeMismatch, {"overflows"});
  expect_error({.op = "Tile", .inputs = {runtime_input(x), constant(ints({2}))}},
               ErrorCode::kShapeMismatch, {"one value per axis"});
}

// ---- Shape, Size, Constant, ConstantOfShape, Range ----

TEST(ReferenceTensor, ShapeHonoursStartAndEnd) {
  const Tensor x = Tensor::zeros(DType::kUInt8, {2, 3, 4, 5});
  const auto shape_of = [&](std::map<std::string, graph::AttrValue> attrs) {
    return values<int64_t>(
        run1({.op = "Shape", .inputs = {runtime_input(x)}, .attrs = attrs, .opset = 15}));
  };
  using V = std::vector<int64_t>;
  EXPECT_EQ(shape_of({}), (V{2, 3, 4, 5}));
  EXPECT_EQ(shape_of({{"start", int64_t{1}}}), (V{3, 4, 5}));
  EXPECT_EQ(shape_of({{"start", int64_t{-3}}, {"end", int64_t{-1}}}), (V{3, 4}));
  EXPECT_EQ(shape_of({{"end", int64_t{10}}}), (V{2, 3, 4, 5}));
  EXPECT_EQ(shape_of({{"start", int64_t{3}}, {"end", int64_t{1}}}), (V{}));
  EXPECT_EQ(shape_of({{"start", int64_t{-10}}, {"end", int64_t{1}}}), (V{2}));
  const Tensor size = run1({.op = "Size", .inputs = {runtime_input(x)}});
  EXPECT_EQ(size.shape(), (std::vector<int64_t>{}));
  EXPECT_EQ(values<int64_t>(size), (V{120}));
}

TEST(ReferenceTensor, ConstantBuildsEachAttributeKind) {
  const Tensor held = floats({2}, {1.5f, -2.0f});
  EXPECT_EQ(values<float>(run1({.op = "Constant", .attrs = {{"value", held}}})),
            values<float>(held));
  const Tensor f = run1({.op = "Constant", .attrs = {{"value_float", 0.25f}}});
  EXPECT_EQ(f.shape(), (std::vector<int64_t>{}));
  EXPECT_EQ(values<float>(f), (std::vector<float>{0.25f}));
  EXPECT_EQ(values<float>(
                run1({.op = "Constant", .attrs = {{"value_floats", std::vector<float>{1, 2}}}})),
            (std::vector<float>{1, 2}));
  EXPECT_EQ(values<int64_t>(run1({.op = "Constant", .attrs = {{"value_int", int64_t{-7}}}})),
            (std::vector<int64_t>{-7}));
  EXPECT_EQ(values<int64_t>(
                run1({.op = "Constant", .attrs = {{"value_ints", std::vector<int64_t>{3, 4}}}})),
            (std::vector<int64_t>{3, 4}));
  expect_error({.op = "Constant", .attrs = {{"sparse_value", held}}}, ErrorCode::kUnsupported,
               {"sparse"});
  expect_error({.op = "Constant"}, ErrorCode::kInvalidModel, {"exactly one", "got 0"});
  expect_error({.op = "Constant", .attrs = {{"value_int", int64_t{1}}, {"value_float", 1.0f}}},
               ErrorCode::kInvalidModel, {"got 2"});
}

TEST(ReferenceTensor, ConstantOfShapeFillsWithTheValueOrFloatZero) {
  const Tensor zeros = run1({.op = "ConstantOfShape", .inputs = {constant(ints({2, 3}))}});
  EXPECT_EQ(zeros.dtype(), DType::kFloat32);
  EXPECT_EQ(values<float>(zeros), std::vector<float>(6, 0.0f));
  const Tensor sevens = run1({.op = "ConstantOfShape",
                              .inputs = {constant(ints({3}))},
                              .attrs = {{"value", make<int32_t>({1}, {7})}}});
  EXPECT_EQ(values<int32_t>(sevens), (std::vector<int32_t>{7, 7, 7}));
  const Tensor scalar = run1({.op = "ConstantOfShape",
                              .inputs = {constant(ints({}))},
                              .attrs = {{"value", make<int64_t>({1}, {5})}}});
  EXPECT_EQ(scalar.shape(), (std::vector<int64_t>{}));
  EXPECT_EQ(values<int64_t>(scalar), (std::vector<int64_t>{5}));
  expect_error({.op = "ConstantOfShape", .inputs = {constant(ints({int64_t{1} << 62, 4}))}},
               ErrorCode::kShapeMismatch, {"overflows"});
  expect_error({.op = "ConstantOfShape", .inputs = {constant(ints({-1}))}},
               ErrorCode::kShapeMismatch, {"negative"});
}

TEST(ReferenceTensor, RangeCountsLikeCeilingDivision) {
  const auto range = [](auto start, auto limit, auto delta) {
    using T = decltype(start);
    return values<T>(
        run1({.op = "Range",
              .inputs = {constant(make<T>({}, {start})), constant(make<T>({}, {limit})),
                         constant(make<T>({}, {delta}))}}));
  };
  EXPECT_EQ(range(int64_t{0}, int64_t{5}, int64_t{2}), (std::vector<int64_t>{0, 2, 4}));
  EXPECT_EQ(range(int32_t{10}, int32_t{4}, int32_t{-3}), (std::vector<int32_t>{10, 7}));
  EXPECT_EQ(range(int64_t{3}, int64_t{3}, int64_t{1}), (std::vector<int64_t>{}));
  EXPECT_EQ(range(int64_t{5}, int64_t{0}, int64_t{1}), (std::vector<int64_t>{}));
  EXPECT_EQ(range(kMin, kMax, kMax).size(), 3u);  // spans wider than int64 count correctly
  expect_error(
      {.op = "Range",
       .inputs = {constant(int_scalar(kMin)), constant(int_scalar(kMax)), constant(int_scalar(1))}},
      ErrorCode::kShapeMismatch, {"too many elements"});
  EXPECT_EQ(range(1.0f, 2.0f, 0.25f), (std::vector<float>{1.0f, 1.25f, 1.5f, 1.75f}));
  EXPECT_EQ(range(1.0, -1.0, -0.5), (std::vector<double>{1.0, 0.5, 0.0, -0.5}));
  expect_error(
      {.op = "Range",
       .inputs = {constant(int_scalar(0)), constant(int_scalar(1)), constant(int_scalar(0))}},
      ErrorCode::kInvalidModel, {"delta"});
}

// ---- GridSample ----

// A grid for a [rows, cols] output whose point (i, j) lies on pixel (i + dy, j + dx) of an
// [rows, cols] image, normalized the way align_corners says.
Tensor pixel_grid(int64_t rows, int64_t cols, double dy, double dx, bool align_corners) {
  Tensor grid = Tensor::zeros(DType::kFloat32, {1, rows, cols, 2});
  auto normalize = [&](double p, int64_t size) {
    return align_corners ? 2.0 * p / static_cast<double>(size - 1) - 1.0
                         : (2.0 * p + 1.0) / static_cast<double>(size) - 1.0;
  };
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j) {
      grid.data<float>()[(i * cols + j) * 2] = static_cast<float>(normalize(j + dx, cols));
      grid.data<float>()[(i * cols + j) * 2 + 1] = static_cast<float>(normalize(i + dy, rows));
    }
  }
  return grid;
}

Tensor grid_sample(const Tensor& x, const Tensor& grid, const std::string& mode,
                   const std::string& padding, bool align_corners) {
  return run1({.op = "GridSample",
               .inputs = {runtime_input(x), runtime_input(grid)},
               .attrs = {{"mode", mode},
                         {"padding_mode", padding},
                         {"align_corners", int64_t{align_corners}}},
               .opset = 16});
}

// Points on pixel centres give the pixels in every mode; shifted two pixels left, the columns
// off the image read zeros, the border column, or the image mirrored at its edge; halfway
// between two pixels, bilinear gives their mean.
TEST(ReferenceTensor, GridSampleReadsPixelsAndPadsAsItsModeSays) {
  std::mt19937 rng(9);
  Tensor x = Tensor::zeros(DType::kFloat32, {1, 2, 4, 5});
  for (int64_t i = 0; i < x.numel(); ++i)
    x.data<float>()[i] = static_cast<float>(uniform(rng, -9, 9));
  auto pixel = [&](int64_t c, int64_t r, int64_t col) {
    return x.data<float>()[(c * 4 + r) * 5 + col];
  };
  for (bool align_corners : {false, true}) {
    for (const char* mode : {"bilinear", "nearest", "bicubic"}) {
      SCOPED_TRACE(fmt::format("{}, align_corners {}", mode, align_corners));
      const Tensor same =
          grid_sample(x, pixel_grid(4, 5, 0, 0, align_corners), mode, "zeros", align_corners);
      for (int64_t i = 0; i < x.numel(); ++i)
        EXPECT_NEAR(same.data<float>()[i], x.data<float>()[i], 1e-5f) << "at " << i;
    }
    const Tensor shifted = pixel_grid(4, 5, 0, -2, align_corners);
    const Tensor zeros = grid_sample(x, shifted, "nearest", "zeros", align_corners);
    const Tensor border = grid_sample(x, shifted, "nearest", "border", align_corners);
    const Tensor mirrored = grid_sample(x, shifted, "nearest", "reflection", align_corners);
    for (int64_t c = 0; c < 2; ++c) {
      for (int64_t r = 0; r < 4; ++r) {
        for (int64_t j = 0; j < 5; ++j) {
          const int64_t at = (c * 4 + r) * 5 + j;
          // Column j - 2 mirrored: at the edge pixel's centre (align_corners) or its outer edge.
          const int64_t reflected = j >= 2 ? j - 2 : align_corners ? 2 - j : 1 - j;
          EXPECT_EQ(zeros.data<float>()[at], j >= 2 ? pixel(c, r, j - 2) : 0.0f);
          EXPECT_EQ(border.data<float>()[at], pixel(c, r, std::max<int64_t>(j - 2, 0)));
          EXPECT_EQ(mirrored.data<float>()[at], pixel(c, r, reflected)) << "column " << j;
        }
      }
    }
  }
  const Tensor half = grid_sample(x, pixel_grid(4, 5, 0, 0.5, true), "bilinear", "zeros", true);
  for (int64_t j = 0; j < 4; ++j)
    EXPECT_FLOAT_EQ(half.data<float>()[j], (pixel(0, 0, j) + pixel(0, 0, j + 1)) / 2.0f);
}

TEST(ReferenceTensor, GridSampleRefusesBadGridsAndModes) {
  const Tensor x = floats({1, 1, 2, 2}, {1, 2, 3, 4});
  expect_error(
      {.op = "GridSample",
       .inputs = {runtime_input(x), runtime_input(Tensor::zeros(DType::kFloat32, {1, 2, 2, 3}))},
       .opset = 16},
      ErrorCode::kShapeMismatch, {"grid [1, 2, 2, 3]", "[N, H_out, W_out, 2]"});
  expect_error(
      {.op = "GridSample",
       .inputs = {runtime_input(x), runtime_input(Tensor::zeros(DType::kFloat32, {1, 2, 2, 2}))},
       .attrs = {{"mode", std::string("linear")}},
       .opset = 16},
      ErrorCode::kUnsupported, {"mode 'linear' is not supported"});
}

// ---- Einsum ----

// Small integers, so that every product and sum is exact and the loops below must match bit for
// bit.
Tensor small_ints(std::vector<int64_t> shape, std::mt19937& rng) {
  Tensor t = Tensor::zeros(DType::kInt64, std::move(shape));
  for (int64_t i = 0; i < t.numel(); ++i) t.data<int64_t>()[i] = uniform(rng, -5, 5);
  return t;
}

Tensor einsum(const std::string& equation, const std::vector<Tensor>& inputs) {
  OpSpec spec{.op = "Einsum", .attrs = {{"equation", equation}}, .opset = 12};
  for (const Tensor& t : inputs) spec.inputs.push_back(runtime_input(t));
  return run1(spec);
}

// Batched products with the ellipsis broadcasting (a batch of 1 against 5), explicit and
// implicit outputs, against plain loops.
TEST(ReferenceTensor, EinsumBatchedProductsBroadcastTheEllipsis) {
  std::mt19937 rng(7);
  const Tensor a = small_ints({2, 1, 3, 4}, rng), b = small_ints({5, 4, 2}, rng);
  const Tensor c = einsum("...ij,...jk->...ik", {a, b});
  ASSERT_EQ(c.shape(), (std::vector<int64_t>{2, 5, 3, 2}));
  for (int64_t p = 0; p < 2; ++p) {
    for (int64_t q = 0; q < 5; ++q) {
      for (int64_t i = 0; i < 3; ++i) {
        for (int64_t k = 0; k < 2; ++k) {
          int64_t sum = 0;
          for (int64_t j = 0; j < 4; ++j) {
            sum += a.data<int64_t>()[(p * 3 + i) * 4 + j] * b.data<int64_t>()[(q * 4 + j) * 2 + k];
          }
          EXPECT_EQ(c.data<int64_t>()[((p * 5 + q) * 3 + i) * 2 + k], sum);
        }
      }
    }
  }
  // Implicit output: the ellipsis, then the letters used once, alphabetically.
  const Tensor implicit = einsum("...ij,...jk", {a, b});
  EXPECT_EQ(values<int64_t>(implicit), values<int64_t>(c));
  const Tensor m = small_ints({3, 4}, rng);
  const Tensor transposed = einsum("ji", {m});  // implicit "ij": the transpose
  ASSERT_EQ(transposed.shape(), (std::vector<int64_t>{4, 3}));
  for (int64_t i = 0; i < 3; ++i) {
    for (int64_t j = 0; j < 4; ++j)
      EXPECT_EQ(transposed.data<int64_t>()[j * 3 + i], m.data<int64_t>()[i * 4 + j]);
  }
}

// A label repeated in one term takes the diagonal; one missing from the output is summed; three
// operands multiply; float32 sums in double.
TEST(ReferenceTensor, EinsumDiagonalsSumsAndOuterProducts) {
  std::mt19937 rng(8);
  const Tensor sq = small_ints({2, 3, 3}, rng);
  const Tensor diagonal = einsum("bii->bi", {sq}), trace = einsum("bii->b", {sq});
  const Tensor total = einsum("bij->", {sq});
  ASSERT_EQ(diagonal.shape(), (std::vector<int64_t>{2, 3}));
  ASSERT_EQ(total.shape(), (std::vector<int64_t>{}));
  int64_t all = 0;
  for (int64_t n = 0; n < 2; ++n) {
    int64_t t = 0;
    for (int64_t i = 0; i < 3; ++i) {
      const int64_t d = sq.data<int64_t>()[(n * 3 + i) * 3 + i];
      EXPECT_EQ(diagonal.data<int64_t>()[n * 3 + i], d);
      t += d;
      for (int64_t j = 0; j < 3; ++j) all += sq.data<int64_t>()[(n * 3 + i) * 3 + j];
    }
    EXPECT_EQ(trace.data<int64_t>()[n], t);
  }
  EXPECT_EQ(total.data<int64_t>()[0], all);
  const Tensor x = floats({2}, {1, 2}), y = floats({3}, {1, 10, 100}), z = floats({1}, {0.5f});
  EXPECT_EQ(values<float>(einsum("i,j,k->ijk", {x, y, z})),
            (std::vector<float>{0.5f, 5, 50, 1, 10, 100}));
  const Tensor big = floats({3}, {1e8f, 1, -1e8f});
  EXPECT_EQ(values<float>(einsum("i->", {big}))[0], 1.0f);  // float sums would give 0
}

TEST(ReferenceTensor, EinsumRefusesEquationsThatDoNotFitTheInputs) {
  const Tensor m = floats({2, 3}, {1, 2, 3, 4, 5, 6});
  auto spec = [&](const std::string& equation, std::vector<Tensor> inputs) {
    OpSpec s{.op = "Einsum", .attrs = {{"equation", equation}}, .opset = 12};
    for (Tensor& t : inputs) s.inputs.push_back(runtime_input(std::move(t)));
    return s;
  };
  expect_error(spec("ij,jk->ik", {m}), ErrorCode::kInvalidModel, {"2 input terms for 1 inputs"});
  expect_error(spec("ijk->i", {m}), ErrorCode::kShapeMismatch,
               {"input 0 has rank 2, its term names 3 dimensions"});
  expect_error(spec("ij,ij->ij", {m, floats({3, 2}, {1, 2, 3, 4, 5, 6})}),
               ErrorCode::kShapeMismatch, {"input 1 axis 0 has size 3 where its label has size 2"});
  expect_error(spec("i1->i", {m}), ErrorCode::kInvalidModel, {"holds '1'"});
  expect_error(spec("ij->ik", {m}), ErrorCode::kInvalidModel, {"output label 'k' is in no input"});
  expect_error(spec("ij->ii", {m}), ErrorCode::kInvalidModel, {"output label 'i' appears twice"});
  const Tensor wide = Tensor::zeros(DType::kFloat32, {1 << 11, 1 << 11});
  expect_error(spec("ab,cd->", {wide, wide}), ErrorCode::kUnsupported,
               {"more than 2^32 combinations"});
}

// ---- ReverseSequence ----

// Each batch entry's first sequence_lens[b] steps reversed, the rest in place, with time on axis
// 0 or 1, against index loops; a length past the time axis is refused.
TEST(ReferenceTensor, ReverseSequenceReversesEachEntrysLeadingSteps) {
  std::mt19937 rng(10);
  const std::vector<int64_t> lengths = {4, 0, 2};
  for (const int64_t time_axis : {0, 1}) {
    SCOPED_TRACE(fmt::format("time_axis {}", time_axis));
    const std::vector<int64_t> shape =
        time_axis == 0 ? std::vector<int64_t>{4, 3, 2} : std::vector<int64_t>{3, 4, 2};
    const Tensor x = small_ints(shape, rng);
    const Tensor y = run1({.op = "ReverseSequence",
                           .inputs = {runtime_input(x), runtime_input(ints(lengths))},
                           .attrs = {{"time_axis", time_axis}, {"batch_axis", 1 - time_axis}},
                           .opset = 13});
    auto offset = [&](int64_t t, int64_t b, int64_t k) {
      return ((time_axis == 0 ? t * 3 + b : b * 4 + t) * 2) + k;
    };
    for (int64_t b = 0; b < 3; ++b) {
      const int64_t length = lengths[static_cast<std::size_t>(b)];
      for (int64_t t = 0; t < 4; ++t) {
        const int64_t from = t < length ? length - 1 - t : t;
        for (int64_t k = 0; k < 2; ++k) {
          EXPECT_EQ(y.data<int64_t>()[offset(t, b, k)], x.data<int64_t>()[offset(from, b, k)]);
        }
      }
    }
  }
  expect_error({.op = "ReverseSequence",
                .inputs = {runtime_input(Tensor::zeros(DType::kFloat32, {4, 3})),
                           runtime_input(ints({1, 5, 2}))},
                .opset = 13},
               ErrorCode::kInvalidArgument, {"sequence_lens[1] = 5 is outside [0, 4]"});
}

// ---- TopK, ScatterElements, GatherND ----

// Equal elements come in index order and a NaN above every number, whichever end is taken;
// a K the axis cannot give is refused with the axis' length.
TEST(ReferenceTensor, TopKKeepsIndexOrderAmongEqualsAndRanksNaNHighest) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const Tensor x = floats({2, 5}, {3, 1, 3, nan, 2, /**/ 5, 5, 4, 5, 0});
  const std::vector<Tensor> top =
      run({.op = "TopK", .inputs = {runtime_input(x), constant(ints({3}))}, .outputs = 2});
  EXPECT_EQ(values<int64_t>(top[1]), (std::vector<int64_t>{3, 0, 2, 0, 1, 3}));
  const std::vector<float> got = values<float>(top[0]);
  EXPECT_TRUE(std::isnan(got[0]));
  EXPECT_EQ(std::vector<float>(got.begin() + 1, got.end()), (std::vector<float>{3, 3, 5, 5, 5}));
  const std::vector<Tensor> low = run({.op = "TopK",
                                       .inputs = {runtime_input(x), constant(ints({2}))},
                                       .attrs = {{"largest", int64_t{0}}, {"axis", int64_t{0}}},
                                       .outputs = 2});
  EXPECT_EQ(values<int64_t>(low[1]), (std::vector<int64_t>{0, 0, 0, 1, 1, 1, 1, 1, 0, 0}));
  expect_error({.op = "TopK", .inputs = {runtime_input(x), constant(ints({6}))}, .outputs = 2},
               ErrorCode::kInvalidModel, {"K must be one value in [0, 5]", "got [6]"});
}

// Repeated indices all count with a reduction; an index outside the axis names itself and the
// element of indices it sits at.
TEST(ReferenceTensor, ScatterElementsReducesRepeatsAndRefusesIndicesOffTheAxis) {
  const Tensor data = floats({2, 3}, {1, 2, 3, 4, 5, 6});
  const Tensor updates = floats({2, 2}, {10, 20, 30, 40});
  auto scatter = [&](const std::vector<int64_t>& index_values, const std::string& reduction) {
    return run1({.op = "ScatterElements",
                 .inputs = {runtime_input(data), runtime_input(make<int64_t>({2, 2}, index_values)),
                            runtime_input(updates)},
                 .attrs = {{"axis", int64_t{1}}, {"reduction", reduction}},
                 .opset = 16});
  };
  EXPECT_EQ(values<float>(scatter({2, -3, 1, 1}, "none")),
            (std::vector<float>{20, 2, 10, 4, 40, 6}));  // 1 then 2 on row 1: the last wins
  EXPECT_EQ(values<float>(scatter({0, 0, 1, 1}, "add")), (std::vector<float>{31, 2, 3, 4, 75, 6}));
  try {
    scatter({0, 3, 1, 1}, "none");
    ADD_FAILURE() << "index 3 on an axis of 3 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("index 3 (element 1 of indices) is out of range"),
              std::string::npos)
        << e.what();
  }
}

// batch_dims: each batch entry's tuples index its own slice of data.
TEST(ReferenceTensor, GatherNDWithBatchDimsIndexesEachBatchEntry) {
  const Tensor data = floats({2, 2, 3}, {0, 1, 2, 3, 4, 5, /**/ 6, 7, 8, 9, 10, 11});
  const Tensor y =
      run1({.op = "GatherND",
            .inputs = {runtime_input(data), runtime_input(make<int64_t>({2, 2, 1}, {1, 0, -1, 1}))},
            .attrs = {{"batch_dims", int64_t{1}}}});
  EXPECT_EQ(y.shape(), (std::vector<int64_t>{2, 2, 3}));
  EXPECT_EQ(values<float>(y), (std::vector<float>{3, 4, 5, 0, 1, 2, 9, 10, 11, 9, 10, 11}));
  expect_error({.op = "GatherND",
                .inputs = {runtime_input(data), runtime_input(make<int64_t>({3, 1}, {0, 0, 0}))},
                .attrs = {{"batch_dims", int64_t{1}}}},
               ErrorCode::kShapeMismatch, {"share data's first 1 axes"});
}

// ---- Resize ----

Tensor resize(const Tensor& x, const std::vector<int64_t>& sizes, const std::string& mode,
              const std::string& coordinates, const std::string& nearest_mode = "floor") {
  return run1({.op = "Resize",
               .inputs = {runtime_input(x), omitted(), omitted(), constant(ints(sizes))},
               .attrs = {{"mode", mode},
                         {"coordinate_transformation_mode", coordinates},
                         {"nearest_mode", nearest_mode}}});
}

// Bilinear resizing of N x C x H x W to the sizes' H x W, written out as PyTorch's
// interpolate(mode="bilinear") documents it: per axis the source coordinate, its two neighbours
// clamped to the edge, and the weights 1 - t and t.
TEST(ReferenceTensor, ResizeLinearMatchesBilinearInterpolation) {
  std::mt19937 rng(21);
  for (int trial = 0; trial < 24; ++trial) {
    const std::vector<int64_t> in = {uniform(rng, 1, 2), uniform(rng, 1, 3), uniform(rng, 1, 9),
                                     uniform(rng, 1, 9)};
    const std::vector<int64_t> out = {in[0], in[1], uniform(rng, 1, 20), uniform(rng, 1, 20)};
    const bool align = trial % 2 == 1;
    const Tensor x = test::random_tensor(in, static_cast<uint32_t>(trial));
    const Tensor y = resize(x, out, "linear", align ? "align_corners" : "half_pixel");
    ASSERT_EQ(y.shape(), out);
    const auto taps = [&](int64_t o, int64_t in_len, int64_t out_len) {
      const double s =
          align ? (out_len == 1 ? 0.0 : static_cast<double>(o * (in_len - 1)) / (out_len - 1))
                : (o + 0.5) * in_len / out_len - 0.5;
      const double lo = std::floor(s);
      const auto clamp = [&](double i) { return std::clamp<int64_t>(int64_t(i), 0, in_len - 1); };
      return std::tuple{clamp(lo), clamp(lo + 1), s - lo};
    };
    for (int64_t p = 0; p < in[0] * in[1]; ++p) {
      const float* plane = x.data<float>() + p * in[2] * in[3];
      for (int64_t r = 0; r < out[2]; ++r) {
        for (int64_t c = 0; c < out[3]; ++c) {
          const auto [r0, r1, tr] = taps(r, in[2], out[2]);
          const auto [c0, c1, tc] = taps(c, in[3], out[3]);
          const auto at = [&](int64_t i, int64_t j) { return double(plane[i * in[3] + j]); };
          const double want = (1 - tr) * ((1 - tc) * at(r0, c0) + tc * at(r0, c1)) +
                              tr * ((1 - tc) * at(r1, c0) + tc * at(r1, c1));
          const float got = y.data<float>()[(p * out[2] + r) * out[3] + c];
          ASSERT_NEAR(got, want, 1e-5) << "trial " << trial << " (" << r << ", " << c << ")";
        }
      }
    }
  }
}

TEST(ReferenceTensor, ResizeNearestPicksTheElementItsRoundingNames) {
  // 1-D, 4 -> 10 (scale 2.5), asymmetric: output o reads input o / 2.5 rounded per mode.
  const Tensor x = floats({4}, {10, 11, 12, 13});
  const std::vector<std::pair<std::string, std::vector<float>>> modes = {
      {"floor", {10, 10, 10, 11, 11, 12, 12, 12, 13, 13}},
      {"ceil", {10, 11, 11, 12, 12, 12, 13, 13, 13, 13}},
      {"round_prefer_floor", {10, 10, 11, 11, 12, 12, 12, 13, 13, 13}},
      {"round_prefer_ceil", {10, 10, 11, 11, 12, 12, 12, 13, 13, 13}},
  };
  for (const auto& [mode, want] : modes) {
    EXPECT_EQ(values<float>(resize(x, {10}, "nearest", "asymmetric", mode)), want) << mode;
  }
  // Ties: 4 -> 8 asymmetric reads input o / 2, halves at odd o.
  EXPECT_EQ(values<float>(resize(x, {8}, "nearest", "asymmetric", "round_prefer_floor")),
            (std::vector<float>{10, 10, 11, 11, 12, 12, 13, 13}));
  EXPECT_EQ(values<float>(resize(x, {8}, "nearest", "asymmetric", "round_prefer_ceil")),
            (std::vector<float>{10, 11, 11, 12, 12, 13, 13, 13}));
}

TEST(ReferenceTensor, ResizeScalesGiveFlooredLengths) {
  const Tensor x = test::random_tensor({1, 2, 5, 7}, 3);
  Tensor scales = floats({4}, {1.0f, 1.0f, 0.5f, 2.3f});
  const Tensor y = run1({.op = "Resize",
                         .inputs = {runtime_input(x), omitted(), constant(scales)},
                         .attrs = {{"mode", std::string("nearest")}}});
  EXPECT_EQ(y.shape(), (std::vector<int64_t>{1, 2, 2, 16}));
}

TEST(ReferenceTensor, ResizeRejectsBadScalesSizesModesAndDtypes) {
  const Tensor x = Tensor::zeros(DType::kFloat32, {1, 1, 2, 2});
  const Tensor scales = floats({4}, {1, 1, 2, 2});
  const Tensor sizes = ints({1, 1, 4, 4});
  const auto resize_with = [&](std::vector<Operand> inputs,
                               std::map<std::string, graph::AttrValue> attrs = {}) {
    return OpSpec{.op = "Resize", .inputs = std::move(inputs), .attrs = std::move(attrs)};
  };
  expect_error(resize_with({runtime_input(x), omitted(), constant(scales), constant(sizes)}),
               ErrorCode::kInvalidModel, {"exactly one of scales", "sizes"});
  expect_error(resize_with({runtime_input(x)}), ErrorCode::kInvalidModel, {"exactly one"});
  expect_error(resize_with({runtime_input(x), omitted(), constant(floats({2}, {2, 2}))}),
               ErrorCode::kInvalidModel, {"scales must be 4 float32 values", "got 2"});
  expect_error(resize_with({runtime_input(x), omitted(), constant(floats({4}, {1, 1, 0, 2}))}),
               ErrorCode::kInvalidModel, {"scale 0 of axis 2", "positive"});
  expect_error(resize_with({runtime_input(x), omitted(), omitted(), constant(ints({1, 1, 4}))}),
               ErrorCode::kInvalidModel, {"sizes must be 4 int64 values"});
  expect_error(resize_with({runtime_input(x), omitted(), omitted(), constant(ints({1, 1, -1, 4}))}),
               ErrorCode::kShapeMismatch, {"sizes [1, 1, -1, 4]", "axis 2"});
  expect_error(
      resize_with({runtime_input(x), omitted(), constant(scales)}, {{"mode", std::string("area")}}),
      ErrorCode::kUnsupported, {"mode 'area' is not supported", "nearest, linear, cubic"});
  expect_error(resize_with({runtime_input(x), omitted(), constant(scales)},
                           {{"coordinate_transformation_mode", std::string("tf_crop_and_resize")}}),
               ErrorCode::kInvalidModel, {"tf_crop_and_resize needs roi (input 1)"});
  expect_error(resize_with({runtime_input(ints({1, 2})), omitted(), constant(floats({1}, {2}))}),
               ErrorCode::kUnsupported, {"input 0"});
  expect_error(resize_with({runtime_input(x), omitted(), runtime_input(scales)}),
               ErrorCode::kUnsupported, {"scales (input 2) must be a constant"});
}

// ---- DepthToSpace, SpaceToDepth ----

TEST(ReferenceTensor, DepthToSpaceModesMatchTheOnnxFormulas) {
  std::mt19937 rng(10);
  const int64_t n = 2, c = 3, h = 2, w = 3, b = 2;
  const Tensor x = random_tensor(DType::kFloat32, {n, c * b * b, h, w}, rng);
  for (const std::string mode : {"DCR", "CRD"}) {
    const Tensor y = run1({.op = "DepthToSpace",
                           .inputs = {runtime_input(x)},
                           .attrs = {{"blocksize", b}, {"mode", mode}}});
    ASSERT_EQ(y.shape(), (std::vector<int64_t>{n, c, h * b, w * b}));
    EXPECT_TRUE(each_element_from(y, x, [&](const std::vector<int64_t>& j) {
      const int64_t bi = j[2] % b, bj = j[3] % b;
      // DCR: depth is (block row, block col, channel); CRD: (channel, block row, block col).
      const int64_t channel = mode == "DCR" ? (bi * b + bj) * c + j[1] : (j[1] * b + bi) * b + bj;
      return ravel({j[0], channel, j[2] / b, j[3] / b}, x.shape());
    })) << mode;
    // SpaceToDepth undoes DCR.
    if (mode == "DCR") {
      const Tensor back =
          run1({.op = "SpaceToDepth", .inputs = {runtime_input(y)}, .attrs = {{"blocksize", b}}});
      ASSERT_EQ(back.shape(), x.shape());
      EXPECT_EQ(std::memcmp(back.raw_data(), x.raw_data(), x.nbytes()), 0);
    }
  }
  expect_error(
      {.op = "DepthToSpace", .inputs = {runtime_input(x)}, .attrs = {{"blocksize", int64_t{3}}}},
      ErrorCode::kShapeMismatch, {"blocksize^2 = 9"});
}

// ---- CumSum, EyeLike, OneHot, Trilu ----

TEST(ReferenceTensor, CumSumExclusiveAndReverseMatchLoops) {
  const Tensor x = make<int64_t>({2, 3}, {1, 2, 3, 4, 5, 6});
  const auto cumsum = [&](int64_t axis, int64_t exclusive, int64_t reverse) {
    return values<int64_t>(run1({.op = "CumSum",
                                 .inputs = {runtime_input(x), constant(int_scalar(axis))},
                                 .attrs = {{"exclusive", exclusive}, {"reverse", reverse}}}));
  };
  using V = std::vector<int64_t>;
  EXPECT_EQ(cumsum(1, 0, 0), (V{1, 3, 6, 4, 9, 15}));
  EXPECT_EQ(cumsum(-1, 1, 0), (V{0, 1, 3, 0, 4, 9}));
  EXPECT_EQ(cumsum(1, 0, 1), (V{6, 5, 3, 15, 11, 6}));
  EXPECT_EQ(cumsum(0, 1, 1), (V{4, 5, 6, 0, 0, 0}));
  expect_error({.op = "CumSum", .inputs = {runtime_input(x), constant(int_scalar(2))}},
               ErrorCode::kInvalidModel, {"axis"});
}

TEST(ReferenceTensor, EyeLikeOneHotAndTrilu) {
  const Tensor eye = run1({.op = "EyeLike",
                           .inputs = {runtime_input(Tensor::zeros(DType::kFloat32, {2, 3}))},
                           .attrs = {{"k", int64_t{1}}, {"dtype", int64_t{7}}}});
  EXPECT_EQ(eye.dtype(), DType::kInt64);
  EXPECT_EQ(values<int64_t>(eye), (std::vector<int64_t>{0, 1, 0, 0, 0, 1}));

  // Index -1 counts from depth; 5 is outside [-3, 3) and gives a row of `off`.
  const Tensor hot = run1({.op = "OneHot",
                           .inputs = {runtime_input(ints({0, -1, 5})), constant(int_scalar(3)),
                                      runtime_input(floats({2}, {0.5f, 2.0f}))},
                           .attrs = {{"axis", int64_t{0}}}});
  ASSERT_EQ(hot.shape(), (std::vector<int64_t>{3, 3}));
  EXPECT_EQ(values<float>(hot),
            (std::vector<float>{2, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 2, 0.5f}));

  const Tensor m = make<int32_t>({3, 3}, {1, 2, 3, 4, 5, 6, 7, 8, 9});
  EXPECT_EQ(values<int32_t>(run1({.op = "Trilu", .inputs = {runtime_input(m)}})),
            (std::vector<int32_t>{1, 2, 3, 0, 5, 6, 0, 0, 9}));
  EXPECT_EQ(values<int32_t>(run1({.op = "Trilu",
                                  .inputs = {runtime_input(m), constant(int_scalar(-1))},
                                  .attrs = {{"upper", int64_t{0}}}})),
            (std::vector<int32_t>{0, 0, 0, 4, 0, 0, 7, 8, 0}));
}

// ---- the shape subgraph PyTorch exports for x.view(batch, seq, heads, dim) ----

TEST(ReferenceTensor, ShapeGatherUnsqueezeConcatReshapeChainFoldsOnInt64) {
  graph::Graph g;
  g.source = "view.onnx";
  g.opset = 13;
  const auto value = [&](const std::string& name, std::optional<Tensor> constant = std::nullopt) {
    graph::Value v;
    v.name = name;
    if (constant) {
      v.dtype = constant->dtype();
      v.dtype_known = true;
      v.shape = graph::make_shape(constant->shape());
      v.constant = constant;
    }
    return g.add_value(v);
  };
  const int x = value("x");
  g.values[x].dtype_known = true;
  g.values[x].shape = graph::make_shape({2, 5, 12});
  g.inputs = {x};
  const auto node = [&](const std::string& op, std::vector<int> inputs,
                        std::map<std::string, graph::AttrValue> attrs = {}) {
    const int out = value(op + std::to_string(g.nodes.size()));
    g.nodes.push_back(
        graph::Node{"n" + std::to_string(g.nodes.size()), op, "", inputs, {out}, attrs, {}});
    return out;
  };
  const int shape = node("Shape", {x});
  const int batch = node("Gather", {shape, value("zero", int_scalar(0))});
  const int seq = node("Gather", {shape, value("one", int_scalar(1))});
  const int axes0 = value("axes0", ints({0}));
  const int target = node("Concat",
                          {node("Unsqueeze", {batch, axes0}), node("Unsqueeze", {seq, axes0}),
                           value("heads_dim", ints({3, 4}))},
                          {{"axis", int64_t{0}}});
  const int y = node("Reshape", {x, target});
  g.outputs = {y};
  g.link();

  // Fold like the constant folder: every node but the last has constant (or shape-only) inputs.
  std::mt19937 rng(11);
  const Tensor input = random_tensor(DType::kFloat32, {2, 5, 12}, rng);
  for (const graph::Node& n : g.nodes) {
    std::vector<const Tensor*> inputs;
    for (int v : n.inputs) inputs.push_back(v == x ? &input : &*g.values[v].constant);
    std::vector<Tensor> out = evaluate(g, n, inputs);
    graph::Value& result = g.values[n.outputs[0]];
    result.dtype = out[0].dtype();
    result.dtype_known = true;
    result.shape = graph::make_shape(out[0].shape());
    result.constant = out[0];
  }
  EXPECT_EQ(values<int64_t>(*g.values[target].constant), (std::vector<int64_t>{2, 5, 3, 4}));
  const Tensor& reshaped = *g.values[y].constant;
  EXPECT_EQ(reshaped.shape(), (std::vector<int64_t>{2, 5, 3, 4}));
  EXPECT_EQ(std::memcmp(reshaped.raw_data(), input.raw_data(), input.nbytes()), 0);
}

TEST(ReferenceTensor, ReferenceOpRefusesAnOutputOfTheWrongShape) {
  // An executor bug (or a stale shape) must not turn into a write past the buffer.
  graph::Graph g;
  g.source = "test.onnx";
  g.opset = 13;
  graph::Value x_value;
  x_value.name = "x";
  graph::Value y_value;
  y_value.name = "y";
  const int x = g.add_value(x_value);
  const int y = g.add_value(y_value);
  g.nodes.push_back(graph::Node{"n0", "Transpose", "", {x}, {y}, {}, {}});
  const Tensor input = Tensor::zeros(DType::kFloat32, {2, 3});
  for (const std::vector<int64_t>& shape : {std::vector<int64_t>{2, 3}, {3, 3}, {6}}) {
    Tensor output = Tensor::zeros(DType::kFloat32, shape);
    runtime::RefOpContext ctx{g, g.nodes[0], {&input}, {&output}};
    try {
      ref_op("Transpose").run(ctx);
      ADD_FAILURE() << "expected an error";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInternal) << e.what();
      EXPECT_NE(std::string(e.what()).find("[3, 2]"), std::string::npos) << e.what();
    }
  }
}

// ---- tables ----

TEST(ReferenceTensor, EveryTensorOpHasAReferenceImplementation) {
  for (const graph::OpDef& def : graph::tensor_op_defs()) {
    EXPECT_NO_THROW(ref_op(def.op_type)) << def.op_type;
  }
  EXPECT_EQ(graph::tensor_op_defs().size(), runtime::tensor_reference_ops().size());
}

}  // namespace
}  // namespace sparsecol
