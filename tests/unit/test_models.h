// Small ONNX models hand-crafted in C++ for tests (no model files in the repository), and a
// temporary folder to write them to.
//
//   onnx::ModelProto model = testing::make_model();
//   testing::add_input(model, "x", {"batch", 4});
//   testing::add_node(model, "Relu", {"x"}, {"y"}, "relu");
//   testing::add_output(model, "y", {"batch", 4});
//   testing::TempDir dir;
//   graph::Graph g = onnx_import::import_model_file(dir.write("m.onnx",
//   testing::serialize(model)));
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <variant>
#include <vector>

#include <onnx/onnx_pb.h>

namespace sparsecol::testing {

// A declared dimension: a size, a symbol such as "batch", or "" for a dimension with neither.
using DimSpec = std::variant<int64_t, std::string>;

// An empty model: IR version 8, default-domain opset `opset`, a graph named "test".
onnx::ModelProto make_model(int64_t opset = 13);

// Declares a graph input, graph output or intermediate value_info of the given element type.
onnx::ValueInfoProto& add_input(onnx::ModelProto& model, const std::string& name,
                                const std::vector<DimSpec>& dims,
                                int32_t elem_type = onnx::TensorProto::FLOAT);
onnx::ValueInfoProto& add_output(onnx::ModelProto& model, const std::string& name,
                                 const std::vector<DimSpec>& dims,
                                 int32_t elem_type = onnx::TensorProto::FLOAT);

onnx::NodeProto& add_node(onnx::ModelProto& model, const std::string& op_type,
                          const std::vector<std::string>& inputs,
                          const std::vector<std::string>& outputs, const std::string& name = "");

void set_attr(onnx::NodeProto& node, const std::string& name, int64_t value);
void set_attr(onnx::NodeProto& node, const std::string& name, float value);
void set_attr(onnx::NodeProto& node, const std::string& name, const std::string& value);
void set_attr(onnx::NodeProto& node, const std::string& name, const std::vector<int64_t>& value);
void set_attr(onnx::NodeProto& node, const std::string& name, const std::vector<float>& value);
void set_attr(onnx::NodeProto& node, const std::string& name, const onnx::TensorProto& value);

// Tensors with their data in raw_data (raw = true) or in the typed field.
onnx::TensorProto make_float_tensor(const std::string& name, const std::vector<int64_t>& dims,
                                    const std::vector<float>& values, bool raw = true);
onnx::TensorProto make_int64_tensor(const std::string& name, const std::vector<int64_t>& dims,
                                    const std::vector<int64_t>& values, bool raw = true);
// A tensor of element type `elem_type` whose values go to int32_data (how ONNX stores int32,
// int8, uint8, bool and int16 without raw_data).
onnx::TensorProto make_int32_data_tensor(const std::string& name, int32_t elem_type,
                                         const std::vector<int64_t>& dims,
                                         const std::vector<int32_t>& values);
// Points `tensor` at external data: location, and offset/length when >= 0; clears inline data.
void set_external_data(onnx::TensorProto& tensor, const std::string& location, int64_t offset = -1,
                       int64_t length = -1);

onnx::TensorProto& add_initializer(onnx::ModelProto& model, const onnx::TensorProto& tensor);

// x[batch, 4] -> MatMul W[4, 3] (raw_data) -> Add b[3] (float_data) -> Relu -> y[batch, 3], with
// nodes named "matmul", "add" and "relu"; W = 0.1 * (i + 1) in order, b = {-1, 0, 1}.
onnx::ModelProto make_mlp_model();

std::string serialize(const onnx::ModelProto& model);

// A fresh folder under std::filesystem::temp_directory_path(), removed with its contents when
// the TempDir goes out of scope.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::filesystem::path& path() const { return path_; }
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  // Writes `bytes` to path()/name (creating sub-folders) and returns the file's path.
  std::string write(const std::string& name, const std::string& bytes) const;

 private:
  std::filesystem::path path_;
};

}  // namespace sparsecol::testing
