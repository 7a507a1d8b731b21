// The onednn schedule against the reference schedule on small hand-built graphs: each op that
// maps to a oneDNN primitive, each fused epilogue as a post-op, and reference-op fallbacks in
// the middle of a blocked-layout region.
//
// Tolerance: max |onednn - reference| <= 1e-4 * max(1, max |reference|). Both sides compute in
// float32 but oneDNN sums in its own order (and blocks over channels), so results differ in
// the last bits; a wrong layout, padding or post-op gives errors of the order of the values.
#include <gtest/gtest.h>

#include <cmath>

#include "graph/passes.h"
#include "graph_builder.h"
#include "runtime/executor.h"
#include "runtime/reference/reference_ops.h"
#include "sparsecol/sparsecol.h"
#include "test_models.h"

namespace sparsecol {
namespace {

using testing::GraphBuilder;
using testing::random_tensor;
using testing::scalar;

constexpr float kRelativeTolerance = 1e-4f;

graph::Graph specialized(graph::Graph g, const NamedTensors& inputs) {
  graph::optimize(g, runtime::evaluate_node);
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const auto& [name, t] : inputs) shapes[name] = t.shape();
  return graph::specialize(g, shapes, runtime::evaluate_node);
}

// How many nodes of the optimized graph carry an epilogue of `kind`.
int fused_count(const graph::Graph& g, graph::EpilogueOp::Kind kind) {
  int count = 0;
  for (const graph::Node& node : g.nodes) {
    for (const graph::EpilogueOp& op : node.epilogue) count += op.kind == kind;
  }
  return count;
}

// Runs `g` on both schedules and checks every output; returns the onednn outputs.
NamedTensors expect_matches_reference(const graph::Graph& g, const NamedTensors& inputs,
                                      int threads = 2) {
  const graph::Graph s = specialized(g, inputs);
  const NamedTensors expected = runtime::make_reference_executor(s)->run(inputs);
  const NamedTensors actual = runtime::make_onednn_executor(s, threads)->run(inputs);
  EXPECT_TRUE(testing::outputs_near(actual, expected, kRelativeTolerance));
  return actual;
}

std::map<std::string, graph::AttrValue> conv_attrs(std::vector<int64_t> pads,
                                                   std::vector<int64_t> strides = {1, 1},
                                                   std::vector<int64_t> dilations = {1, 1},
                                                   int64_t group = 1) {
  return {{"pads", pads}, {"strides", strides}, {"dilations", dilations}, {"group", group}};
}

TEST(OneDnnTest, ConvChainWithBiasAndReluMatchesReference) {
  GraphBuilder b;
  const int x = b.input("x", {2, 16, 10, 10});
  const int w1 = b.constant("w1", random_tensor({32, 16, 3, 3}, 1, -0.2f, 0.2f));
  const int b1 = b.constant("b1", random_tensor({32}, 2));
  const int w2 = b.constant("w2", random_tensor({24, 32, 1, 1}, 3, -0.2f, 0.2f));
  const int c1 = b.node("Conv", {x, w1, b1}, conv_attrs({1, 1, 1, 1}));
  const int r1 = b.node("Relu", {c1});
  const int c2 = b.node("Conv", {r1, w2}, conv_attrs({0, 0, 0, 0}));
  const graph::Graph g = b.finish({c2});
  const NamedTensors in{{"x", random_tensor({2, 16, 10, 10}, 4)}};
  EXPECT_EQ(fused_count(specialized(g, in), graph::EpilogueOp::Kind::kRelu), 1);
  expect_matches_reference(g, in);
}

TEST(OneDnnTest, StridedDilatedAsymmetricAndDepthwiseConvsWithClipMatchReference) {
  GraphBuilder b;
  const int x = b.input("x", {1, 8, 13, 11});
  const int w1 = b.constant("w1", random_tensor({16, 8, 3, 3}, 1, -0.3f, 0.3f));
  const int w2 = b.constant("w2", random_tensor({16, 1, 3, 3}, 2, -0.3f, 0.3f));
  const int b2 = b.constant("b2", random_tensor({16}, 3));
  const int c1 = b.node("Conv", {x, w1}, conv_attrs({2, 1, 0, 2}, {2, 2}, {2, 1}));
  const int c2 = b.node("Conv", {c1, w2, b2}, conv_attrs({1, 1, 1, 1}, {1, 1}, {1, 1}, 16));
  const int clip =
      b.node("Clip", {c2, b.constant("lo", scalar(0.0f)), b.constant("hi", scalar(0.5f))});
  const graph::Graph g = b.finish({clip});
  const NamedTensors in{{"x", random_tensor({1, 8, 13, 11}, 4)}};
  EXPECT_EQ(fused_count(specialized(g, in), graph::EpilogueOp::Kind::kClip), 1);
  expect_matches_reference(g, in);
}

// y = relu(conv_c(conv_b(x1)) + x1): the residual is dead after the Add, so the sum post-op
// runs in place in its buffer; z = conv_d(y) + y reads its residual as its own source too, so
// that one must be copied first.
TEST(OneDnnTest, ResidualAddsAsSumPostOpInPlaceAndCopiedMatchReference) {
  GraphBuilder b;
  const int x = b.input("x", {2, 16, 8, 8});
  auto weights = [&](uint32_t seed) {
    return b.constant("w" + std::to_string(seed), random_tensor({16, 16, 3, 3}, seed, -0.1f, 0.1f));
  };
  const int x1 = b.node("Conv", {x, weights(1)}, conv_attrs({1, 1, 1, 1}));
  const int t =
      b.node("Conv", {b.node("Conv", {x1, weights(2)}, conv_attrs({1, 1, 1, 1})), weights(3)},
             conv_attrs({1, 1, 1, 1}));
  const int y = b.node("Relu", {b.node("Add", {t, x1})});
  const int z = b.node("Add", {b.node("Conv", {y, weights(4)}, conv_attrs({1, 1, 1, 1})), y});
  const graph::Graph g = b.finish({z});
  const NamedTensors in{{"x", random_tensor({2, 16, 8, 8}, 5)}};
  EXPECT_EQ(fused_count(specialized(g, in), graph::EpilogueOp::Kind::kAdd), 2);
  expect_matches_reference(g, in);
}

// A second residual Add on the same node becomes a binary post-op; the graph input used as a
// residual must never be written.
TEST(OneDnnTest, GraphInputResidualIsNotOverwrittenAndRunsRepeat) {
  GraphBuilder b;
  const int x = b.input("x", {1, 16, 6, 6});
  const int w = b.constant("w", random_tensor({16, 16, 3, 3}, 1, -0.1f, 0.1f));
  const int w2 = b.constant("w2", random_tensor({16, 16, 1, 1}, 2, -0.1f, 0.1f));
  const int other = b.node("Conv", {x, w2}, conv_attrs({0, 0, 0, 0}));
  const int c = b.node("Conv", {b.node("Relu", {other}), w}, conv_attrs({1, 1, 1, 1}));
  const int y = b.node("Add", {b.node("Add", {c, x}), other});
  const graph::Graph g = b.finish({y});
  const Tensor input = random_tensor({1, 16, 6, 6}, 3);
  const Tensor before = input.clone();
  const NamedTensors in{{"x", input}};
  EXPECT_EQ(fused_count(specialized(g, in), graph::EpilogueOp::Kind::kAdd), 2);
  const NamedTensors first = expect_matches_reference(g, in);
  EXPECT_EQ(testing::max_abs_diff(input, before), 0.0f);
  auto executor = runtime::make_onednn_executor(specialized(g, in), 2);
  const Tensor once = executor->run(in).at(first.begin()->first);
  const Tensor twice = executor->run(in).at(first.begin()->first);
  EXPECT_EQ(testing::max_abs_diff(once, twice), 0.0f);
}

TEST(OneDnnTest, PoolingOnBlockedLayoutMatchesReference) {
  GraphBuilder b;
  const int x = b.input("x", {2, 16, 11, 11});
  const int c = b.node("Conv", {x, b.constant("w", random_tensor({32, 16, 1, 1}, 1))},
                       conv_attrs({0, 0, 0, 0}));
  using Attrs = std::map<std::string, graph::AttrValue>;
  const int max = b.node("MaxPool", {c},
                         Attrs{{"kernel_shape", std::vector<int64_t>{3, 3}},
                               {"strides", std::vector<int64_t>{2, 2}},
                               {"pads", std::vector<int64_t>{1, 1, 1, 1}}});
  const int avg = b.node("AveragePool", {c},
                         Attrs{{"kernel_shape", std::vector<int64_t>{3, 2}},
                               {"strides", std::vector<int64_t>{2, 2}},
                               {"pads", std::vector<int64_t>{1, 0, 1, 0}},
                               {"count_include_pad", int64_t{1}}});
  const int ceil = b.node("AveragePool", {c},
                          Attrs{{"kernel_shape", std::vector<int64_t>{2, 2}},
                                {"strides", std::vector<int64_t>{2, 2}},
                                {"ceil_mode", int64_t{1}}});
  const int dilated = b.node("MaxPool", {c},
                             Attrs{{"kernel_shape", std::vector<int64_t>{2, 2}},
                                   {"dilations", std::vector<int64_t>{2, 2}}});
  const int global = b.node("GlobalAveragePool", {c});
  const int global_max = b.node("GlobalMaxPool", {c});
  const graph::Graph g = b.finish({max, avg, ceil, dilated, global, global_max});
  expect_matches_reference(g, {{"x", random_tensor({2, 16, 11, 11}, 2)}});
}

// ResNet's head: global pool, Flatten, Gemm (transB, alpha, beta) with a fused Relu.
TEST(OneDnnTest, PoolFlattenGemmHeadMatchesReference) {
  GraphBuilder b;
  const int x = b.input("x", {3, 20, 5, 5});
  const int c = b.node("Conv", {x, b.constant("w", random_tensor({24, 20, 3, 3}, 1, -0.2f, 0.2f))},
                       conv_attrs({1, 1, 1, 1}));
  const int flat = b.node("Flatten", {b.node("GlobalAveragePool", {c})}, {{"axis", int64_t{1}}});
  const int fc = b.node("Gemm",
                        {flat, b.constant("fw", random_tensor({10, 24}, 2)),
                         b.constant("fb", random_tensor({10}, 3))},
                        {{"transB", int64_t{1}}, {"alpha", 0.5f}, {"beta", 2.0f}});
  const int y = b.node("Relu", {fc});
  const graph::Graph g = b.finish({y});
  const NamedTensors in{{"x", random_tensor({3, 20, 5, 5}, 4)}};
  EXPECT_EQ(fused_count(specialized(g, in), graph::EpilogueOp::Kind::kRelu), 1);
  expect_matches_reference(g, in);
}

// A transformer block's pieces: linear layers (bias -> matmul bias, erf GELU -> post-op,
// residual -> sum), attention (Reshape, Transpose -> reorder, batched MatMul of two runtime
// tensors, scalar Div, Softmax) and LayerNormalization.
TEST(OneDnnTest, TransformerBlockMatchesReference) {
  const int64_t batch = 2, seq = 8, hidden = 16, heads = 2, head_dim = hidden / heads;
  GraphBuilder b;
  const int x = b.input("x", {batch, seq, hidden});
  auto linear = [&](int in, int64_t k, int64_t n, uint32_t seed) {
    const int mm = b.node("MatMul", {in, b.constant("w" + std::to_string(seed),
                                                    random_tensor({k, n}, seed, -0.3f, 0.3f))});
    return b.node("Add",
                  {mm, b.constant("b" + std::to_string(seed), random_tensor({n}, seed + 100))});
  };
  auto shape = [&](std::vector<int64_t> dims) {
    Tensor t = Tensor::zeros(DType::kInt64, {static_cast<int64_t>(dims.size())});
    for (std::size_t i = 0; i < dims.size(); ++i) t.data<int64_t>()[i] = dims[i];
    return b.constant("shape" + std::to_string(dims.size()) + std::to_string(dims.back()), t);
  };
  auto split = [&](int in, std::vector<int64_t> perm) {
    const int r = b.node("Reshape", {in, shape({batch, seq, heads, head_dim})});
    return b.node("Transpose", {r}, {{"perm", perm}});
  };
  const int q = split(linear(x, hidden, hidden, 1), {0, 2, 1, 3});
  const int kt = split(linear(x, hidden, hidden, 2), {0, 2, 3, 1});
  const int v = split(linear(x, hidden, hidden, 3), {0, 2, 1, 3});
  const int scores = b.node("Div", {b.node("MatMul", {q, kt}), b.constant("d", scalar(2.8f))});
  const int probs = b.node("Softmax", {scores}, {{"axis", int64_t{-1}}});
  const int context = b.node("Transpose", {b.node("MatMul", {probs, v})},
                             {{"perm", std::vector<int64_t>{0, 2, 1, 3}}});
  const int merged = b.node("Reshape", {context, shape({batch, seq, hidden})});
  const int attn = b.node("Add", {linear(merged, hidden, hidden, 4), x});
  auto layer_norm = [&](int in, uint32_t seed) {
    return b.node("LayerNormalization",
                  {in, b.constant("g" + std::to_string(seed), random_tensor({hidden}, seed)),
                   b.constant("be" + std::to_string(seed), random_tensor({hidden}, seed + 1))},
                  {{"axis", int64_t{-1}}, {"epsilon", 1e-5f}});
  };
  const int h = layer_norm(attn, 5);
  // PyTorch's erf GELU, as exported.
  const int f = linear(h, hidden, 32, 6);
  const int erf = b.node("Erf", {b.node("Div", {f, b.constant("sqrt2", scalar(std::sqrt(2.0f)))})});
  const int gelu =
      b.node("Mul", {b.node("Mul", {f, b.node("Add", {erf, b.constant("one", scalar(1.0f))})}),
                     b.constant("half", scalar(0.5f))});
  const int y = layer_norm(b.node("Add", {linear(gelu, 32, hidden, 7), h}), 8);
  const graph::Graph g = b.finish({y});
  const NamedTensors in{{"x", random_tensor({batch, seq, hidden}, 9)}};
  const graph::Graph s = specialized(g, in);
  EXPECT_EQ(fused_count(s, graph::EpilogueOp::Kind::kGelu), 1);
  EXPECT_GE(fused_count(s, graph::EpilogueOp::Kind::kAdd), 7);  // 5 biases, 2 residuals
  expect_matches_reference(g, in);
}

// Element-wise ops on a blocked conv output, binary ops with broadcasting either way (a
// broadcast first operand of Sub has no primitive and falls back), and ops without a
// primitive (Erf, LRN) between two convolutions, followed by Concat.
TEST(OneDnnTest, EltwiseBinaryAndFallbacksInsideBlockedRegionMatchReference) {
  GraphBuilder b;
  const int x = b.input("x", {2, 16, 7, 7});
  auto conv = [&](int in, uint32_t seed) {
    return b.node("Conv",
                  {in, b.constant("w" + std::to_string(seed),
                                  random_tensor({16, 16, 3, 3}, seed, -0.1f, 0.1f))},
                  conv_attrs({1, 1, 1, 1}));
  };
  const int c = conv(x, 1);
  const int per_channel = b.constant("pc", random_tensor({16, 1, 1}, 2, 0.5f, 1.5f));
  const int sig = b.node("Sigmoid", {b.node("Mul", {c, per_channel})});
  const int tanh = b.node("Tanh", {b.node("Add", {per_channel, c})});
  const int leaky = b.node("LeakyRelu", {b.node("Sub", {per_channel, c})}, {{"alpha", 0.2f}});
  const int erf = b.node("Erf", {conv(b.node("Div", {sig, tanh}), 3)});
  const int lrn = b.node("LRN", {conv(erf, 4)}, {{"size", int64_t{3}}});
  const int after = conv(lrn, 5);
  const int cat = b.node("Concat", {after, leaky, b.node("Exp", {c})}, {{"axis", int64_t{1}}});
  const int t = b.node("Transpose", {cat}, {{"perm", std::vector<int64_t>{0, 2, 3, 1}}});
  const graph::Graph g = b.finish({t});
  expect_matches_reference(g, {{"x", random_tensor({2, 16, 7, 7}, 6)}});
}

// ConvTranspose maps to oneDNN's deconvolution: strides, dilations, asymmetric pads,
// output_padding, groups and a bias, around a reference-op fallback (LRN); the layers say which
// ran where.
TEST(OneDnnTest, ConvTransposeRunsAsDeconvolutionAndMatchesReference) {
  using Ints = std::vector<int64_t>;
  GraphBuilder b;
  const int x = b.input("x", {2, 8, 6, 7});
  const int w1 = b.constant("w1", random_tensor({8, 12, 3, 3}, 1, -0.2f, 0.2f));  // [C, M, k]
  const int b1 = b.constant("b1", random_tensor({12}, 2));
  const int up1 = b.node("ConvTranspose", {x, w1, b1},
                         {{"strides", Ints{2, 2}},
                          {"pads", Ints{1, 0, 0, 1}},
                          {"output_padding", Ints{1, 0}},
                          {"dilations", Ints{1, 2}}});
  const int lrn = b.node("LRN", {up1}, {{"size", int64_t{3}}});
  const int w2 = b.constant("w2", random_tensor({12, 3, 2, 2}, 3, -0.2f, 0.2f));  // 2 groups
  const int up2 =
      b.node("ConvTranspose", {lrn, w2}, {{"strides", Ints{2, 2}}, {"group", int64_t{2}}});
  const graph::Graph g = b.finish({up2});
  const NamedTensors in{{"x", random_tensor({2, 8, 6, 7}, 4)}};
  expect_matches_reference(g, in);
  int deconvolutions = 0, fallbacks = 0;
  for (const LayerInfo& layer : runtime::make_onednn_executor(specialized(g, in), 2)->layers()) {
    deconvolutions += layer.op == "ConvTranspose" && layer.implementation == "onednn";
    fallbacks += layer.op == "LRN" && layer.implementation == "reference";
  }
  EXPECT_EQ(deconvolutions, 2);
  EXPECT_EQ(fallbacks, 1);
}

// RNN, GRU and LSTM map to oneDNN's recurrent primitives: both directions (Y reordered from the
// primitive's [T, N, D*H]), reverse, LSTM's gate order (ONNX i, o, f, c), GRU with and without
// linear_before_reset (its Rb_h a bias gate of its own), a vanilla RNN on Relu, with and without
// bias and initial states (LSTM: both, or h0 alone), Y, Y_h and Y_c read or not (LSTM: Y and Y_h
// alone; oneDNN's LSTM takes both states or neither). What the primitives cannot express runs the
// reference op: clip, sequence_lens shorter than the sequence, layout 1, activations other than
// ONNX's defaults. LSTM's peepholes (ONNX's i, o, f; oneDNN's i, f, o) map.
TEST(OneDnnTest, RecurrentOpsRunAsOneDnnPrimitivesOrTheReferenceAndMatchIt) {
  using Attrs = std::map<std::string, graph::AttrValue>;
  struct Case {
    const char* name;
    const char* op;
    Attrs attrs;
    bool bias;
    int initial_states;  // 0, 1 (h0) or 2 (h0 and c0)
    int sequence_lens;   // 0: none; 1: an input, 3, 4 and 5 of 5 steps; 2: a constant, all 5
    int outputs;         // Y, then Y_h, then Y_c
    bool onednn;         // expected to map
    bool peepholes = false;
  };
  using Strings = std::vector<std::string>;
  const Case cases[] = {
      {"bidirectional LSTM",
       "LSTM",
       {{"direction", std::string("bidirectional")}},
       true,
       2,
       0,
       3,
       true},
      {"LSTM, Y only", "LSTM", {}, false, 0, 0, 1, true},
      {"LSTM, Y and Y_h, h0 only", "LSTM", {}, true, 1, 0, 2, true},
      {"reverse LSTM, states only",
       "LSTM",
       {{"direction", std::string("reverse")}},
       true,
       2,
       0,
       3,
       true},
      {"reverse GRU", "GRU", {{"direction", std::string("reverse")}}, true, 2, 0, 2, true},
      {"bidirectional GRU, linear_before_reset",
       "GRU",
       {{"direction", std::string("bidirectional")}, {"linear_before_reset", int64_t{1}}},
       true,
       2,
       0,
       2,
       true},
      {"RNN on Relu", "RNN", {{"activations", Strings{"Relu"}}}, true, 0, 0, 2, true},
      {"bidirectional RNN",
       "RNN",
       {{"direction", std::string("bidirectional")}},
       false,
       2,
       0,
       1,
       true},
      {"bidirectional LSTM with peepholes",
       "LSTM",
       {{"direction", std::string("bidirectional")}},
       true,
       2,
       0,
       3,
       true,
       true},
      {"LSTM with peepholes, no states", "LSTM", {}, false, 0, 0, 1, true, true},
      {"LSTM with clip", "LSTM", {{"clip", 0.5f}}, true, 0, 0, 1, false},
      {"GRU with sequence_lens", "GRU", {}, true, 0, 1, 1, false},
      {"GRU with constant full sequence_lens", "GRU", {}, true, 0, 2, 1, true},
      {"GRU, layout 1", "GRU", {{"layout", int64_t{1}}}, true, 2, 0, 2, false},
      {"RNN, two activations",
       "RNN",
       {{"direction", std::string("bidirectional")}, {"activations", Strings{"Tanh", "Relu"}}},
       true,
       0,
       0,
       1,
       false},
  };
  const int64_t steps = 5, batch = 3, in = 6, hidden = 7;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string op = c.op;
    const int64_t gates = op == "LSTM" ? 4 : op == "GRU" ? 3 : 1;
    const auto direction = c.attrs.find("direction");
    const int64_t dirs =
        direction != c.attrs.end() && std::get<std::string>(direction->second) == "bidirectional"
            ? 2
            : 1;
    const bool batch_major = c.attrs.count("layout") != 0;
    const std::vector<int64_t> x_dims = batch_major ? std::vector<int64_t>{batch, steps, in}
                                                    : std::vector<int64_t>{steps, batch, in};
    const std::vector<int64_t> state_dims = batch_major ? std::vector<int64_t>{batch, dirs, hidden}
                                                        : std::vector<int64_t>{dirs, batch, hidden};
    GraphBuilder b;
    NamedTensors feed = {{"x", random_tensor(x_dims, 11)}};
    std::vector<int> inputs = {
        b.input("x", x_dims),
        b.constant("w", random_tensor({dirs, gates * hidden, in}, 12, -0.5f, 0.5f)),
        b.constant("r", random_tensor({dirs, gates * hidden, hidden}, 13, -0.5f, 0.5f)),
        c.bias ? b.constant("b", random_tensor({dirs, 2 * gates * hidden}, 14, -0.5f, 0.5f)) : -1,
        -1};
    if (c.sequence_lens != 0) {
      Tensor lens = Tensor::zeros(DType::kInt32, {batch});
      for (int64_t i = 0; i < batch; ++i) {
        lens.data<int32_t>()[i] = static_cast<int32_t>(c.sequence_lens == 1 ? i + 3 : steps);
      }
      if (c.sequence_lens == 1) {
        inputs[4] = b.input("lens", {batch});
        feed["lens"] = lens;
      } else {
        inputs[4] = b.constant("lens", lens);
      }
    }
    if (c.initial_states > 0) {
      inputs.push_back(b.input("h0", state_dims));
      feed["h0"] = random_tensor(state_dims, 15);
      if (op == "LSTM" && c.initial_states == 2) {
        inputs.push_back(b.input("c0", state_dims));
        feed["c0"] = random_tensor(state_dims, 16);
      }
    }
    if (c.peepholes) {
      inputs.resize(7, -1);  // P is input 7
      inputs.push_back(b.constant("p", random_tensor({dirs, 3 * hidden}, 17, -0.5f, 0.5f)));
    }
    Attrs attrs = c.attrs;
    attrs["hidden_size"] = hidden;
    const int y = b.node(op, inputs, attrs);
    graph::Graph g = b.finish({y});
    if (c.sequence_lens == 1) g.values[static_cast<std::size_t>(inputs[4])].dtype = DType::kInt32;
    graph::Node& node = g.nodes.back();
    for (int i = 1; i < c.outputs; ++i) {
      node.outputs.push_back(g.add_value(
          {"state" + std::to_string(i), DType::kFloat32, false, std::nullopt, std::nullopt, -1}));
    }
    // "states only": Y computed (the node's first output) but not read.
    g.outputs = std::string(c.name).find("states only") != std::string::npos
                    ? std::vector<int>(node.outputs.begin() + 1, node.outputs.end())
                    : node.outputs;
    g.link();
    expect_matches_reference(g, feed);
    const auto layers = runtime::make_onednn_executor(specialized(g, feed), 2)->layers();
    ASSERT_EQ(layers.size(), 1u);
    EXPECT_EQ(layers[0].implementation, c.onednn ? "onednn" : "reference");
  }
}

TEST(OneDnnTest, EinsumRunsAsOneDnnMatmulOrTheReferenceAndMatchesIt) {
  struct Case {
    const char* equation;
    std::vector<int64_t> a, b;
    bool b_constant;
    bool onednn;  // expected to map
  };
  const Case cases[] = {
      {"bij,bjk->bik", {2, 3, 4}, {2, 4, 5}, false, true},           // as it is
      {"bji,bjk->bik", {2, 4, 3}, {2, 4, 5}, false, true},           // A gathered
      {"bhqd,bhkd->bhqk", {2, 3, 5, 4}, {2, 3, 6, 4}, true, true},   // B gathered
      {"ij,jk->ki", {3, 4}, {4, 5}, false, true},                    // product reordered
      {"...ij,...jk->...ik", {2, 1, 3, 4}, {3, 4, 5}, false, true},  // broadcast batch
      {"ij,j->i", {3, 4}, {4}, true, true},                          // matrix x vector
      {"ij,kl->ijkl", {2, 3}, {4, 5}, false, true},                  // outer product
      {"ii,ij->ij", {4, 4}, {4, 3}, false, true},                    // a diagonal
      {"ij,k->i", {3, 4}, {5}, false, false},                        // each sums a label of its own
      {"i,i->", {4}, {4}, false, false},                             // a scalar output
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.equation);
    GraphBuilder b;
    NamedTensors feed = {{"a", random_tensor(c.a, 21)}};
    const int a = b.input("a", c.a);
    int operand_b;
    if (c.b_constant) {
      operand_b = b.constant("b", random_tensor(c.b, 22));
    } else {
      operand_b = b.input("b", c.b);
      feed["b"] = random_tensor(c.b, 22);
    }
    const int y = b.node("Einsum", {a, operand_b}, {{"equation", std::string(c.equation)}});
    const graph::Graph g = b.finish({y});
    expect_matches_reference(g, feed);
    const auto layers = runtime::make_onednn_executor(specialized(g, feed), 2)->layers();
    ASSERT_EQ(layers.size(), 1u);
    EXPECT_EQ(layers[0].implementation, c.onednn ? "onednn" : "reference");
  }
}

TEST(OneDnnTest, ResultsDoNotDependOnThreadCount) {
  GraphBuilder b;
  const int x = b.input("x", {1, 16, 12, 12});
  const int c = b.node("Conv", {x, b.constant("w", random_tensor({32, 16, 3, 3}, 1, -0.2f, 0.2f))},
                       conv_attrs({1, 1, 1, 1}));
  const graph::Graph g = b.finish({b.node("Relu", {c})});
  const NamedTensors in{{"x", random_tensor({1, 16, 12, 12}, 2)}};
  const Tensor one = expect_matches_reference(g, in, 1).begin()->second;
  const Tensor two = expect_matches_reference(g, in, 2).begin()->second;
  EXPECT_LE(testing::max_abs_diff(one, two), 1e-5f);
}

TEST(OneDnnTest, PublicApiRunsTheOneDnnSchedule) {
  testing::TempDir dir;
  const std::string path = dir.write("mlp.onnx", testing::serialize(testing::make_mlp_model()));
  Options options;
  options.schedule = Schedule::kOneDnn;
  options.threads = 2;
  Engine onednn = Engine::load(path, options);
  options.schedule = Schedule::kReference;
  Engine reference = Engine::load(path, options);
  const Tensor x = random_tensor({5, 4}, 1, -3.0f, 3.0f);
  const Tensor got = onednn.session().run({{"x", x}}).at("y");
  const Tensor want = reference.session().run({{"x", x}}).at("y");
  EXPECT_LE(testing::max_abs_diff(got, want), 1e-5f);
}

TEST(OneDnnTest, NonPositiveThreadCountIsRefused) {
  GraphBuilder b;
  const int x = b.input("x", {2});
  const graph::Graph g = b.finish({b.node("Relu", {x})});
  EXPECT_THROW(runtime::make_onednn_executor(g, 0), Error);
}

}  // namespace
}  // namespace sparsecol
