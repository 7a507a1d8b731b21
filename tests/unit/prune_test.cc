// sparsecol::prune_model (include/sparsecol/prune.h): exact sparsity per layer and globally,
// smallest magnitudes first, layers kept dense (first convolution, depthwise, excluded, small),
// errors, and a result that passes ONNX's checker and runs in the engine.
#include "sparsecol/prune.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <onnx/checker.h>

#include "../test_util.h"
#include "onnx/onnx_importer.h"
#include "onnx/tensor_proto.h"
#include "sparsecol/sparsecol.h"
#include "test_models.h"

namespace sparsecol {
namespace {

using test::expect_error;
using testing::TempDir;

// name -> {node name, shape}: the weights of prune_model_under_test(), in graph order.
struct WeightSpec {
  const char* weight;
  const char* node;
  std::vector<int64_t> shape;
};
const std::vector<WeightSpec> kWeights = {
    {"stem.w", "stem", {8, 3, 3, 3}},  // the first convolution
    {"dw.w", "dw", {8, 1, 3, 3}},      // depthwise (group 8)
    {"pw.w", "pw", {16, 8, 1, 1}},     // 128 weights
    {"fc.w", "fc", {10, 16}},          // Gemm, transB
    {"proj.w", "proj", {10, 7}},       // MatMul, stored in float_data (not raw_data)
};

std::vector<float> random_values(int64_t n, uint32_t seed, float scale = 1.0F) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0F, scale);
  std::vector<float> values(static_cast<std::size_t>(n));
  for (float& v : values) v = dist(rng);
  return values;
}

// x[N, 3, 8, 8] -> Conv stem -> Relu -> Conv dw (depthwise) -> Conv pw -> GlobalAveragePool ->
// Flatten -> Gemm fc -> MatMul proj -> y[N, 7]. Weights N(0, 1) (distinct, so no ties) unless
// `values` gives some.
onnx::ModelProto make_model_under_test(
    const std::map<std::string, std::vector<float>>& values = {}) {
  onnx::ModelProto model = testing::make_model();
  testing::add_input(model, "x", {"N", 3, 8, 8});
  uint32_t seed = 1;
  for (const WeightSpec& w : kWeights) {
    auto it = values.find(w.weight);
    const std::vector<float> data =
        it != values.end() ? it->second : random_values(checked_numel(w.shape), seed++);
    testing::add_initializer(model,
                             testing::make_float_tensor(w.weight, w.shape, data,
                                                        /*raw=*/w.weight != std::string("proj.w")));
  }
  testing::add_initializer(model, testing::make_float_tensor("fc.b", {10}, random_values(10, 99)));
  auto& stem = testing::add_node(model, "Conv", {"x", "stem.w"}, {"s"}, "stem");
  testing::set_attr(stem, "pads", std::vector<int64_t>{1, 1, 1, 1});
  testing::add_node(model, "Relu", {"s"}, {"r"}, "relu");
  auto& dw = testing::add_node(model, "Conv", {"r", "dw.w"}, {"d"}, "dw");
  testing::set_attr(dw, "group", int64_t{8});
  testing::set_attr(dw, "pads", std::vector<int64_t>{1, 1, 1, 1});
  testing::add_node(model, "Conv", {"d", "pw.w"}, {"p"}, "pw");
  testing::add_node(model, "GlobalAveragePool", {"p"}, {"g"}, "pool");
  testing::add_node(model, "Flatten", {"g"}, {"f"}, "flatten");
  auto& fc = testing::add_node(model, "Gemm", {"f", "fc.w", "fc.b"}, {"h"}, "fc");
  testing::set_attr(fc, "transB", int64_t{1});
  testing::add_node(model, "MatMul", {"h", "proj.w"}, {"y"}, "proj");
  testing::add_output(model, "y", {"N", 7});
  return model;
}

// The float initializers of a model file, read back through the importer's own decoder.
std::map<std::string, std::vector<float>> read_weights(const std::string& path) {
  onnx::ModelProto model;
  const std::string bytes = onnx_import::read_whole_file(path, "model");
  EXPECT_TRUE(model.ParseFromString(bytes)) << path;
  std::map<std::string, std::vector<float>> weights;
  for (const onnx::TensorProto& proto : model.graph().initializer()) {
    const Tensor t = onnx_import::tensor_from_proto(proto, "", proto.name());
    weights[proto.name()].assign(t.data<float>(), t.data<float>() + t.numel());
  }
  return weights;
}

int64_t zeros(const std::vector<float>& values) {
  return std::count(values.begin(), values.end(), 0.0F);
}

// Every zeroed weight had a magnitude no larger than every kept one.
::testing::AssertionResult smallest_zeroed(const std::vector<const std::vector<float>*>& before,
                                           const std::vector<const std::vector<float>*>& after) {
  float max_zeroed = 0.0F, min_kept = INFINITY;
  for (std::size_t t = 0; t < before.size(); ++t) {
    for (std::size_t i = 0; i < before[t]->size(); ++i) {
      const float m = std::fabs((*before[t])[i]);
      if ((*after[t])[i] == 0.0F) {
        max_zeroed = std::max(max_zeroed, m);
      } else {
        if ((*after[t])[i] != (*before[t])[i]) {
          return ::testing::AssertionFailure() << "a kept weight changed value";
        }
        min_kept = std::min(min_kept, m);
      }
    }
  }
  if (max_zeroed <= min_kept) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "zeroed a weight of magnitude " << max_zeroed << " but kept one of " << min_kept;
}

const PrunedLayer& layer(const PruneReport& report, const std::string& node) {
  for (const PrunedLayer& l : report.layers) {
    if (l.node == node) return l;
  }
  throw Error(ErrorCode::kInternal, "no layer " + node);
}

class PruneTest : public ::testing::Test {
 protected:
  PruneReport prune(const PruneOptions& options,
                    const std::map<std::string, std::vector<float>>& values = {}) {
    input_ = dir_.write("model.onnx", testing::serialize(make_model_under_test(values)));
    output_ = dir_.file("pruned.onnx");
    return prune_model(input_, output_, options);
  }
  TempDir dir_;
  std::string input_, output_;
};

TEST_F(PruneTest, PerLayerSparsityIsExactAndTakesTheSmallestMagnitudes) {
  for (double sparsity : {0.0, 0.5, 0.8, 0.9, 0.95, 0.99}) {
    SCOPED_TRACE(sparsity);
    PruneOptions options;
    options.sparsity = sparsity;
    const PruneReport report = prune(options);
    const auto before = read_weights(input_), after = read_weights(output_);
    for (const char* name : {"pw.w", "fc.w", "proj.w"}) {
      SCOPED_TRACE(name);
      const std::vector<float>& w = after.at(name);
      const auto n = static_cast<int64_t>(w.size());
      EXPECT_EQ(zeros(w), std::llround(sparsity * static_cast<double>(n)));
      EXPECT_TRUE(smallest_zeroed({&before.at(name)}, {&w}));
    }
    EXPECT_EQ(layer(report, "pw").sparsity_after,
              static_cast<double>(zeros(after.at("pw.w"))) / 128);
    EXPECT_EQ(layer(report, "pw").skipped, "");
    // Biases are not weights: untouched.
    EXPECT_EQ(after.at("fc.b"), before.at("fc.b"));
  }
}

TEST_F(PruneTest, FirstConvolutionAndDepthwiseStayDenseByDefault) {
  PruneOptions options;
  options.sparsity = 0.9;
  const PruneReport report = prune(options);
  const auto before = read_weights(input_), after = read_weights(output_);
  EXPECT_EQ(after.at("stem.w"), before.at("stem.w"));
  EXPECT_EQ(after.at("dw.w"), before.at("dw.w"));
  EXPECT_EQ(layer(report, "stem").skipped, "first convolution");
  EXPECT_EQ(layer(report, "dw").skipped, "depthwise");
  EXPECT_EQ(layer(report, "stem").sparsity_after, 0.0);

  options.prune_first_conv = true;
  options.prune_depthwise = true;
  prune(options);
  const auto pruned = read_weights(output_);
  EXPECT_EQ(zeros(pruned.at("stem.w")), std::llround(0.9 * 216));
  EXPECT_EQ(zeros(pruned.at("dw.w")), std::llround(0.9 * 72));
}

TEST_F(PruneTest, GlobalUsesOneThresholdAndIsExactOverAllLayers) {
  // fc's weights are 100x smaller than the others: one global threshold zeroes all of them first.
  PruneOptions options;
  options.sparsity = 0.5;
  options.global = true;
  const PruneReport report = prune(options, {{"fc.w", random_values(160, 7, 0.01F)}});
  const auto before = read_weights(input_), after = read_weights(output_);
  int64_t total = 0, zeroed = 0;
  std::vector<const std::vector<float>*> b, a;
  for (const char* name : {"pw.w", "fc.w", "proj.w"}) {
    total += static_cast<int64_t>(after.at(name).size());
    zeroed += zeros(after.at(name));
    b.push_back(&before.at(name));
    a.push_back(&after.at(name));
  }
  EXPECT_EQ(zeroed, std::llround(0.5 * static_cast<double>(total)));
  EXPECT_TRUE(smallest_zeroed(b, a));
  EXPECT_EQ(zeros(after.at("fc.w")), 160);
  EXPECT_LT(layer(report, "pw").sparsity_after, 0.5);
  EXPECT_EQ(report.zeros_after, zeroed);  // the dense layers (stem, dw) hold no zeros
}

TEST_F(PruneTest, TiesAtTheThresholdStillGiveTheExactCount) {
  PruneOptions options;
  options.sparsity = 0.5;
  prune(options, {{"pw.w", std::vector<float>(128, 0.25F)}});
  EXPECT_EQ(zeros(read_weights(output_).at("pw.w")), 64);
}

TEST_F(PruneTest, ExistingZerosCountAndSparserTensorsAreKept) {
  std::vector<float> w = random_values(128, 3);
  std::fill(w.begin(), w.begin() + 120, 0.0F);  // 93.75% zero already
  PruneOptions options;
  options.sparsity = 0.5;
  const PruneReport report = prune(options, {{"pw.w", w}});
  EXPECT_EQ(read_weights(output_).at("pw.w"), w);
  EXPECT_DOUBLE_EQ(layer(report, "pw").sparsity_before, 120.0 / 128);
  EXPECT_DOUBLE_EQ(layer(report, "pw").sparsity_after, 120.0 / 128);
}

TEST_F(PruneTest, ExcludeByNodeOrWeightNameAndMinimumSize) {
  PruneOptions options;
  options.sparsity = 0.9;
  options.exclude = {"fc", "proj.w"};
  const PruneReport report = prune(options);
  const auto before = read_weights(input_), after = read_weights(output_);
  EXPECT_EQ(after.at("fc.w"), before.at("fc.w"));
  EXPECT_EQ(after.at("proj.w"), before.at("proj.w"));
  EXPECT_EQ(layer(report, "fc").skipped, "excluded");
  EXPECT_EQ(layer(report, "proj").skipped, "excluded");
  EXPECT_EQ(zeros(after.at("pw.w")), std::llround(0.9 * 128));

  options.exclude.clear();
  options.min_weight_elements = 100;  // pw (128) and fc (160) are pruned, proj (70) is not
  const PruneReport small = prune(options);
  EXPECT_EQ(layer(small, "proj").skipped, "fewer than 100 weights");
  EXPECT_EQ(layer(small, "fc").skipped, "");
}

TEST_F(PruneTest, ReportListsEveryLayerInGraphOrder) {
  PruneOptions options;
  const PruneReport report = prune(options);
  ASSERT_EQ(report.layers.size(), kWeights.size());
  for (std::size_t i = 0; i < kWeights.size(); ++i) {
    EXPECT_EQ(report.layers[i].node, kWeights[i].node);
    EXPECT_EQ(report.layers[i].weight, kWeights[i].weight);
    EXPECT_EQ(report.layers[i].shape, kWeights[i].shape);
    EXPECT_EQ(report.layers[i].elements, checked_numel(kWeights[i].shape));
  }
  EXPECT_EQ(report.layers[3].op, "Gemm");
  EXPECT_EQ(report.layers[4].op, "MatMul");
  EXPECT_EQ(report.elements, 216 + 72 + 128 + 160 + 70);
}

// "The pruned model still loads in any ONNX tool": ONNX's own checker on the file, the engine's
// importer, and a run whose result matches the same model with the zeros put in by hand.
TEST_F(PruneTest, PrunedFilePassesTheCheckerAndRunsInTheEngine) {
  PruneOptions options;
  options.sparsity = 0.9;
  prune(options);
  EXPECT_NO_THROW(onnx::checker::check_model(output_));
  EXPECT_NO_THROW(onnx_import::import_model_file(output_));

  const std::map<std::string, std::vector<float>> after = read_weights(output_);
  const std::string by_hand =
      dir_.write("by_hand.onnx", testing::serialize(make_model_under_test(after)));
  const Tensor x = test::random_normal_tensor({2, 3, 8, 8}, 5);
  const auto run = [&](const std::string& path) {
    return Engine::load(path).session().run({{"x", x}}).at("y");
  };
  EXPECT_TRUE(test::tensors_near(run(output_), run(by_hand), 0, 0));
}

// ConvTranspose weights are pruned as Conv's are, and the first convolution of either kind (a
// generator's, fed the latent vector) stays dense by default. The engine then runs the pruned
// transposed convolution on the sparse kernel, with the results of the same zeros put in by hand
// and run dense.
TEST_F(PruneTest, ConvTransposeWeightsArePrunedAndTheFirstStaysDense) {
  auto generator = [](const std::map<std::string, std::vector<float>>& values) {
    onnx::ModelProto model = testing::make_model();
    testing::add_input(model, "x", {"N", 4, 5, 5});
    for (const auto& [name, shape] :
         {std::pair<std::string, std::vector<int64_t>>{"up1.w", {4, 16, 3, 3}},
          {"up2.w", {16, 2, 2, 2}}}) {
      auto it = values.find(name);
      testing::add_initializer(
          model, testing::make_float_tensor(
                     name, shape,
                     it != values.end() ? it->second
                                        : random_values(checked_numel(shape), name == "up1.w")));
    }
    testing::add_node(model, "ConvTranspose", {"x", "up1.w"}, {"u"}, "up1");  // 5x5 -> 7x7
    auto& up2 = testing::add_node(model, "ConvTranspose", {"u", "up2.w"}, {"y"}, "up2");
    testing::set_attr(up2, "strides", std::vector<int64_t>{2, 2});  // 7x7 -> 14x14
    testing::add_output(model, "y", {"N", 2, 14, 14});
    return model;
  };
  input_ = dir_.write("generator.onnx", testing::serialize(generator({})));
  output_ = dir_.file("pruned.onnx");
  PruneOptions options;
  options.sparsity = 0.75;
  const PruneReport report = prune_model(input_, output_, options);
  ASSERT_EQ(report.layers.size(), 2u);
  EXPECT_EQ(layer(report, "up1").op, "ConvTranspose");
  EXPECT_EQ(layer(report, "up1").skipped, "first convolution");
  EXPECT_EQ(layer(report, "up2").skipped, "");
  const std::map<std::string, std::vector<float>> after = read_weights(output_);
  EXPECT_EQ(zeros(after.at("up1.w")), 0);
  EXPECT_EQ(zeros(after.at("up2.w")), 96);  // 75% of 128
  EXPECT_NO_THROW(onnx::checker::check_model(output_));

  const Tensor x = test::random_normal_tensor({2, 4, 5, 5}, 9);
  Options sparse, dense;
  sparse.schedule = dense.schedule = Schedule::kLayerWise;
  dense.sparse_threshold = 2.0;  // never sparse
  const Engine pruned = Engine::load(output_, sparse);
  bool ran_sparse = false;
  for (const LayerInfo& info : pruned.layers()) {
    ran_sparse = ran_sparse || (info.node == "up2" && info.weight_format == "sparse-csr");
  }
  EXPECT_TRUE(ran_sparse) << "up2 did not run on the sparse kernel";
  const std::string by_hand = dir_.write("by_hand.onnx", testing::serialize(generator(after)));
  EXPECT_TRUE(test::tensors_near(pruned.session().run({{"x", x}}).at("y"),
                                 Engine::load(by_hand, dense).session().run({{"x", x}}).at("y"),
                                 1e-5, 1e-5));
}

TEST_F(PruneTest, OutputMayReplaceTheInput) {
  input_ = dir_.write("model.onnx", testing::serialize(make_model_under_test()));
  PruneOptions options;
  options.sparsity = 0.5;
  prune_model(input_, input_, options);
  EXPECT_EQ(zeros(read_weights(input_).at("pw.w")), 64);
  // Nothing but the model is left in the folder (no temporary file).
  int files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir_.path())) {
    (void)entry;
    ++files;
  }
  EXPECT_EQ(files, 1);
}

TEST_F(PruneTest, Errors) {
  PruneOptions options;
  const std::string missing = dir_.file("absent.onnx");
  expect_error([&] { prune_model(missing, dir_.file("o.onnx"), options); }, ErrorCode::kNotFound,
               {missing});
  for (double bad : {-0.1, 1.0, 1.5, static_cast<double>(NAN)}) {
    options.sparsity = bad;
    expect_error([&] { prune(options); }, ErrorCode::kInvalidArgument, {"sparsity", "[0, 1)"});
  }
  options.sparsity = 0.9;
  options.exclude = {"fc", "no_such_layer"};
  expect_error([&] { prune(options); }, ErrorCode::kInvalidArgument, {"no_such_layer"});
  options.exclude = {"stem", "dw", "pw", "fc", "proj"};
  expect_error([&] { prune(options); }, ErrorCode::kInvalidArgument, {"nothing to prune"});
  options.exclude.clear();

  const std::string not_a_model = dir_.write("text.onnx", "this is not protobuf");
  expect_error([&] { prune_model(not_a_model, dir_.file("o.onnx"), options); },
               ErrorCode::kInvalidModel, {not_a_model});

  onnx::ModelProto relu_only = testing::make_model();
  testing::add_input(relu_only, "x", {2});
  testing::add_node(relu_only, "Relu", {"x"}, {"y"}, "relu");
  testing::add_output(relu_only, "y", {2});
  const std::string relu = dir_.write("relu.onnx", testing::serialize(relu_only));
  expect_error([&] { prune_model(relu, dir_.file("o.onnx"), options); },
               ErrorCode::kInvalidArgument, {"nothing to prune", relu});

  onnx::ModelProto external = make_model_under_test();
  testing::set_external_data(*external.mutable_graph()->mutable_initializer(2), "weights.bin");
  const std::string ext = dir_.write("external.onnx", testing::serialize(external));
  expect_error([&] { prune_model(ext, dir_.file("o.onnx"), options); }, ErrorCode::kUnsupported,
               {"pw.w", "external data"});

  input_ = dir_.write("model.onnx", testing::serialize(make_model_under_test()));
  const std::string unwritable = dir_.file("no_such_folder/pruned.onnx");
  expect_error([&] { prune_model(input_, unwritable, options); }, ErrorCode::kNotFound,
               {unwritable});
  EXPECT_FALSE(std::filesystem::exists(unwritable));
}

}  // namespace
}  // namespace sparsecol
