// The layerwise executor (fast kernels, planned arena, OpenMP) computes what the reference
// executor computes, for any thread count, run after run.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "../test_util.h"
#include "f32-conv/conv.h"
#include "graph/passes.h"
#include "graph_builder.h"
#include "runtime/layerwise/steps.h"

namespace sparsecol::testing {
namespace {

std::unique_ptr<runtime::Executor> layerwise(graph::Graph g, const NamedTensors& inputs,
                                             int threads) {
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const auto& [name, t] : inputs) shapes[name] = t.shape();
  graph::optimize(g, runtime::evaluate_node);
  return runtime::make_layerwise_executor(graph::specialize(g, shapes, runtime::evaluate_node),
                                          threads, Options{});
}

// Layerwise at 1, 2 and 3 threads against the unoptimized graph on the reference executor;
// the three thread counts must agree bit for bit.
void expect_matches_reference(const graph::Graph& g, const NamedTensors& inputs,
                              float relative_tolerance = 1e-4f) {
  const NamedTensors expected = run_reference(g, inputs);
  NamedTensors first;
  for (int threads : {1, 2, 3}) {
    const NamedTensors actual = layerwise(g, inputs, threads)->run(inputs);
    EXPECT_TRUE(outputs_near(actual, expected, relative_tolerance)) << "threads " << threads;
    if (threads == 1) {
      first = actual;
    } else {
      EXPECT_TRUE(outputs_near(actual, first, 0.0f)) << "threads " << threads << " vs threads 1";
    }
  }
}

TEST(Layerwise, SmallCnnMatchesReferenceAtAnyThreadCount) {
  expect_matches_reference(residual_cnn(), {{"x", random_tensor({2, 3, 13, 11}, 11)}});
}

// Several images of small planes, stacked into one product per task (a different number per
// stack at each thread count, the same bits).
TEST(Layerwise, StackedImagesMatchReference) {
  const NamedTensors inputs = {{"x", random_tensor({5, 16, 8, 8}, 46)}};
  expect_matches_reference(small_plane_cnn(), inputs);
  int stacked = 0;
  for (const LayerInfo& info : layerwise(small_plane_cnn(), inputs, 2)->layers()) {
    stacked += info.implementation.find("images stacked") != std::string::npos;
  }
  EXPECT_EQ(stacked, 4);
}

// A convolution's output goes into its residual's buffer where nothing reads the residual
// later, and only there; results as without (the reference), on planes whose images are stacked
// (7x7) and planes whose are not (9x10). The layer of residual_cnn() too.
TEST(Layerwise, OutputOverwritesAResidualOnlyWhereNothingReadsItLater) {
  for (const auto& [h, w] : {std::pair<int64_t, int64_t>{9, 10}, {7, 7}}) {
    SCOPED_TRACE(::testing::Message() << h << "x" << w << " planes");
    const NamedTensors inputs = {{"x", random_tensor({3, 16, h, w}, 47)}};
    expect_matches_reference(residual_reuse_net(h, w), inputs);
    EXPECT_EQ(written_over_residuals(layerwise(residual_reuse_net(h, w), inputs, 2)->layers()),
              (std::vector<bool>{true, true, false, false, false}));
  }
  const NamedTensors inputs = {{"x", random_tensor({2, 3, 13, 11}, 11)}};
  EXPECT_EQ(written_over_residuals(layerwise(residual_cnn(), inputs, 2)->layers()),
            std::vector<bool>{true});
}

// A softmax or layer norm writes its rows over its input where nothing reads the input later and
// its output is not the graph's: in token_net(), the layer norm's input is read again by a
// residual add, the first softmax's only by it, and the second softmax is a graph output.
TEST(Layerwise, RowOpsWriteOverTheirInputOnlyWhereNothingReadsItLater) {
  const NamedTensors inputs = {{"x", random_tensor({2, 128, 24}, 48, -2.0f, 2.0f)}};
  expect_matches_reference(token_net(), inputs);
  std::vector<std::pair<std::string, bool>> rows;
  for (const LayerInfo& info : layerwise(token_net(), inputs, 2)->layers()) {
    if (info.op != "Softmax" && info.op != "LayerNormalization") continue;
    rows.emplace_back(info.op, info.implementation.find(runtime::layerwise::kWrittenOverInput) !=
                                   std::string::npos);
  }
  EXPECT_EQ(rows, (std::vector<std::pair<std::string, bool>>{
                      {"LayerNormalization", false}, {"Softmax", true}, {"Softmax", false}}));
}

TEST(Layerwise, BatchOfOneMatchesReference) {
  expect_matches_reference(residual_cnn(), {{"x", random_tensor({1, 3, 13, 11}, 12)}});
}

// One transformer encoder block's shapes: linear + bias + GELU, attention scores with a scaled
// batched MatMul and softmax, a decomposed LayerNorm (fused at load), reshapes as views.
graph::Graph encoder_block() {
  constexpr int64_t kHidden = 16;
  GraphBuilder b;
  const int x = b.input("x", {-1, 6, kHidden});
  const int q =
      b.node("Add", {b.node("MatMul", {x, b.constant("wq", random_tensor({kHidden, kHidden}, 1))}),
                     b.constant("bq", random_tensor({kHidden}, 2))});
  const int heads =
      b.node("Transpose",
             {b.node("Reshape", {q, b.constant("s4",
                                               [] {
                                                 Tensor t = Tensor::zeros(DType::kInt64, {4});
                                                 const int64_t d[] = {0, 6, 2, 8};
                                                 std::copy(d, d + 4, t.data<int64_t>());
                                                 return t;
                                               }())})},
             {{"perm", std::vector<int64_t>{0, 2, 1, 3}}});
  const int keys = b.node("Transpose", {heads}, {{"perm", std::vector<int64_t>{0, 1, 3, 2}}});
  const int scores = b.node(
      "Div", {b.node("MatMul", {heads, keys}), b.constant("scale", scalar(std::sqrt(8.0f)))});
  const int masked = b.node("Add", {scores, b.constant("mask", random_tensor({6}, 3))});
  const int probs = b.node("Softmax", {masked}, {{"axis", int64_t{-1}}});
  const int context = b.node("MatMul", {probs, heads});
  const int merged = b.node(
      "Reshape", {b.node("Transpose", {context}, {{"perm", std::vector<int64_t>{0, 2, 1, 3}}}),
                  b.constant("s3", [] {
                    Tensor t = Tensor::zeros(DType::kInt64, {3});
                    const int64_t d[] = {0, 6, kHidden};
                    std::copy(d, d + 3, t.data<int64_t>());
                    return t;
                  }())});
  const int residual = b.node(
      "Add",
      {b.node("MatMul", {merged, b.constant("wo", random_tensor({kHidden, kHidden}, 4))}), x});
  // nn.LayerNorm as exported at opset 13.
  const std::map<std::string, graph::AttrValue> last = {{"axes", std::vector<int64_t>{-1}}};
  const int d = b.node("Sub", {residual, b.node("ReduceMean", {residual}, last)});
  const int var = b.node("ReduceMean", {b.node("Pow", {d, b.constant("two", scalar(2.0f))})}, last);
  const int normed =
      b.node("Div", {d, b.node("Sqrt", {b.node("Add", {var, b.constant("eps", scalar(1e-5f))})})});
  const int ln =
      b.node("Add", {b.node("Mul", {normed, b.constant("gamma", random_tensor({kHidden}, 5))}),
                     b.constant("beta", random_tensor({kHidden}, 6))});
  // GELU, erf form.
  const int h =
      b.node("Add", {b.node("MatMul", {ln, b.constant("w1", random_tensor({kHidden, 32}, 7))}),
                     b.constant("b1", random_tensor({32}, 8))});
  const int erf = b.node("Erf", {b.node("Div", {h, b.constant("sqrt2", scalar(std::sqrt(2.0f)))})});
  const int gelu =
      b.node("Mul", {b.node("Mul", {h, b.node("Add", {erf, b.constant("one", scalar(1.0f))})}),
                     b.constant("half", scalar(0.5f))});
  const int out = b.node(
      "Add", {b.node("MatMul", {gelu, b.constant("w2", random_tensor({32, kHidden}, 9))}), ln});
  return b.finish({out, probs});
}

TEST(Layerwise, EncoderBlockMatchesReferenceAtAnyThreadCount) {
  expect_matches_reference(encoder_block(), {{"x", random_tensor({2, 6, 16}, 21, -2.0f, 2.0f)}});
}

TEST(Layerwise, SecondRunInReusedBuffersGivesTheSameResult) {
  const NamedTensors inputs = {{"x", random_tensor({2, 6, 16}, 22)}};
  auto executor = layerwise(encoder_block(), inputs, 2);
  const NamedTensors first = executor->run(inputs);
  const NamedTensors other = executor->run({{"x", random_tensor({2, 6, 16}, 23)}});
  const NamedTensors again = executor->run(inputs);
  for (const auto& [name, t] : first) {
    EXPECT_EQ(max_abs_diff(t, again.at(name)), 0.0f) << name;
    EXPECT_GT(max_abs_diff(t, other.at(name)), 0.0f) << name << " ignores its input";
  }
}

TEST(Layerwise, GraphOutputThatIsAViewIsCopiedForTheCaller) {
  GraphBuilder b;
  const int x = b.input("x", {2, 3, 4});
  const int relu = b.node("Relu", {x});
  const int flat = b.node("Flatten", {relu});
  const int sum = b.node("Add", {flat, flat});
  graph::Graph g = b.finish({flat, sum});
  expect_matches_reference(g, {{"x", random_tensor({2, 3, 4}, 31)}});
  const NamedTensors inputs = {{"x", random_tensor({2, 3, 4}, 32)}};
  auto executor = layerwise(g, inputs, 1);
  const NamedTensors first = executor->run(inputs);
  const Tensor kept = first.at("Flatten_1_out").clone();
  executor->run({{"x", random_tensor({2, 3, 4}, 33)}});
  EXPECT_EQ(max_abs_diff(kept, first.at("Flatten_1_out")), 0.0f)
      << "an output handed to the caller was overwritten by the next run";
}

// The fast Transpose (batched 2-D transposes or contiguous runs, axes merged) moves every
// element where the reference does: random ranks 1-5, dims including 1 and non-multiples of the
// 4 x 4 blocks, random permutations, each one the graph's output after a Neg (exact, so that it is
// not a graph input). Transposes move bits: the tolerance is 0.
TEST(Layerwise, TransposeOfRandomPermutationsMatchesReference) {
  std::mt19937 rng(51);
  for (int trial = 0; trial < 40; ++trial) {
    const auto rank = static_cast<std::size_t>(1 + rng() % 5);
    std::vector<int64_t> dims(rank), perm(rank);
    for (std::size_t a = 0; a < rank; ++a) {
      dims[a] = rng() % 4 == 0 ? 1 : 1 + static_cast<int64_t>(rng() % (rank <= 2 ? 37 : 9));
      perm[a] = static_cast<int64_t>(a);
    }
    std::shuffle(perm.begin(), perm.end(), rng);
    SCOPED_TRACE(::testing::Message() << "trial " << trial);
    GraphBuilder b;
    const int x = b.input("x", dims);
    const int t = b.node("Transpose", {b.node("Neg", {x})}, {{"perm", perm}});
    const graph::Graph g = b.finish({t});
    const NamedTensors inputs = {{"x", random_tensor(dims, 60 + trial)}};
    expect_matches_reference(g, inputs, 0.0f);
    bool fast = false;
    for (const LayerInfo& l : layerwise(g, inputs, 1)->layers()) {
      fast = fast || l.implementation == "transpose-2d";
    }
    EXPECT_TRUE(fast) << "the Transpose did not take the fast step";
  }
}

// Found by the importer fuzzer: a product with an empty side (N = 0 here, M = 0 and a batch of
// none too) divided by zero when the GEMM step sized its blocks. Empty outputs, no work.
TEST(Layerwise, EmptyProductsGiveEmptyOutputs) {
  for (const auto& [a_dims, b_dims] :
       {std::pair<std::vector<int64_t>, std::vector<int64_t>>{{3, 4}, {4, 0}},
        {{0, 4}, {4, 5}},
        {{0, 2, 4}, {4, 5}}}) {
    GraphBuilder b;
    const int x = b.input("a", a_dims);
    const int w = b.input("b", b_dims);
    const graph::Graph g = b.finish({b.node("MatMul", {x, w})});
    expect_matches_reference(g,
                             {{"a", random_tensor(a_dims, 71)}, {"b", random_tensor(b_dims, 72)}});
  }
}

// A recurrent op with constant weights takes the GEMM step (kernels::PackedRecurrent): an LSTM
// in both directions with peepholes, sequence_lens (an int32 input: 0, partial and whole) and
// initial states, only its states read; and a GRU with layout 1 and
// linear_before_reset whose Y alone is read. Batch 6 cuts into tasks of 4 and 2 entries.
TEST(Layerwise, RecurrentOpsTakeTheGemmStepAndMatchReference) {
  const int64_t steps = 5, batch = 6, in = 7, hidden = 9;
  for (const bool lstm : {true, false}) {
    SCOPED_TRACE(lstm ? "LSTM" : "GRU");
    const int64_t gates = lstm ? 4 : 3, dirs = lstm ? 2 : 1;
    GraphBuilder b;
    const std::vector<int64_t> x_dims =
        lstm ? std::vector<int64_t>{steps, batch, in} : std::vector<int64_t>{batch, steps, in};
    const std::vector<int64_t> state_dims = lstm ? std::vector<int64_t>{dirs, batch, hidden}
                                                 : std::vector<int64_t>{batch, dirs, hidden};
    const int x = b.input("x", x_dims);
    const int lens = b.input("lens", {batch});
    const int h0 = b.input("h0", state_dims);
    std::vector<int> inputs = {
        x, b.constant("w", random_tensor({dirs, gates * hidden, in}, 81, -0.5f, 0.5f)),
        b.constant("r", random_tensor({dirs, gates * hidden, hidden}, 82, -0.5f, 0.5f)),
        b.constant("bias", random_tensor({dirs, 2 * gates * hidden}, 83, -0.5f, 0.5f))};
    std::map<std::string, graph::AttrValue> attrs = {{"hidden_size", hidden}};
    if (lstm) {
      inputs.insert(inputs.end(), {lens, h0, b.input("c0", state_dims),
                                   b.constant("p", random_tensor({dirs, 3 * hidden}, 84))});
      attrs["direction"] = std::string("bidirectional");
    } else {
      inputs.insert(inputs.end(), {-1, h0});
      attrs["layout"] = int64_t{1};
      attrs["linear_before_reset"] = int64_t{1};
    }
    const int y = b.node(lstm ? "LSTM" : "GRU", inputs, attrs);
    graph::Graph g = b.finish({y});
    g.values[static_cast<std::size_t>(lens)].dtype = DType::kInt32;
    if (lstm) {  // Y unread (as the importer keeps an omitted output); Y_h and Y_c the outputs
      graph::Node& node = g.nodes.back();
      const int y_h = g.add_value({"y_h", DType::kFloat32, false, std::nullopt, std::nullopt, -1});
      const int y_c = g.add_value({"y_c", DType::kFloat32, false, std::nullopt, std::nullopt, -1});
      node.outputs = {y, y_h, y_c};
      g.outputs = {y_h, y_c};
      g.link();
    }
    Tensor lengths = Tensor::zeros(DType::kInt32, {batch});
    const int32_t chosen[] = {5, 0, 3, 5, 1, 4};
    std::copy(std::begin(chosen), std::end(chosen), lengths.data<int32_t>());
    NamedTensors feed = {{"x", random_tensor(x_dims, 85)}, {"h0", random_tensor(state_dims, 86)}};
    if (lstm) {
      feed["lens"] = lengths;
      feed["c0"] = random_tensor(state_dims, 87);
    } else {
      g.inputs.erase(std::find(g.inputs.begin(), g.inputs.end(), lens));
    }
    expect_matches_reference(g, feed);
    bool fast = false;
    for (const LayerInfo& l : layerwise(g, feed, 2)->layers()) {
      fast = fast || l.implementation.rfind("recurrent-gemm/", 0) == 0;
    }
    EXPECT_TRUE(fast) << "the recurrent op did not take the GEMM step";
    if (lstm) {  // a length past the sequence, handed in at run time, is refused
      lengths.data<int32_t>()[3] = steps + 1;
      feed["lens"] = lengths;
      test::expect_error([&] { layerwise(g, feed, 2)->run(feed); }, ErrorCode::kInvalidArgument,
                         {"LSTM", "sequence_lens[3] = 6", "[0, 5]"});
    }
  }
}

// BERT's attention in miniature (x [batch, 5 tokens, 3 heads x 4]): Q and V moved head-major, K
// to [head, depth, token], the context back token-major, as PyTorch exports it.
graph::Graph attention_block() {
  constexpr int64_t kTokens = 5, kHeads = 3, kDepth = 4, kWidth = kHeads * kDepth;
  GraphBuilder b;
  const int x = b.input("x", {-1, kTokens, kWidth});
  auto shape = [&](const std::string& name, std::vector<int64_t> dims) {
    Tensor t = Tensor::zeros(DType::kInt64, {static_cast<int64_t>(dims.size())});
    std::copy(dims.begin(), dims.end(), t.data<int64_t>());
    return b.constant(name, std::move(t));
  };
  auto heads = [&](const std::string& name, uint32_t seed, std::vector<int64_t> perm) {
    const int projected = b.node(
        "Add",
        {b.node("MatMul", {x, b.constant("w" + name, random_tensor({kWidth, kWidth}, seed))}),
         b.constant("b" + name, random_tensor({kWidth}, seed + 1))});
    return b.node(
        "Transpose",
        {b.node("Reshape", {projected, shape(name + "_heads", {0, kTokens, kHeads, kDepth})})},
        {{"perm", std::move(perm)}});
  };
  const int q = heads("q", 1, {0, 2, 1, 3}), k = heads("k", 3, {0, 2, 3, 1}),
            v = heads("v", 5, {0, 2, 1, 3});
  const int scores =
      b.node("Div", {b.node("MatMul", {q, k}), b.constant("scale", scalar(std::sqrt(4.0f)))});
  const int probs = b.node("Softmax", {scores}, {{"axis", int64_t{-1}}});
  const int context = b.node("Transpose", {b.node("MatMul", {probs, v})},
                             {{"perm", std::vector<int64_t>{0, 2, 1, 3}}});
  return b.finish({b.node("Reshape", {context, shape("merged", {0, kTokens, kWidth})})});
}

// The attention's four Transposes fold into its two products (graph::fold_matmul_transposes),
// whose GEMMs read Q, K and V and write the context in place, K as a transposed B; the results
// are the reference's on the unoptimized graph.
TEST(Layerwise, AttentionTransposesFoldIntoItsProductsReadInPlace) {
  const NamedTensors inputs = {{"x", random_tensor({2, 5, 12}, 60)}};
  graph::Graph g = attention_block();
  graph::optimize(g, runtime::evaluate_node);
  g = graph::specialize(g, {{"x", {2, 5, 12}}}, runtime::evaluate_node);
  graph::fold_matmul_transposes(g);
  std::vector<std::string> equations;
  for (const graph::Node& node : g.nodes) {
    EXPECT_NE(node.op_type, "Transpose") << node.name;
    if (node.op_type == "Einsum") equations.push_back(node.attr_string("equation", ""));
  }
  EXPECT_EQ(equations, (std::vector<std::string>{"axby,azby->abxz", "abxy,aybz->axbz"}));
  std::vector<std::string> products;
  for (const LayerInfo& l : layerwise(attention_block(), inputs, 2)->layers()) {
    if (l.op == "Einsum") products.push_back(l.implementation);
  }
  const std::string isa = kernels::to_string(kernels::active_isa());
  EXPECT_EQ(products, (std::vector<std::string>{"einsum gemm/" + isa + "; B transposed",
                                                "einsum gemm/" + isa}));
  expect_matches_reference(attention_block(), inputs);
}

// Einsum of one or two float operands takes the GEMM step: random equations over up to 6
// labels (batch labels in both operands and the output, labels of one operand kept or summed,
// labels summed from both), written in random orders, with diagonals (a label twice in one
// term), ellipses and size-1 broadcasts mixed in, against the reference's double loops.
TEST(Layerwise, EinsumOfRandomEquationsTakesTheGemmStepAndMatchesReference) {
  std::mt19937 rng(20261127);
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  for (int trial = 0; trial < 60; ++trial) {
    const int operands = pick(1, 2);
    const std::string letters = "abcdef";
    std::map<char, int64_t> size;
    for (char l : letters) size[l] = pick(1, 5);
    std::vector<std::string> terms(static_cast<std::size_t>(operands));
    std::string used;
    for (char l : letters) {
      const int where = pick(0, operands == 2 ? 3 : 1);  // 0: none, 1: A, 2: B, 3: both
      if (where == 0) continue;
      used += l;
      if (where & 1) terms[0] += l;
      if (operands == 2 && (where & 2)) terms[1] += l;
    }
    if (terms[0].empty()) {
      terms[0] += 'a';
      if (used.find('a') == std::string::npos) used += 'a';
    }
    for (std::string& t : terms) std::shuffle(t.begin(), t.end(), rng);
    if (pick(0, 3) == 0) terms[0] += terms[0][0];  // a diagonal
    std::string out;
    for (char l : used) {
      if (pick(0, 1) == 1) out += l;
    }
    std::shuffle(out.begin(), out.end(), rng);
    const bool ellipsis = pick(0, 3) == 0;
    std::vector<int64_t> ellipsis_dims = {pick(1, 3)};
    std::vector<std::vector<int64_t>> shapes;
    std::string equation;
    for (std::size_t i = 0; i < terms.size(); ++i) {
      std::vector<int64_t> dims;
      if (ellipsis) {
        // The second operand broadcasts the ellipsis' dimension from 1 every other trial.
        dims.push_back(i == 1 && trial % 2 == 0 ? 1 : ellipsis_dims[0]);
      }
      for (char l : terms[i]) dims.push_back(size[l]);
      shapes.push_back(dims);
      equation += (i > 0 ? "," : "") + std::string(ellipsis ? "..." : "") + terms[i];
    }
    equation += "->" + std::string(ellipsis ? "..." : "") + out;
    SCOPED_TRACE(equation);
    GraphBuilder b;
    std::vector<int> inputs;
    NamedTensors feed;
    for (std::size_t i = 0; i < shapes.size(); ++i) {
      const std::string name = "x" + std::to_string(i);
      inputs.push_back(b.input(name, shapes[i]));
      feed[name] = random_tensor(shapes[i], 90 + static_cast<uint32_t>(trial * 2 + i));
    }
    const graph::Graph g = b.finish({b.node("Einsum", inputs, {{"equation", equation}})});
    expect_matches_reference(g, feed);
    bool fast = false;
    for (const LayerInfo& l : layerwise(g, feed, 1)->layers()) {
      fast = fast || l.implementation.rfind("einsum gemm/", 0) == 0;
    }
    EXPECT_TRUE(fast) << "the Einsum did not take the GEMM step";
    if (HasFailure()) return;
  }
  // A sum over a label of size 0 is zeros, written into a buffer that held another value.
  GraphBuilder b;
  const int z = b.input("z", {3, 4});
  const int dead = b.node("Neg", {z});
  const int after = b.node("Neg", {dead});
  const int empty_sum = b.node("Einsum", {b.input("p", {3, 0}), b.input("q", {0, 4})},
                               {{"equation", std::string("ij,jk->ik")}});
  expect_matches_reference(b.finish({b.node("Add", {empty_sum, after})}),
                           {{"z", random_tensor({3, 4}, 98)},
                            {"p", random_tensor({3, 0}, 99)},
                            {"q", random_tensor({0, 4}, 100)}});
}

TEST(Layerwise, OpsWithoutFastKernelFallBackToReference) {
  GraphBuilder b;
  const int x = b.input("x", {2, 3, 4});
  const int t =
      b.node("Transpose", {b.node("Tanh", {x})}, {{"perm", std::vector<int64_t>{2, 0, 1}}});
  const int m = b.node("ReduceMax", {t}, {{"axes", std::vector<int64_t>{0}}});
  expect_matches_reference(b.finish({m}), {{"x", random_tensor({2, 3, 4}, 41)}});
}

// A square 3x3 or 1x1 convolution of `channels` channels on `size` x `size` planes (depthwise:
// one group per channel).
kernels::ConvGeometry square_conv(int64_t channels, int64_t size, int64_t kernel, bool depthwise) {
  kernels::ConvGeometry g;
  g.in_c = g.out_c = channels;
  g.groups = depthwise ? channels : 1;
  g.in_h = g.in_w = g.out_h = g.out_w = size;
  g.kernel_h = g.kernel_w = kernel;
  g.pad_top = g.pad_left = kernel / 2;
  return g;
}

TEST(Layerwise, DenseConvTasksSplitChannelsWhereRowBlocksWouldShareCacheLines) {
  struct Case {
    const char* why;
    kernels::ConvGeometry geometry;
    int64_t granule, batch, rows, channels;
  };
  // All on 2 threads.
  const Case cases[] = {
      // Two row blocks of 14 rows of 28 would both write the line at their edge (14 * 28 floats
      // is not a whole number of lines): a depthwise or 1x1 layer splits its channels instead,
      // which redoes nothing.
      {"depthwise 28x28", square_conv(192, 28, 3, true), 16, 1, 28, 96},
      {"1x1 28x28", square_conv(192, 28, 1, false), 16, 1, 28, 96},
      {"3x3 28x28: a channel block would redo its im2col", square_conv(192, 28, 3, false), 8, 1, 14,
       192},
      {"28 rows of 56 start on a line", square_conv(144, 56, 3, true), 16, 1, 28, 144},
      {"more channels than pixels", square_conv(256, 14, 3, false), 8, 1, 14, 128},
      {"an image per thread", square_conv(192, 28, 3, true), 16, 16, 28, 192},
      {"one granule of channels", square_conv(16, 28, 3, true), 16, 1, 14, 16},
  };
  for (const Case& c : cases) {
    const auto tasks = runtime::layerwise::dense_conv_tasks(c.geometry, c.granule, c.batch, 2);
    EXPECT_EQ(tasks.rows, c.rows) << c.why;
    EXPECT_EQ(tasks.channels, c.channels) << c.why;
  }
}

// Stacked images (7x7 and smaller planes): a sparse layer's tasks split the images before the
// channels, down to stacks of about 96 pixels; a dense one keeps the stack whole and splits the
// channels where the batch has too few stacks for the threads.
TEST(Layerwise, StackedSparseLayersSplitImagesBeforeChannels) {
  struct Case {
    const char* why;
    kernels::ConvGeometry geometry;
    int64_t batch;
    int threads;
    bool sparse;
    int64_t images, channels;
  };
  kernels::ConvGeometry wide = square_conv(2048, 7, 1, false);
  wide.out_c = 512;
  const Case cases[] = {
      {"sparse, 16 threads: 8 stacks of 2 images x 2 channel blocks", wide, 16, 16, true, 2, 256},
      {"dense, 16 threads: one stack x 16 channel blocks", wide, 16, 16, false, 16, 32},
      {"sparse, 2 threads: a stack of 8 images each", wide, 16, 2, true, 8, 512},
      {"sparse, a batch of 64: 4 images per stack, as dense", wide, 64, 16, true, 4, 512},
      {"dense, a batch of 64", wide, 64, 16, false, 4, 512},
      {"4x4 planes: 96 pixels need 6 images, the batch has 3", square_conv(64, 4, 1, false), 3, 3,
       true, 3, 32},
  };
  for (const Case& c : cases) {
    const auto tasks =
        runtime::layerwise::stacked_conv_tasks(c.geometry, 16, c.batch, c.threads, c.sparse);
    EXPECT_EQ(tasks.images, c.images) << c.why;
    EXPECT_EQ(tasks.channels, c.channels) << c.why;
  }
}

// The depthwise and 1x1 layers above, split by channels at batch 1 on 2 and 3 threads, give the
// reference's result and the same bits as one thread.
TEST(Layerwise, ChannelSplitDepthwiseAndPointwiseLayersMatchReference) {
  GraphBuilder b;
  const int x = b.input("x", {1, 48, 28, 28});
  const int dw = b.node("Conv", {x, b.constant("w1", random_tensor({48, 1, 3, 3}, 44))},
                        {{"pads", kPad1}, {"group", int64_t{48}}});
  const int pw =
      b.node("Conv", {b.node("Relu", {dw}), b.constant("w2", random_tensor({64, 48, 1, 1}, 45)),
                      b.constant("b2", random_tensor({64}, 46))});
  expect_matches_reference(b.finish({pw}), {{"x", random_tensor({1, 48, 28, 28}, 43)}});
}

// A linear layer whose 128 rows make one task, so that 2 and 3 threads split its columns, with
// a depth of several blocks of K (the tasks then sum into buffers of their own, GemmStep) and a
// bias and residual fused.
TEST(Layerwise, LinearLayerSplitByColumnsOverSeveralKBlocksMatchesReference) {
  constexpr int64_t kDepth = 700, kOut = 320;
  GraphBuilder b;
  const int x = b.input("x", {128, kDepth});
  const int r = b.input("r", {128, kOut});
  const int y = b.node("MatMul", {x, b.constant("w", random_tensor({kDepth, kOut}, 47))});
  const int out =
      b.node("Add", {b.node("Add", {y, b.constant("bias", random_tensor({kOut}, 48))}), r});
  expect_matches_reference(b.finish({out}), {{"x", random_tensor({128, kDepth}, 49)},
                                             {"r", random_tensor({128, kOut}, 50)}});
}

TEST(Layerwise, RejectsZeroThreads) {
  GraphBuilder b;
  const int x = b.input("x", {2});
  graph::Graph g = b.finish({b.node("Relu", {x})});
  EXPECT_THROW(layerwise(g, {{"x", random_tensor({2}, 1)}}, 0), Error);
}

}  // namespace
}  // namespace sparsecol::testing
