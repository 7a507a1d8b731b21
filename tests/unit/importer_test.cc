// The ONNX importer: good models come through with their values, shapes, attributes and
// initializers; bad files of every kind are refused with an Error whose code and message say
// what is wrong and where.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <iterator>
#include <random>
#include <string>

#include "../test_util.h"
#include "graph/graph.h"
#include "onnx/onnx_importer.h"
#include "test_models.h"

namespace sparsecol {
namespace {

namespace fs = std::filesystem;
using test::expect_error;
using testing::add_initializer;
using testing::add_input;
using testing::add_node;
using testing::add_output;
using testing::make_float_tensor;
using testing::make_mlp_model;
using testing::make_model;
using testing::serialize;
using testing::TempDir;

const char kAbsInput[] =
    "/usr/share/libonnx-testdata/data/node/test_abs/test_data_set_0/input_0.pb";

graph::Graph import_model(const onnx::ModelProto& model, const TempDir& dir,
                          const std::string& name = "model.onnx") {
  return onnx_import::import_model_file(dir.write(name, serialize(model)));
}

const graph::Value& value(const graph::Graph& g, const std::string& name) {
  const int id = g.find_value(name);
  if (id < 0) throw std::runtime_error("no value " + name);
  return g.values[static_cast<std::size_t>(id)];
}

const graph::Node& node(const graph::Graph& g, const std::string& name) {
  for (const graph::Node& n : g.nodes) {
    if (n.name == name) return n;
  }
  throw std::runtime_error("no node " + name);
}

std::vector<float> floats(const Tensor& t) {
  return std::vector<float>(t.data<float>(), t.data<float>() + t.numel());
}

// ---- files that are not ONNX models ----

TEST(ImporterFiles, MissingFileIsNotFound) {
  TempDir dir;
  const std::string path = dir.file("absent.onnx");
  expect_error([&] { onnx_import::import_model_file(path); }, ErrorCode::kNotFound, {path});
}

TEST(ImporterFiles, DirectoryIsIoError) {
  TempDir dir;
  expect_error([&] { onnx_import::import_model_file(dir.path().string()); }, ErrorCode::kIoError,
               {dir.path().string()});
}

// Protobuf cannot parse 2 GiB or more: refused from the file size, without reading (the sparse
// file takes no disk space).
TEST(ImporterFiles, ModelOver2GiBIsUnsupported) {
  TempDir dir;
  const std::string path = dir.write("huge.onnx", "");
  fs::resize_file(path, (uintmax_t{1} << 31) + 16);
  expect_error([&] { onnx_import::import_model_file(path); }, ErrorCode::kUnsupported,
               {path, "2 GiB", "external data"});
}

TEST(ImporterFiles, TruncatedFilesAreInvalidModel) {
  TempDir dir;
  const std::string bytes = serialize(make_mlp_model());
  ASSERT_GT(bytes.size(), 100u);
  for (std::size_t size : {std::size_t{0}, std::size_t{1}, std::size_t{7}, bytes.size() / 3,
                           bytes.size() / 2, bytes.size() - 1}) {
    SCOPED_TRACE("truncated to " + std::to_string(size) + " bytes");
    const std::string path = dir.write("truncated.onnx", bytes.substr(0, size));
    expect_error([&] { onnx_import::import_model_file(path); }, ErrorCode::kInvalidModel, {path});
  }
}

TEST(ImporterFiles, EveryTruncationIsRefusedCleanly) {
  const std::string bytes = serialize(make_mlp_model());
  for (std::size_t size = 0; size < bytes.size(); ++size) {
    SCOPED_TRACE("truncated to " + std::to_string(size) + " bytes");
    expect_error([&] { onnx_import::import_model_bytes(bytes.data(), size, "cut.onnx", ""); },
                 ErrorCode::kInvalidModel, {"cut.onnx"});
  }
}

TEST(ImporterFiles, GarbageBytesAreInvalidModel) {
  TempDir dir;
  std::string garbage = "this is not an ONNX model\n";
  std::mt19937 rng(7);
  for (int i = 0; i < 256; ++i) garbage.push_back(static_cast<char>(rng() & 0xff));
  const std::string path = dir.write("garbage.onnx", garbage);
  expect_error([&] { onnx_import::import_model_file(path); }, ErrorCode::kInvalidModel,
               {path, "not a valid ONNX model"});
}

// Random byte flips must never crash the importer nor escape as anything but sparsecol::Error
// (the file may still happen to import).
TEST(ImporterFiles, CorruptedBytesNeverCrash) {
  const std::string good = serialize(make_mlp_model());
  std::mt19937 rng(1234);
  for (int trial = 0; trial < 300; ++trial) {
    std::string bytes = good;
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int f = 0; f < flips; ++f) bytes[rng() % bytes.size()] = static_cast<char>(rng() & 0xff);
    try {
      onnx_import::import_model_bytes(bytes.data(), bytes.size(), "flipped.onnx", "");
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("flipped.onnx"), std::string::npos) << e.what();
    }
  }
}

// ---- what the model asks for that sparsecol does not do ----

TEST(ImporterSupport, UnsupportedOpNamesNodeAndOp) {
  TempDir dir;
  onnx::ModelProto model = make_model();
  add_input(model, "boxes", {int64_t{1}, int64_t{4}, int64_t{4}});
  add_input(model, "scores", {int64_t{1}, int64_t{1}, int64_t{4}});
  add_node(model, "NonMaxSuppression", {"boxes", "scores"}, {"selected"}, "nms");
  add_output(model, "selected", {"n", int64_t{3}}, onnx::TensorProto::INT64);
  expect_error([&] { import_model(model, dir); }, ErrorCode::kUnsupported,
               {"node 'nms'", "(NonMaxSuppression)", "model.onnx", "supported:", "Relu"});
}

TEST(ImporterSupport, UnnamedNodeIsNamedByOpAndIndex) {
  onnx::ModelProto model = make_model();
  add_input(model, "x", {int64_t{2}});
  add_node(model, "Relu", {"x"}, {"r"});
  add_node(model, "NonMaxSuppression", {"r", "r"}, {"y"});
  add_output(model, "y", {int64_t{1}, int64_t{3}}, onnx::TensorProto::INT64);
  const std::string bytes = serialize(model);
  expect_error([&] { onnx_import::import_model_bytes(bytes.data(), bytes.size(), "mem.onnx", ""); },
               ErrorCode::kUnsupported, {"node 'NonMaxSuppression_1'"});
}

TEST(ImporterSupport, OpsetOutsideRangeIsUnsupported) {
  TempDir dir;
  for (int64_t opset : {5, 18, 99}) {  // Relu changed at opset 6
    SCOPED_TRACE("opset " + std::to_string(opset));
    onnx::ModelProto model = make_model(opset);
    add_input(model, "x", {int64_t{2}});
    add_node(model, "Relu", {"x"}, {"y"}, "relu");
    add_output(model, "y", {int64_t{2}});
    expect_error([&] { import_model(model, dir); }, ErrorCode::kUnsupported,
                 {"opset " + std::to_string(opset), "model.onnx"});
  }
}

TEST(ImporterSupport, OlderOpsetIsReadAsOpset11WhenNoOpChangedSince) {
  TempDir dir;
  onnx::ModelProto model = make_model(10);
  add_input(model, "x", {int64_t{2}});
  add_node(model, "Relu", {"x"}, {"y"}, "relu");  // Relu-6 is still Relu at opset 11
  add_output(model, "y", {int64_t{2}});
  EXPECT_EQ(import_model(model, dir).opset, onnx_import::kMinOpset);
}

TEST(ImporterSupport, OlderOpsetIsRefusedNamingAnOpThatChangedSince) {
  TempDir dir;
  onnx::ModelProto model = make_model(10);
  add_input(model, "x", {int64_t{4}});
  add_node(model, "Relu", {"x"}, {"r"}, "relu");
  add_node(model, "Clip", {"r"}, {"y"}, "clip");  // Clip's bounds became inputs at opset 11
  add_output(model, "y", {int64_t{4}});
  expect_error([&] { import_model(model, dir); }, ErrorCode::kUnsupported,
               {"opset 10", "Clip", "'clip'"});
}

TEST(ImporterSupport, OpsetsAtRangeEndsAreAccepted) {
  TempDir dir;
  for (int64_t opset : {onnx_import::kMinOpset, onnx_import::kMaxOpset}) {
    onnx::ModelProto model = make_model(opset);
    add_input(model, "x", {int64_t{2}});
    add_node(model, "Relu", {"x"}, {"y"}, "relu");
    add_output(model, "y", {int64_t{2}});
    EXPECT_EQ(import_model(model, dir).opset, opset);
  }
}

TEST(ImporterSupport, NodeInCustomDomainIsUnsupported) {
  TempDir dir;
  onnx::ModelProto model = make_model();
  onnx::OperatorSetIdProto* custom = model.add_opset_import();
  custom->set_domain("com.example");
  custom->set_version(1);
  add_input(model, "x", {int64_t{2}});
  add_node(model, "Relu", {"x"}, {"y"}, "custom_relu").set_domain("com.example");
  add_output(model, "y", {int64_t{2}});
  expect_error([&] { import_model(model, dir); }, ErrorCode::kUnsupported,
               {"node 'custom_relu'", "(Relu)", "'com.example'"});
}

TEST(ImporterSupport, SubgraphAttributeIsUnsupported) {
  TempDir dir;
  onnx::ModelProto model = make_model();
  add_input(model, "x", {int64_t{2}});
  onnx::NodeProto& relu = add_node(model, "Relu", {"x"}, {"y"}, "relu");
  onnx::AttributeProto* body = relu.add_attribute();
  body->set_name("body");
  body->set_type(onnx::AttributeProto::GRAPH);
  body->mutable_g()->set_name("sub");
  add_output(model, "y", {int64_t{2}});
  expect_error([&] { import_model(model, dir); }, ErrorCode::kUnsupported,
               {"node 'relu'", "'body'", "subgraph"});
}

TEST(ImporterSupport, Float16InitializerIsUnsupported) {
  TempDir dir;
  onnx::ModelProto model = make_mlp_model();
  onnx::TensorProto half;
  half.set_name("half_weights");
  half.set_data_type(onnx::TensorProto::FLOAT16);
  half.add_dims(2);
  half.set_raw_data(std::string(4, '\0'));
  add_initializer(model, half);
  expect_error([&] { import_model(model, dir); }, ErrorCode::kUnsupported,
               {"half_weights", "FLOAT16"});
}

TEST(ImporterSupport, Float16InputIsUnsupported) {
  TempDir dir;
  onnx::ModelProto model = make_model();
  add_input(model, "x", {int64_t{2}}, onnx::TensorProto::FLOAT16);
  add_node(model, "Relu", {"x"}, {"y"}, "relu");
  add_output(model, "y", {int64_t{2}}, onnx::TensorProto::FLOAT16);
  expect_error([&] { import_model(model, dir); }, ErrorCode::kUnsupported, {"'x'", "FLOAT16"});
}

// ---- broken tensors ----

TEST(ImporterTensors, RawDataLengthMismatchIsInvalidModel) {
  TempDir dir;
  onnx::ModelProto model = make_mlp_model();
  model.mutable_graph()->mutable_initializer(0)->mutable_raw_data()->resize(44);  // W: 48 bytes
  expect_error([&] { import_model(model, dir); }, ErrorCode::kInvalidModel,
               {"initializer 'W'", "raw_data", "44", "48"});
}

TEST(ImporterTensors, TypedFieldCountMismatchIsInvalidModel) {
  TempDir dir;
  onnx::ModelProto model = make_mlp_model();
  model.mutable_graph()->mutable_initializer(1)->add_float_data(2.0f);  // b: 3 values
  expect_error([&] { import_model(model, dir); }, ErrorCode::kInvalidModel,
               {"initializer 'b'", "float_data", "4 values"});
}

TEST(ImporterTensors, NegativeDimIsInvalidModel) {
  TempDir dir;
  onnx::ModelProto model = make_mlp_model();
  model.mutable_graph()->mutable_initializer(0)->set_dims(0, -4);
  expect_error([&] { import_model(model, dir); }, ErrorCode::kInvalidModel,
               {"initializer 'W'", "negative"});
}

// 2^62 floats would be 16 EiB: refused from the dims alone, before any allocation is tried.
TEST(ImporterTensors, HugeDimsAreRefusedBeforeAllocating) {
  TempDir dir;
  for (const std::vector<int64_t>& dims : {std::vector<int64_t>{int64_t{1} << 31, int64_t{1} << 31},
                                           std::vector<int64_t>{int64_t{1} << 62},
                                           std::vector<int64_t>{int64_t{1} << 32, 1 << 30, 16}}) {
    for (bool raw : {true, false}) {
      onnx::ModelProto model = make_mlp_model();
      add_initializer(model, make_float_tensor("huge", dims, {1.0f}, raw));
      expect_error([&] { import_model(model, dir); }, ErrorCode::kInvalidModel, {"'huge'"});
    }
  }
}

TEST(ImporterTensors, IntegerOutOfRangeForInt8IsInvalidModel) {
  TempDir dir;
  onnx::ModelProto model = make_mlp_model();
  add_initializer(model,
                  testing::make_int32_data_tensor("q", onnx::TensorProto::INT8, {2}, {1, 300}));
  expect_error([&] { import_model(model, dir); }, ErrorCode::kInvalidModel,
               {"initializer 'q'", "300", "int8"});
}

TEST(ImporterTensors, EveryDtypeFromItsTypedField) {
  TempDir dir;
  onnx::ModelProto model = make_mlp_model();
  using onnx::TensorProto;
  add_initializer(model,
                  testing::make_int32_data_tensor("i8", TensorProto::INT8, {3}, {-128, 5, 127}));
  add_initializer(model, testing::make_int32_data_tensor("u8", TensorProto::UINT8, {2}, {255, 0}));
  add_initializer(model,
                  testing::make_int32_data_tensor("flags", TensorProto::BOOL, {3}, {0, 1, 1}));
  add_initializer(model,
                  testing::make_int32_data_tensor("i32", TensorProto::INT32, {2}, {-70000, 70000}));
  add_initializer(model, testing::make_int64_tensor("i64", {2}, {int64_t{1} << 40, -3},
                                                    /*raw=*/false));
  add_initializer(model, testing::make_int64_tensor("i64raw", {1}, {-5}, /*raw=*/true));
  TensorProto f64;
  f64.set_name("f64");
  f64.set_data_type(TensorProto::DOUBLE);
  f64.add_dims(2);
  f64.add_double_data(0.25);
  f64.add_double_data(-1e300);
  add_initializer(model, f64);
  TensorProto scalar = make_float_tensor("scalar", {}, {2.5f}, /*raw=*/false);
  add_initializer(model, scalar);

  const graph::Graph g = import_model(model, dir);
  const auto constant = [&](const std::string& name) -> const Tensor& {
    const graph::Value& v = value(g, name);
    EXPECT_TRUE(v.constant.has_value()) << name;
    return *v.constant;
  };
  EXPECT_EQ(std::vector<int8_t>(constant("i8").data<int8_t>(), constant("i8").data<int8_t>() + 3),
            (std::vector<int8_t>{-128, 5, 127}));
  EXPECT_EQ(constant("u8").data<uint8_t>()[0], 255);
  EXPECT_EQ(constant("flags").data<bool>()[0], false);
  EXPECT_EQ(constant("flags").data<bool>()[2], true);
  EXPECT_EQ(constant("i32").data<int32_t>()[0], -70000);
  EXPECT_EQ(constant("i64").data<int64_t>()[0], int64_t{1} << 40);
  EXPECT_EQ(constant("i64raw").data<int64_t>()[0], -5);
  EXPECT_EQ(constant("f64").data<double>()[1], -1e300);
  EXPECT_EQ(constant("scalar").rank(), 0);
  EXPECT_EQ(constant("scalar").data<float>()[0], 2.5f);
  EXPECT_EQ(value(g, "i8").dtype, DType::kInt8);
  EXPECT_TRUE(value(g, "i8").dtype_known);
}

TEST(ImporterTensors, BoolRawBytesAreNormalized) {
  TempDir dir;
  onnx::ModelProto model = make_mlp_model();
  onnx::TensorProto flags;
  flags.set_name("flags");
  flags.set_data_type(onnx::TensorProto::BOOL);
  flags.add_dims(3);
  flags.set_raw_data(std::string("\x00\x01\x07", 3));
  add_initializer(model, flags);
  const graph::Graph g = import_model(model, dir);
  const auto* bytes = static_cast<const unsigned char*>(value(g, "flags").constant->raw_data());
  EXPECT_EQ(bytes[0], 0);
  EXPECT_EQ(bytes[1], 1);
  EXPECT_EQ(bytes[2], 1);
}

// ---- external data ----

class ImporterExternalData : public ::testing::Test {
 protected:
  // The MLP with W (48 bytes) stored in `location` at `offset`.
  onnx::ModelProto model_with_external_w(const std::string& location, int64_t offset,
                                         int64_t length = 48) {
    onnx::ModelProto model = make_mlp_model();
    testing::set_external_data(*model.mutable_graph()->mutable_initializer(0), location, offset,
                               length);
    return model;
  }
  // 16 bytes of padding, then W = 1..12.
  std::string weights_file() {
    std::string bytes(16, 'p');
    for (int i = 1; i <= 12; ++i) {
      const float w = static_cast<float>(i);
      bytes.append(reinterpret_cast<const char*>(&w), sizeof(w));
    }
    return bytes;
  }
  TempDir dir_;
};

TEST_F(ImporterExternalData, LoadsFromSideFile) {
  dir_.write("data/weights.bin", weights_file());
  const graph::Graph g = import_model(model_with_external_w("data/weights.bin", 16), dir_);
  const graph::Value& w = value(g, "W");
  ASSERT_TRUE(w.constant.has_value());
  EXPECT_EQ(w.constant->shape(), (std::vector<int64_t>{4, 3}));
  EXPECT_EQ(floats(*w.constant), (std::vector<float>{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}));
}

TEST_F(ImporterExternalData, LengthDefaultsToRestOfFile) {
  dir_.write("weights.bin", weights_file());
  const graph::Graph g = import_model(model_with_external_w("weights.bin", 16, -1), dir_);
  EXPECT_EQ(value(g, "W").constant->data<float>()[11], 12.0f);
}

// ONNX shape inference cannot read external data, yet needs Reshape's shape: small external
// tensors are inlined for it.
TEST_F(ImporterExternalData, SmallExternalShapeTensorStillInfersShapes) {
  onnx::ModelProto model = make_model();
  add_input(model, "x", {"batch", int64_t{12}});
  onnx::TensorProto& shape =
      add_initializer(model, testing::make_int64_tensor("shape", {3}, {0, 3, 4}));
  dir_.write("shape.bin", shape.raw_data());
  testing::set_external_data(shape, "shape.bin");
  add_node(model, "Reshape", {"x", "shape"}, {"y"}, "reshape");
  add_output(model, "y", {std::string(), std::string(), std::string()});
  const graph::Graph g = import_model(model, dir_);
  const graph::Value& y = value(g, "y");
  ASSERT_TRUE(y.shape.has_value());
  EXPECT_EQ(graph::to_string(*y.shape), "[batch, 3, 4]");
}

// With data propagation ONNX reads every int64 vector an op like Concat consumes, however large.
TEST_F(ImporterExternalData, LargeExternalIndexVectorStillInfersShapes) {
  onnx::ModelProto model = make_model();
  add_input(model, "x", {int64_t{2}}, onnx::TensorProto::INT64);
  std::vector<int64_t> indices(10000);
  for (std::size_t i = 0; i < indices.size(); ++i) indices[i] = static_cast<int64_t>(i) * 3;
  onnx::TensorProto& table =
      add_initializer(model, testing::make_int64_tensor("table", {10000}, indices));
  dir_.write("table.bin", table.raw_data());
  testing::set_external_data(table, "table.bin");
  testing::set_attr(add_node(model, "Concat", {"table", "x"}, {"y"}, "concat"), "axis", int64_t{0});
  add_output(model, "y", {std::string()}, onnx::TensorProto::INT64);
  const graph::Graph g = import_model(model, dir_);
  EXPECT_EQ(value(g, "table").constant->data<int64_t>()[9999], 29997);
  EXPECT_EQ(graph::to_string(*value(g, "y").shape), "[10002]");
}

TEST_F(ImporterExternalData, MissingSideFileIsNotFound) {
  const std::string message = expect_error(
      [&] { import_model(model_with_external_w("weights.bin", 16), dir_); }, ErrorCode::kNotFound,
      {dir_.file("model.onnx"), "'W'", (dir_.path() / "weights.bin").string()});
}

TEST_F(ImporterExternalData, ParentDirectoryEscapeIsRefused) {
  dir_.write("weights.bin", weights_file());
  expect_error(
      [&] { import_model(model_with_external_w("../weights.bin", 16), dir_, "sub/model.onnx"); },
      ErrorCode::kInvalidModel, {"'W'", "'../weights.bin'", ".."});
}

TEST_F(ImporterExternalData, AbsolutePathIsRefused) {
  const std::string absolute = dir_.write("weights.bin", weights_file());
  expect_error([&] { import_model(model_with_external_w(absolute, 16), dir_); },
               ErrorCode::kInvalidModel, {"'W'", absolute, "absolute"});
}

TEST_F(ImporterExternalData, SymlinkOutOfModelFolderIsRefused) {
  const std::string outside = dir_.write("secret.bin", weights_file());
  fs::create_directories(dir_.path() / "model");
  fs::create_symlink(outside, dir_.path() / "model" / "weights.bin");
  expect_error(
      [&] { import_model(model_with_external_w("weights.bin", 16), dir_, "model/m.onnx"); },
      ErrorCode::kInvalidModel, {"'W'", "outside the model's folder"});
}

TEST_F(ImporterExternalData, OffsetBeyondFileIsInvalidModel) {
  dir_.write("weights.bin", weights_file());  // 64 bytes
  expect_error([&] { import_model(model_with_external_w("weights.bin", 1000), dir_); },
               ErrorCode::kInvalidModel, {"'W'", "offset 1000", "beyond the end", "64 bytes"});
  expect_error([&] { import_model(model_with_external_w("weights.bin", 20), dir_); },
               ErrorCode::kInvalidModel, {"'W'", "offset 20", "beyond the end"});
}

TEST_F(ImporterExternalData, LengthNotMatchingDimsIsInvalidModel) {
  dir_.write("weights.bin", weights_file());
  expect_error([&] { import_model(model_with_external_w("weights.bin", 16, 40), dir_); },
               ErrorCode::kInvalidModel, {"'W'", "40 bytes", "48"});
}

// 2^40 floats (4 TiB) claimed by the dims of a 64-byte side file: refused before allocating.
TEST_F(ImporterExternalData, HugeDimsAreRefusedBeforeAllocating) {
  dir_.write("weights.bin", weights_file());
  onnx::ModelProto model = model_with_external_w("weights.bin", 0, -1);
  onnx::TensorProto& w = *model.mutable_graph()->mutable_initializer(0);
  w.set_dims(0, int64_t{1} << 20);
  w.set_dims(1, int64_t{1} << 20);
  expect_error([&] { import_model(model, dir_); }, ErrorCode::kInvalidModel,
               {"'W'", "64 bytes", "4398046511104"});
}

TEST_F(ImporterExternalData, ModelFromMemoryWithoutFolderCannotUseExternalData) {
  const std::string bytes = serialize(model_with_external_w("weights.bin", 16));
  expect_error([&] { onnx_import::import_model_bytes(bytes.data(), bytes.size(), "mem.onnx", ""); },
               ErrorCode::kInvalidArgument, {"'W'", "mem.onnx"});
}

// ---- broken graphs ----

TEST(ImporterGraph, NodeReadingMissingValueIsInvalidModel) {
  TempDir dir;
  onnx::ModelProto model = make_mlp_model();
  model.mutable_graph()->mutable_node(2)->set_input(0, "ghost");
  expect_error([&] { import_model(model, dir); }, ErrorCode::kInvalidModel,
               {"node 'relu'", "'ghost'"});
}

TEST(ImporterGraph, NodesOutOfOrderAreInvalidModel) {
  TempDir dir;
  onnx::ModelProto model = make_mlp_model();
  model.mutable_graph()->mutable_node()->SwapElements(0, 1);  // Add before the MatMul it reads
  expect_error([&] { import_model(model, dir); }, ErrorCode::kInvalidModel, {"node 'add'", "'h'"});
}

TEST(ImporterGraph, UnproducedGraphOutputIsInvalidModel) {
  TempDir dir;
  onnx::ModelProto model = make_mlp_model();
  add_output(model, "nowhere", {int64_t{1}});
  expect_error([&] { import_model(model, dir); }, ErrorCode::kInvalidModel, {"'nowhere'"});
}

TEST(ImporterGraph, GraphOutputWithoutShapeIsInvalidModel) {
  TempDir dir;
  onnx::ModelProto model = make_mlp_model();
  model.mutable_graph()->mutable_output(0)->mutable_type()->mutable_tensor_type()->clear_shape();
  expect_error([&] { import_model(model, dir); }, ErrorCode::kInvalidModel,
               {"model.onnx", "graph output 'y'", "no shape"});
}

TEST(ImporterGraph, ShapeContradictionIsFoundByShapeInference) {
  TempDir dir;
  onnx::ModelProto model = make_mlp_model();
  // x[batch, 5] cannot be multiplied by W[4, 3].
  model.mutable_graph()
      ->mutable_input(0)
      ->mutable_type()
      ->mutable_tensor_type()
      ->mutable_shape()
      ->mutable_dim(1)
      ->set_dim_value(5);
  const std::string message =
      expect_error([&] { import_model(model, dir); }, ErrorCode::kInvalidModel,
                   {"node 'matmul' (MatMul)", "model.onnx", "Incompatible dimensions"});
  EXPECT_EQ(message.find('\n'), std::string::npos) << message;
}

// ONNX 1.12's own shape inference crashed on this (found by the importer fuzzer): the importer
// refuses it first, naming the node.
TEST(ImporterGraph, LayerNormAxisOutsideTheInputsRankIsInvalidModel) {
  TempDir dir;
  onnx::ModelProto model = make_mlp_model();
  model.mutable_opset_import(0)->set_version(17);  // LayerNormalization's first opset
  add_input(model, "scalar", {});
  add_node(model, "LayerNormalization", {"scalar", "scalar"}, {"ln"}, "ln");
  add_output(model, "ln", {});
  expect_error([&] { import_model(model, dir); }, ErrorCode::kInvalidModel,
               {"node 'ln' (LayerNormalization)", "axis -1", "rank 0"});
}

// Likewise (found by the importer fuzzer three times): a convolution without kernel_shape whose
// W has more or fewer dimensions than X. ONNX took the kernel from W and read past X's shape or
// past the kernel. Where both ranks are declared the importer refuses the node itself (where
// only W's is, see MalformedShapes.ConvolutionInputOfTooFewDimensionsIsInvalidModel).
TEST(ImporterGraph, ConvWeightOfOtherRankThanInputIsInvalidModel) {
  for (const char* op : {"Conv", "ConvTranspose"}) {
    for (const bool higher : {true, false}) {
      SCOPED_TRACE(std::string(op) + (higher ? " W of higher rank" : " W of lower rank"));
      TempDir dir;
      onnx::ModelProto model = make_mlp_model();
      if (higher) {
        add_input(model, "xc", {int64_t{1}, int64_t{1}, int64_t{7}});
        add_input(model, "wc", {int64_t{1}, int64_t{1}, int64_t{3}, int64_t{3}});
      } else {
        add_input(model, "xc", {int64_t{1}, int64_t{1}, int64_t{3}, int64_t{3}});
        add_input(model, "wc", {int64_t{1}, int64_t{2}});
      }
      add_node(model, op, {"xc", "wc"}, {"c"}, "conv");
      add_output(model, "c", {int64_t{1}, int64_t{1}, int64_t{5}});
      expect_error([&] { import_model(model, dir); }, ErrorCode::kInvalidModel,
                   {"model.onnx", std::string("node 'conv' (") + op + ")", "weight 'wc'",
                    higher ? "rank 4" : "rank 2", "input 'xc'"});
    }
  }
}

TEST(ImporterGraph, UnknownAttributeIsFoundByChecker) {
  TempDir dir;
  onnx::ModelProto model = make_mlp_model();
  testing::set_attr(*model.mutable_graph()->mutable_node(2), "bogus", int64_t{1});
  const std::string message =
      expect_error([&] { import_model(model, dir); }, ErrorCode::kInvalidModel,
                   {"node 'relu' (Relu)", "model.onnx", "bogus"});
  EXPECT_EQ(message.find('\n'), std::string::npos) << message;
}

// ---- a good model, read back ----

// x[batch, 4] -> MatMul -> Add -> Relu -> y, plus img[batch, 1, 5, 5] -> Conv -> Reshape (shape
// from a Constant) -> Add (scalar Constant) -> z, and a Constant graph output v.
onnx::ModelProto make_round_trip_model() {
  onnx::ModelProto model = make_mlp_model();
  model.mutable_graph()->mutable_node(2)->clear_name();  // unnamed: becomes "Relu_2"
  add_input(model, "img", {"batch", int64_t{1}, int64_t{5}, int64_t{5}});
  std::vector<float> kernel(18);
  for (std::size_t i = 0; i < kernel.size(); ++i) kernel[i] = static_cast<float>(i) - 9.0f;
  add_initializer(model, make_float_tensor("K", {2, 1, 3, 3}, kernel, /*raw=*/true));
  onnx::NodeProto& conv = add_node(model, "Conv", {"img", "K"}, {"c"}, "conv");
  testing::set_attr(conv, "kernel_shape", std::vector<int64_t>{3, 3});
  testing::set_attr(conv, "pads", std::vector<int64_t>{1, 1, 1, 1});
  testing::set_attr(conv, "group", int64_t{1});
  testing::set_attr(conv, "auto_pad", std::string("NOTSET"));
  testing::set_attr(add_node(model, "Constant", {}, {"s"}, "shape_const"), "value",
                    testing::make_int64_tensor("s_value", {2}, {0, 50}, /*raw=*/false));
  add_node(model, "Reshape", {"c", "s"}, {"r"}, "reshape");
  testing::set_attr(add_node(model, "Constant", {}, {"o"}, "offset"), "value_float", 0.5f);
  add_node(model, "Add", {"r", "o"}, {"z"}, "add_offset");
  testing::set_attr(add_node(model, "Constant", {}, {"v"}, "list"), "value_floats",
                    std::vector<float>{1.0f, 2.0f, 3.0f});
  add_output(model, "z", {std::string(), std::string()});  // left to shape inference
  add_output(model, "v", {std::string()});
  return model;
}

TEST(ImporterRoundTrip, GraphStructure) {
  TempDir dir;
  const graph::Graph g = import_model(make_round_trip_model(), dir);
  EXPECT_EQ(g.source, dir.file("model.onnx"));
  EXPECT_EQ(g.opset, 13);
  ASSERT_EQ(g.inputs.size(), 2u);  // initializers are constants, not inputs
  EXPECT_EQ(g.values[static_cast<std::size_t>(g.inputs[0])].name, "x");
  EXPECT_EQ(g.values[static_cast<std::size_t>(g.inputs[1])].name, "img");
  std::vector<std::string> names, ops;
  for (const graph::Node& n : g.nodes) {
    names.push_back(n.name);
    ops.push_back(n.op_type);
  }
  EXPECT_EQ(names, (std::vector<std::string>{"matmul", "add", "Relu_2", "conv", "shape_const",
                                             "reshape", "offset", "add_offset", "list"}));
  EXPECT_EQ(ops, (std::vector<std::string>{"MatMul", "Add", "Relu", "Conv", "Constant", "Reshape",
                                           "Constant", "Add", "Constant"}));
  ASSERT_EQ(g.outputs.size(), 3u);
  EXPECT_EQ(g.values[static_cast<std::size_t>(g.outputs[0])].name, "y");
  // Producers are linked: y comes from the Relu, h feeds the Add.
  EXPECT_EQ(value(g, "y").producer, 2);
  EXPECT_EQ(node(g, "add").inputs[0], g.find_value("h"));
  EXPECT_EQ(node(g, "add").inputs[1], g.find_value("b"));
}

TEST(ImporterRoundTrip, ShapesIncludingSymbolicBatch) {
  TempDir dir;
  const graph::Graph g = import_model(make_round_trip_model(), dir);
  const auto shape_of = [&](const std::string& name) {
    const graph::Value& v = value(g, name);
    EXPECT_TRUE(v.dtype_known) << name;
    EXPECT_EQ(v.dtype, DType::kFloat32) << name;
    return v.shape ? graph::to_string(*v.shape) : std::string("none");
  };
  const graph::Value& x = value(g, "x");
  ASSERT_TRUE(x.shape.has_value());
  ASSERT_EQ(x.shape->size(), 2u);
  EXPECT_FALSE((*x.shape)[0].known());
  EXPECT_EQ((*x.shape)[0].symbol, "batch");
  EXPECT_EQ((*x.shape)[1].value, 4);
  // Declared shapes, and shapes only ONNX shape inference knows (h, c, r, z, v).
  EXPECT_EQ(shape_of("y"), "[batch, 3]");
  EXPECT_EQ(shape_of("h"), "[batch, 3]");
  EXPECT_EQ(shape_of("c"), "[batch, 2, 5, 5]");
  EXPECT_EQ(shape_of("r"), "[batch, 50]");
  EXPECT_EQ(shape_of("z"), "[batch, 50]");
  EXPECT_EQ(shape_of("v"), "[3]");
  EXPECT_EQ(value(g, "s").dtype, DType::kInt64);
}

TEST(ImporterRoundTrip, InitializersFromRawDataAndFloatData) {
  TempDir dir;
  const graph::Graph g = import_model(make_round_trip_model(), dir);
  const graph::Value& w = value(g, "W");  // raw_data
  ASSERT_TRUE(w.constant.has_value());
  EXPECT_TRUE(w.constant->owns_data());
  EXPECT_EQ(w.constant->shape(), (std::vector<int64_t>{4, 3}));
  EXPECT_EQ(graph::to_string(*w.shape), "[4, 3]");
  std::vector<float> expected_w;
  for (int i = 1; i <= 12; ++i) expected_w.push_back(0.1f * static_cast<float>(i));
  EXPECT_EQ(floats(*w.constant), expected_w);
  const graph::Value& b = value(g, "b");  // float_data
  ASSERT_TRUE(b.constant.has_value());
  EXPECT_EQ(floats(*b.constant), (std::vector<float>{-1.0f, 0.0f, 1.0f}));
  EXPECT_EQ(value(g, "K").constant->data<float>()[17], 8.0f);
}

TEST(ImporterRoundTrip, Attributes) {
  TempDir dir;
  const graph::Graph g = import_model(make_round_trip_model(), dir);
  const graph::Node& conv = node(g, "conv");
  EXPECT_EQ(conv.attr_ints("kernel_shape"), (std::vector<int64_t>{3, 3}));
  EXPECT_EQ(conv.attr_ints("pads"), (std::vector<int64_t>{1, 1, 1, 1}));
  EXPECT_EQ(conv.attr_int("group", 0), 1);
  EXPECT_EQ(conv.attr_string("auto_pad", ""), "NOTSET");
  EXPECT_EQ(conv.attr_ints("strides", {7}), (std::vector<int64_t>{7}));  // absent: fallback
  const Tensor* shape = node(g, "shape_const").attr_tensor("value");     // from int64_data
  ASSERT_NE(shape, nullptr);
  EXPECT_EQ(shape->dtype(), DType::kInt64);
  EXPECT_EQ(shape->data<int64_t>()[1], 50);
  EXPECT_EQ(node(g, "offset").attr_float("value_float", 0.0f), 0.5f);
  EXPECT_EQ(node(g, "list").attr_floats("value_floats"), (std::vector<float>{1, 2, 3}));
}

TEST(ImporterRoundTrip, WrongAttributeTypeNamesNodeAndAttribute) {
  TempDir dir;
  const graph::Graph g = import_model(make_round_trip_model(), dir);
  const graph::Node& conv = node(g, "conv");
  expect_error([&] { conv.attr_int("kernel_shape", 0); }, ErrorCode::kInvalidModel,
               {"'conv'", "Conv", "'kernel_shape'"});
  expect_error([&] { conv.attr_ints("auto_pad"); }, ErrorCode::kInvalidModel,
               {"'conv'", "'auto_pad'"});
}

TEST(ImporterRoundTrip, DimWithoutValueOrSymbolIsUnknown) {
  TempDir dir;
  onnx::ModelProto model = make_model();
  add_input(model, "x", {std::string(), int64_t{4}});
  add_node(model, "Relu", {"x"}, {"y"}, "relu");
  add_output(model, "y", {std::string(), int64_t{4}});
  const graph::Graph g = import_model(model, dir);
  const graph::Shape& shape = *value(g, "x").shape;
  EXPECT_FALSE(shape[0].known());
  EXPECT_EQ(shape[0].symbol, "");
  EXPECT_EQ(graph::to_string(shape), "[?, 4]");
}

TEST(ImporterRoundTrip, BytesAndFileImportsAgree) {
  TempDir dir;
  const std::string bytes = serialize(make_mlp_model());
  const graph::Graph from_bytes =
      onnx_import::import_model_bytes(bytes.data(), bytes.size(), "mem.onnx", "");
  const graph::Graph from_file = import_model(make_mlp_model(), dir);
  EXPECT_EQ(from_bytes.source, "mem.onnx");
  ASSERT_EQ(from_bytes.values.size(), from_file.values.size());
  for (std::size_t i = 0; i < from_file.values.size(); ++i) {
    EXPECT_EQ(from_bytes.values[i].name, from_file.values[i].name);
  }
}

// ---- TensorProto files (ONNX test data) ----

TEST(TensorProtoFile, ReadsOnnxTestData) {
  if (!fs::exists(kAbsInput)) GTEST_SKIP() << "libonnx-testdata is not installed";
  std::string name;
  const Tensor t = onnx_import::read_tensor_proto_file(kAbsInput, &name);
  EXPECT_EQ(name, "x");
  EXPECT_EQ(t.dtype(), DType::kFloat32);
  EXPECT_EQ(t.shape(), (std::vector<int64_t>{3, 4, 5}));
  EXPECT_TRUE(t.owns_data());
  // test_abs's output is |input|: check the data, not only the header.
  const Tensor out = onnx_import::read_tensor_proto_file(
      fs::path(kAbsInput).parent_path().append("output_0.pb").string());
  ASSERT_EQ(out.numel(), t.numel());
  for (int64_t i = 0; i < t.numel(); ++i) {
    EXPECT_EQ(out.data<float>()[i], std::abs(t.data<float>()[i])) << i;
  }
}

TEST(TensorProtoFile, TruncatedCopyIsInvalidModel) {
  if (!fs::exists(kAbsInput)) GTEST_SKIP() << "libonnx-testdata is not installed";
  TempDir dir;
  std::ifstream in(kAbsInput, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_GT(bytes.size(), 200u);
  for (std::size_t size : {bytes.size() - 1, bytes.size() / 2, std::size_t{3}}) {
    SCOPED_TRACE("truncated to " + std::to_string(size) + " bytes");
    const std::string path = dir.write("input_0.pb", bytes.substr(0, size));
    expect_error([&] { onnx_import::read_tensor_proto_file(path); }, ErrorCode::kInvalidModel,
                 {path});
  }
}

TEST(TensorProtoFile, MissingFileIsNotFound) {
  TempDir dir;
  const std::string path = dir.file("output_0.pb");
  expect_error([&] { onnx_import::read_tensor_proto_file(path); }, ErrorCode::kNotFound, {path});
}

}  // namespace
}  // namespace sparsecol
