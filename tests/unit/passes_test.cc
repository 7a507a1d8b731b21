// The load-time passes change the graph's structure but never its results.
#include <cmath>

#include <gtest/gtest.h>

#include "../test_util.h"
#include "graph/passes.h"
#include "graph_builder.h"

namespace sparsecol::testing {
namespace {

using graph::EpilogueOp;

int count_ops(const graph::Graph& g, const std::string& op) {
  int n = 0;
  for (const graph::Node& node : g.nodes) n += node.op_type == op ? 1 : 0;
  return n;
}

const graph::Node& only_node(const graph::Graph& g, const std::string& op) {
  for (const graph::Node& node : g.nodes) {
    if (node.op_type == op) return node;
  }
  throw std::runtime_error("no " + op);
}

std::vector<EpilogueOp::Kind> kinds(const graph::Node& node) {
  std::vector<EpilogueOp::Kind> k;
  for (const EpilogueOp& op : node.epilogue) k.push_back(op.kind);
  return k;
}

// Runs a graph before and after optimize() and checks results agree.
void expect_optimize_preserves_results(graph::Graph g, const NamedTensors& inputs,
                                       float tolerance = 1e-5f) {
  const NamedTensors before = run_reference(g, inputs);
  graph::optimize(g, runtime::evaluate_node);
  const NamedTensors after = run_reference(g, inputs);
  ASSERT_EQ(before.size(), after.size());
  for (const auto& [name, t] : before) {
    EXPECT_LE(max_abs_diff(t, after.at(name)), tolerance) << name;
  }
}

TEST(FoldBatchnorm, ConvThenBatchnormBecomesOneConvWithSameResults) {
  GraphBuilder b;
  const int x = b.input("x", {-1, 3, 8, 8});
  const int w = b.constant("w", random_tensor({4, 3, 3, 3}, 1));
  const int bias = b.constant("b", random_tensor({4}, 2));
  const int conv = b.node("Conv", {x, w, bias}, {{"pads", std::vector<int64_t>{1, 1, 1, 1}}});
  const int bn =
      b.node("BatchNormalization",
             {conv, b.constant("gamma", random_tensor({4}, 3, 0.5f, 2.0f)),
              b.constant("beta", random_tensor({4}, 4)), b.constant("mean", random_tensor({4}, 5)),
              b.constant("var", random_tensor({4}, 6, 0.5f, 2.0f))},
             {{"epsilon", 1e-3f}});
  graph::Graph g = b.finish({bn});
  graph::Graph folded = g;
  graph::optimize(folded, runtime::evaluate_node);
  EXPECT_EQ(count_ops(folded, "BatchNormalization"), 0);
  EXPECT_EQ(count_ops(folded, "Conv"), 1);
  expect_optimize_preserves_results(g, {{"x", random_tensor({2, 3, 8, 8}, 7)}});
}

// ConvTranspose's weight holds an output channel in its second axis, per group of input
// channels: with 2 groups and stride 2, the folded ConvTranspose gives the unfolded results.
TEST(FoldBatchnorm, GroupedConvTransposeThenBatchnormFoldsWithSameResults) {
  GraphBuilder b;
  const int x = b.input("x", {-1, 4, 5, 5});
  const int w = b.constant("w", random_tensor({4, 3, 3, 3}, 1));  // [C, M / group, k, k]: M = 6
  const int up = b.node("ConvTranspose", {x, w, b.constant("b", random_tensor({6}, 2))},
                        {{"group", int64_t{2}}, {"strides", std::vector<int64_t>{2, 2}}});
  const int bn =
      b.node("BatchNormalization",
             {up, b.constant("gamma", random_tensor({6}, 3, 0.5f, 2.0f)),
              b.constant("beta", random_tensor({6}, 4)), b.constant("mean", random_tensor({6}, 5)),
              b.constant("var", random_tensor({6}, 6, 0.5f, 2.0f))});
  graph::Graph g = b.finish({bn});
  graph::Graph folded = g;
  graph::optimize(folded, runtime::evaluate_node);
  EXPECT_EQ(count_ops(folded, "BatchNormalization"), 0);
  EXPECT_EQ(count_ops(folded, "ConvTranspose"), 1);
  expect_optimize_preserves_results(g, {{"x", random_tensor({2, 4, 5, 5}, 7)}});
}

TEST(FoldBatchnorm, LeavesBatchnormWhoseConvOutputHasAnotherReader) {
  GraphBuilder b;
  const int x = b.input("x", {1, 2, 4, 4});
  const int conv = b.node("Conv", {x, b.constant("w", random_tensor({2, 2, 1, 1}, 1))});
  const int bn =
      b.node("BatchNormalization",
             {conv, b.constant("g", random_tensor({2}, 3, 0.5f, 2.0f)),
              b.constant("be", random_tensor({2}, 4)), b.constant("m", random_tensor({2}, 5)),
              b.constant("v", random_tensor({2}, 6, 0.5f, 2.0f))});
  graph::Graph g = b.finish({bn, conv});
  graph::fold_batchnorm(g);
  EXPECT_EQ(count_ops(g, "BatchNormalization"), 1);
}

TEST(FuseEpilogues, ConvResidualAddReluFuseIntoTheConv) {
  GraphBuilder b;
  const graph::Shape shape{{-1, "N"}, {4, {}}, {6, {}}, {6, {}}};
  const int x = b.input("x", {-1, 4, 6, 6});
  const int conv = b.node("Conv", {x, b.constant("w", random_tensor({4, 4, 3, 3}, 1))},
                          {{"pads", std::vector<int64_t>{1, 1, 1, 1}}}, shape);
  // The residual is computed after the conv in node order: the fused conv must move after it.
  const int residual = b.node("Relu", {x}, {}, shape);
  const int add = b.node("Add", {conv, residual}, {}, shape);
  const int relu = b.node("Relu", {add}, {}, shape);
  graph::Graph g = b.finish({relu});
  graph::Graph fused = g;
  graph::optimize(fused, runtime::evaluate_node);
  ASSERT_EQ(fused.nodes.size(), 2u);
  EXPECT_EQ(fused.nodes[1].op_type, "Conv");
  EXPECT_EQ(kinds(fused.nodes[1]),
            (std::vector<EpilogueOp::Kind>{EpilogueOp::Kind::kAdd, EpilogueOp::Kind::kRelu}));
  expect_optimize_preserves_results(g, {{"x", random_tensor({2, 4, 6, 6}, 9)}});
}

TEST(FuseEpilogues, MatMulBiasGeluPatternFusesAndMatchesTheUnfusedGraph) {
  GraphBuilder b;
  const int x = b.input("x", {-1, 5, 8});
  const int mm = b.node("MatMul", {x, b.constant("w", random_tensor({8, 16}, 1))});
  const int biased = b.node("Add", {b.constant("bias", random_tensor({16}, 2)), mm});
  // PyTorch's nn.GELU() at opset 13.
  const int div = b.node("Div", {biased, b.constant("sqrt2", scalar(std::sqrt(2.0f)))});
  const int erf = b.node("Erf", {div});
  const int plus1 = b.node("Add", {erf, b.constant("one", scalar(1.0f))});
  const int mul = b.node("Mul", {biased, plus1});
  const int half = b.node("Mul", {mul, b.constant("half", scalar(0.5f))});
  graph::Graph g = b.finish({half});
  graph::Graph fused = g;
  graph::optimize(fused, runtime::evaluate_node);
  ASSERT_EQ(fused.nodes.size(), 1u);
  EXPECT_EQ(kinds(only_node(fused, "MatMul")),
            (std::vector<EpilogueOp::Kind>{EpilogueOp::Kind::kAdd, EpilogueOp::Kind::kGelu}));
  expect_optimize_preserves_results(g, {{"x", random_tensor({3, 5, 8}, 3, -3.0f, 3.0f)}});
}

TEST(FuseEpilogues, ClipWithConstantBoundsFuses) {
  GraphBuilder b;
  const int x = b.input("x", {1, 2, 5, 5});
  const int conv =
      b.node("Conv", {x, b.constant("w", random_tensor({3, 2, 3, 3}, 4, -2.0f, 2.0f))});
  const int clip =
      b.node("Clip", {conv, b.constant("lo", scalar(0.0f)), b.constant("hi", scalar(0.5f))});
  graph::Graph g = b.finish({clip});
  graph::Graph fused = g;
  graph::optimize(fused, runtime::evaluate_node);
  ASSERT_EQ(fused.nodes.size(), 1u);
  ASSERT_EQ(fused.nodes[0].epilogue.size(), 1u);
  EXPECT_EQ(fused.nodes[0].epilogue[0].min, 0.0f);
  EXPECT_EQ(fused.nodes[0].epilogue[0].max, 0.5f);
  expect_optimize_preserves_results(g, {{"x", random_tensor({1, 2, 5, 5}, 5)}});
}

TEST(FuseEpilogues, AddWithUnknownShapesIsNotFused) {
  GraphBuilder b;
  const int x = b.input("x", {-1, 8});
  const int y = b.input("y", {-1, 16});
  const int mm = b.node("MatMul", {x, b.constant("w", random_tensor({8, 16}, 1))});
  const int add = b.node("Add", {mm, y});  // no recorded shapes: broadcasting unknown
  graph::Graph g = b.finish({add});
  graph::fuse_epilogues(g);
  EXPECT_EQ(count_ops(g, "Add"), 1);
}

// PyTorch's x.view(x.shape[0], -1) with a symbolic batch: Shape -> Gather -> Unsqueeze ->
// Concat -> Reshape, folded away once the batch is known.
// Only Transposes that the MatMul alone reads fold, and only into a product of two activations
// with the same batch dims: a Transpose read twice stays (the other reader needs its output), a
// linear layer's MatMul (a constant weight) keeps its sparse or packed path, and a MatMul that
// broadcasts its batch dims is no Einsum (one size per letter). Results are unchanged.
TEST(FoldMatMulTransposes, FoldsOnlyTransposesTheProductAloneReads) {
  GraphBuilder b;
  const int x = b.input("x", {2, 3, 4, 5});
  const int y = b.input("y", {2, 3, 4, 5});
  const std::map<std::string, graph::AttrValue> swap = {{"perm", std::vector<int64_t>{0, 1, 3, 2}}};
  const int yt = b.node("Transpose", {y}, swap);                 // read by two products: stays
  const int xt = b.node("Transpose", {x}, swap);                 // read by one: folds
  const int gram = b.node("MatMul", {b.node("Relu", {x}), xt});  // [2, 3, 4, 4]
  const int twice = b.node("MatMul", {x, yt});                   // [2, 3, 4, 4]
  const int again = b.node("MatMul", {b.node("Neg", {yt}), gram});
  const int linear =
      b.node("MatMul", {b.node("Transpose", {y}, swap), b.constant("w", random_tensor({4, 6}, 1))});
  const int broadcast = b.node("MatMul", {b.input("z", {1, 3, 4, 5}),
                                          b.node("Transpose", {b.input("u", {2, 1, 4, 5})}, swap)});
  graph::Graph g = b.finish({twice, again, linear, broadcast});
  const NamedTensors inputs = {{"x", random_tensor({2, 3, 4, 5}, 2)},
                               {"y", random_tensor({2, 3, 4, 5}, 3)},
                               {"z", random_tensor({1, 3, 4, 5}, 4)},
                               {"u", random_tensor({2, 1, 4, 5}, 5)}};
  const NamedTensors before = run_reference(g, inputs);
  graph::optimize(g, runtime::evaluate_node);  // shapes inferred
  graph::fold_matmul_transposes(g);
  EXPECT_EQ(count_ops(g, "Einsum"), 1);
  EXPECT_EQ(only_node(g, "Einsum").attr_string("equation", ""), "abxy,abzy->abxz");
  EXPECT_EQ(count_ops(g, "Transpose"), 3);
  EXPECT_EQ(count_ops(g, "MatMul"), 4);
  EXPECT_TRUE(outputs_near(run_reference(g, inputs), before, 1e-6f));
}

// Scores = (x Wq + bq) k / 4: the Div folds into Wq and bq (new constants, the originals kept
// for their other reader), exactly (a power of two); Mul by a scalar on either side folds too.
// It does not fold where the product has a second reader, where no linear layer computes an
// operand, or where the layer's epilogue is not additions of constants (a Relu).
TEST(FoldProductScale, ScaleOfAnAttentionProductFoldsIntoTheProjection) {
  enum class Scale { kDiv, kMulAfter, kMulBefore };
  for (Scale form : {Scale::kDiv, Scale::kMulAfter, Scale::kMulBefore}) {
    GraphBuilder b;
    const int x = b.input("x", {2, 3, 8});
    const int wq = b.constant("wq", random_tensor({8, 8}, 1));
    const int q =
        b.node("Add", {b.node("MatMul", {x, wq}), b.constant("bq", random_tensor({8}, 2))});
    const int k =
        b.node("Transpose", {b.input("k", {2, 3, 8})}, {{"perm", std::vector<int64_t>{0, 2, 1}}});
    const int product = b.node("MatMul", {q, k});
    const int scores = form == Scale::kDiv ? b.node("Div", {product, b.constant("c", scalar(4.0f))})
                       : form == Scale::kMulAfter
                           ? b.node("Mul", {product, b.constant("c", scalar(0.25f))})
                           : b.node("Mul", {b.constant("c", scalar(0.25f)), product});
    const int other_reader = b.node("MatMul", {x, wq});  // wq's second reader
    graph::Graph g = b.finish({b.node("Softmax", {scores}), other_reader});
    const NamedTensors inputs = {{"x", random_tensor({2, 3, 8}, 3)},
                                 {"k", random_tensor({2, 3, 8}, 4)}};
    const NamedTensors before = run_reference(g, inputs);
    graph::optimize(g, runtime::evaluate_node);
    EXPECT_EQ(count_ops(g, "Div") + count_ops(g, "Mul"), 0);
    const graph::Node& projection = g.nodes.front();
    ASSERT_EQ(projection.op_type, "MatMul");
    const Tensor& scaled = *g.values[static_cast<std::size_t>(projection.input(1))].constant;
    const Tensor original = random_tensor({8, 8}, 1);
    for (int64_t i = 0; i < original.numel(); ++i) {
      ASSERT_EQ(scaled.data<float>()[i], original.data<float>()[i] * 0.25f) << i;
    }
    EXPECT_TRUE(outputs_near(run_reference(g, inputs), before, 0.0f));
  }
  // Left alone: the product read twice; both operands graph inputs; a Relu after the projection.
  GraphBuilder b;
  const int x = b.input("x", {2, 3, 8});
  const int k = b.input("k", {2, 8, 3});
  const int twice = b.node("MatMul", {x, k});
  const int inputs_only = b.node("MatMul", {b.input("y", {2, 3, 8}), k});
  const int relu =
      b.node("Relu", {b.node("MatMul", {x, b.constant("w", random_tensor({8, 8}, 5))})});
  const int after_relu = b.node("MatMul", {relu, k});
  graph::Graph g = b.finish({b.node("Div", {twice, b.constant("c1", scalar(2.0f))}), twice,
                             b.node("Div", {inputs_only, b.constant("c2", scalar(2.0f))}),
                             b.node("Div", {after_relu, b.constant("c3", scalar(2.0f))})});
  graph::optimize(g, runtime::evaluate_node);
  EXPECT_EQ(count_ops(g, "Div"), 3);
}

TEST(Specialize, FoldsShapeSubgraphOnceBatchIsKnown) {
  GraphBuilder b;
  const int x = b.input("x", {-1, 2, 3});
  const int shape = b.node("Shape", {x});
  Tensor zero = Tensor::zeros(DType::kInt64, {});
  const int batch = b.node("Gather", {shape, b.constant("zero", zero)}, {{"axis", int64_t{0}}});
  Tensor axes = Tensor::zeros(DType::kInt64, {1});
  const int unsq = b.node("Unsqueeze", {batch, b.constant("axes", axes)});
  Tensor minus1 = Tensor::zeros(DType::kInt64, {1});
  minus1.data<int64_t>()[0] = -1;
  const int target = b.node("Concat", {unsq, b.constant("m1", minus1)}, {{"axis", int64_t{0}}});
  const int reshaped = b.node("Reshape", {x, target});
  graph::Graph g = b.finish({reshaped});
  graph::optimize(g, runtime::evaluate_node);
  EXPECT_EQ(count_ops(g, "Shape"), 1);  // still symbolic after load

  const graph::Graph s = graph::specialize(g, {{"x", {4, 2, 3}}}, runtime::evaluate_node);
  EXPECT_EQ(s.nodes.size(), 1u);
  EXPECT_EQ(s.nodes[0].op_type, "Reshape");
  const Tensor input = random_tensor({4, 2, 3}, 1);
  const NamedTensors out = run_reference(g, {{"x", input}});
  const Tensor& y = out.begin()->second;
  EXPECT_EQ(y.shape(), (std::vector<int64_t>{4, 6}));
  EXPECT_EQ(max_abs_diff(y.reshaped({4, 2, 3}), input), 0.0f);
}

// torchvision's ViT: a class token expanded to the batch, token.expand(x.shape[0], 1, 8), whose
// shape input ONNX's shape inference gives a known shape ([3]) while the batch is still symbolic.
// Loading must wait for specialize() to make it a constant, not refuse Expand's shape input.
TEST(Specialize, ExpandToAShapeComputedFromTheBatchLoadsAndRuns) {
  GraphBuilder b;
  const int x = b.input("x", {-1, 4, 8});
  const int shape = b.node("Shape", {x});
  const int batch = b.node("Gather", {shape, b.constant("zero", Tensor::zeros(DType::kInt64, {}))},
                           {{"axis", int64_t{0}}}, graph::Shape{});
  const int unsq =
      b.node("Unsqueeze", {batch, b.constant("axes", Tensor::zeros(DType::kInt64, {1}))}, {},
             graph::make_shape({1}));
  Tensor rest = Tensor::zeros(DType::kInt64, {2});
  rest.data<int64_t>()[0] = 1;
  rest.data<int64_t>()[1] = 8;
  const int target = b.node("Concat", {unsq, b.constant("rest", rest)}, {{"axis", int64_t{0}}},
                            graph::make_shape({3}));
  const Tensor token = random_tensor({1, 1, 8}, 1);
  const int tokens = b.node("Expand", {b.constant("token", token), target});
  graph::Graph g = b.finish({b.node("Concat", {tokens, x}, {{"axis", int64_t{1}}})});
  graph::optimize(g, runtime::evaluate_node);
  EXPECT_EQ(count_ops(g, "Expand"), 1);  // waits for the batch

  const Tensor input = random_tensor({3, 4, 8}, 2);
  const NamedTensors out = run_reference(g, {{"x", input}});
  const Tensor& y = out.begin()->second;
  ASSERT_EQ(y.shape(), (std::vector<int64_t>{3, 5, 8}));
  for (int64_t n = 0; n < 3; ++n) {
    for (int64_t i = 0; i < 8; ++i) {
      EXPECT_EQ(y.data<float>()[n * 40 + i], token.data<float>()[i]) << n << " " << i;
      EXPECT_EQ(y.data<float>()[n * 40 + 8 + i], input.data<float>()[n * 32 + i]) << n << " " << i;
    }
  }
}

// A node whose shape input stays computed from data is still refused, by specialize().
TEST(Specialize, ExpandToAShapeComputedFromDataIsRefusedNamingTheNode) {
  GraphBuilder b;
  const int x = b.input("x", {-1, 4, 8});
  const int target = b.input("target", {3});
  graph::Graph g = b.finish({b.node("Expand", {x, target}, {}, std::nullopt)});
  graph::optimize(g, runtime::evaluate_node);
  test::expect_error(
      [&] {
        graph::specialize(g, {{"x", {2, 4, 8}}, {"target", {3}}}, runtime::evaluate_node);
      },
      ErrorCode::kUnsupported, {"Expand", "shape (input 1) must be a constant"});
}

// A residual Add whose operands' batch dims shape inference named apart (as in BERT's export) is
// left alone at load and fused once specialize() makes every shape concrete, with the same
// results.
TEST(Specialize, FusesResidualAddsOnceShapesAreKnown) {
  GraphBuilder b;
  const int x = b.input("x", {-1, 5, 8}, "batch");
  const int r = b.input("r", {-1, 5, 16}, "unk__0");
  const graph::Shape out{{-1, "unk__1"}, {5, {}}, {16, {}}};
  const Tensor w = random_tensor({8, 16}, 1);
  const int mm = b.node("MatMul", {x, b.constant("w", w)}, {}, out);
  const int add = b.node("Add", {mm, r}, {}, out);
  graph::Graph g = b.finish({b.node("Relu", {add}, {}, out)});
  graph::optimize(g, runtime::evaluate_node);
  EXPECT_EQ(count_ops(g, "Add"), 1) << "shapes not known to match at load";
  const NamedTensors inputs = {{"x", random_tensor({3, 5, 8}, 2)},
                               {"r", random_tensor({3, 5, 16}, 3)}};
  const graph::Graph s =
      graph::specialize(g, {{"x", {3, 5, 8}}, {"r", {3, 5, 16}}}, runtime::evaluate_node);
  ASSERT_EQ(s.nodes.size(), 1u);
  EXPECT_EQ(kinds(s.nodes[0]),
            (std::vector<EpilogueOp::Kind>{EpilogueOp::Kind::kAdd, EpilogueOp::Kind::kRelu}));
  // relu(x w + r), computed here: run_reference() specializes (and so fuses) too.
  const Tensor& xs = inputs.at("x");
  const Tensor& rs = inputs.at("r");
  Tensor want = Tensor::zeros(DType::kFloat32, {3, 5, 16});
  for (int64_t t = 0; t < 15; ++t) {
    for (int64_t n = 0; n < 16; ++n) {
      float acc = rs.data<float>()[t * 16 + n];
      for (int64_t k = 0; k < 8; ++k)
        acc += xs.data<float>()[t * 8 + k] * w.data<float>()[k * 16 + n];
      want.data<float>()[t * 16 + n] = std::max(acc, 0.0f);
    }
  }
  const NamedTensors got = runtime::make_reference_executor(s)->run(inputs);
  EXPECT_LE(max_abs_diff(got.begin()->second, want), 1e-5f);
}

TEST(Specialize, RejectsShapeContradictingAFixedDimension) {
  GraphBuilder b;
  const int x = b.input("x", {-1, 8});
  graph::Graph g = b.finish({b.node("Relu", {x})});
  try {
    graph::specialize(g, {{"x", {2, 7}}}, runtime::evaluate_node);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kShapeMismatch);
    EXPECT_NE(std::string(e.what()).find("'x'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("[N, 8]"), std::string::npos) << e.what();
  }
}

TEST(RemoveDead, DropsNodesThatFeedNoOutput) {
  GraphBuilder b;
  const int x = b.input("x", {2});
  const int used = b.node("Relu", {x});
  b.node("Neg", {x});
  graph::Graph g = b.finish({used});
  g.remove_dead();
  EXPECT_EQ(g.nodes.size(), 1u);
  EXPECT_EQ(g.nodes[0].op_type, "Relu");
}

}  // namespace
}  // namespace sparsecol::testing
