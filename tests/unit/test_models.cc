#include "test_models.h"

#include <unistd.h>

#include <atomic>
#include <fstream>
#include <random>
#include <stdexcept>

namespace sparsecol::testing {

namespace {

onnx::ValueInfoProto& declare(onnx::ValueInfoProto& info, const std::string& name,
                              const std::vector<DimSpec>& dims, int32_t elem_type) {
  info.set_name(name);
  onnx::TypeProto::Tensor* tensor = info.mutable_type()->mutable_tensor_type();
  tensor->set_elem_type(elem_type);
  onnx::TensorShapeProto* shape = tensor->mutable_shape();
  for (const DimSpec& dim : dims) {
    onnx::TensorShapeProto::Dimension* d = shape->add_dim();
    if (const int64_t* value = std::get_if<int64_t>(&dim)) {
      d->set_dim_value(*value);
    } else if (!std::get<std::string>(dim).empty()) {
      d->set_dim_param(std::get<std::string>(dim));
    }
  }
  return info;
}

onnx::AttributeProto& new_attr(onnx::NodeProto& node, const std::string& name,
                               onnx::AttributeProto::AttributeType type) {
  onnx::AttributeProto* attr = node.add_attribute();
  attr->set_name(name);
  attr->set_type(type);
  return *attr;
}

template <typename T>
void set_raw(onnx::TensorProto& tensor, const std::vector<T>& values) {
  tensor.set_raw_data(values.data(), values.size() * sizeof(T));
}

void set_header(onnx::TensorProto& tensor, const std::string& name, int32_t elem_type,
                const std::vector<int64_t>& dims) {
  tensor.set_name(name);
  tensor.set_data_type(elem_type);
  for (int64_t d : dims) tensor.add_dims(d);
}

}  // namespace

onnx::ModelProto make_model(int64_t opset) {
  onnx::ModelProto model;
  model.set_ir_version(8);
  model.set_producer_name("sparsecol-tests");
  onnx::OperatorSetIdProto* import = model.add_opset_import();
  import->set_domain("");
  import->set_version(opset);
  model.mutable_graph()->set_name("test");
  return model;
}

onnx::ValueInfoProto& add_input(onnx::ModelProto& model, const std::string& name,
                                const std::vector<DimSpec>& dims, int32_t elem_type) {
  return declare(*model.mutable_graph()->add_input(), name, dims, elem_type);
}

onnx::ValueInfoProto& add_output(onnx::ModelProto& model, const std::string& name,
                                 const std::vector<DimSpec>& dims, int32_t elem_type) {
  return declare(*model.mutable_graph()->add_output(), name, dims, elem_type);
}

onnx::NodeProto& add_node(onnx::ModelProto& model, const std::string& op_type,
                          const std::vector<std::string>& inputs,
                          const std::vector<std::string>& outputs, const std::string& name) {
  onnx::NodeProto* node = model.mutable_graph()->add_node();
  node->set_op_type(op_type);
  if (!name.empty()) node->set_name(name);
  for (const std::string& input : inputs) node->add_input(input);
  for (const std::string& output : outputs) node->add_output(output);
  return *node;
}

void set_attr(onnx::NodeProto& node, const std::string& name, int64_t value) {
  new_attr(node, name, onnx::AttributeProto::INT).set_i(value);
}

void set_attr(onnx::NodeProto& node, const std::string& name, float value) {
  new_attr(node, name, onnx::AttributeProto::FLOAT).set_f(value);
}

void set_attr(onnx::NodeProto& node, const std::string& name, const std::string& value) {
  new_attr(node, name, onnx::AttributeProto::STRING).set_s(value);
}

void set_attr(onnx::NodeProto& node, const std::string& name, const std::vector<int64_t>& value) {
  onnx::AttributeProto& attr = new_attr(node, name, onnx::AttributeProto::INTS);
  for (int64_t v : value) attr.add_ints(v);
}

void set_attr(onnx::NodeProto& node, const std::string& name, const std::vector<float>& value) {
  onnx::AttributeProto& attr = new_attr(node, name, onnx::AttributeProto::FLOATS);
  for (float v : value) attr.add_floats(v);
}

void set_attr(onnx::NodeProto& node, const std::string& name, const onnx::TensorProto& value) {
  *new_attr(node, name, onnx::AttributeProto::TENSOR).mutable_t() = value;
}

onnx::TensorProto make_float_tensor(const std::string& name, const std::vector<int64_t>& dims,
                                    const std::vector<float>& values, bool raw) {
  onnx::TensorProto tensor;
  set_header(tensor, name, onnx::TensorProto::FLOAT, dims);
  if (raw) {
    set_raw(tensor, values);
  } else {
    for (float v : values) tensor.add_float_data(v);
  }
  return tensor;
}

onnx::TensorProto make_int64_tensor(const std::string& name, const std::vector<int64_t>& dims,
                                    const std::vector<int64_t>& values, bool raw) {
  onnx::TensorProto tensor;
  set_header(tensor, name, onnx::TensorProto::INT64, dims);
  if (raw) {
    set_raw(tensor, values);
  } else {
    for (int64_t v : values) tensor.add_int64_data(v);
  }
  return tensor;
}

onnx::TensorProto make_int32_data_tensor(const std::string& name, int32_t elem_type,
                                         const std::vector<int64_t>& dims,
                                         const std::vector<int32_t>& values) {
  onnx::TensorProto tensor;
  set_header(tensor, name, elem_type, dims);
  for (int32_t v : values) tensor.add_int32_data(v);
  return tensor;
}

void set_external_data(onnx::TensorProto& tensor, const std::string& location, int64_t offset,
                       int64_t length) {
  tensor.clear_raw_data();
  tensor.clear_float_data();
  tensor.clear_int64_data();
  tensor.clear_int32_data();
  tensor.clear_double_data();
  tensor.set_data_location(onnx::TensorProto::EXTERNAL);
  const auto add = [&](const std::string& key, const std::string& value) {
    onnx::StringStringEntryProto* entry = tensor.add_external_data();
    entry->set_key(key);
    entry->set_value(value);
  };
  add("location", location);
  if (offset >= 0) add("offset", std::to_string(offset));
  if (length >= 0) add("length", std::to_string(length));
}

onnx::TensorProto& add_initializer(onnx::ModelProto& model, const onnx::TensorProto& tensor) {
  onnx::TensorProto* added = model.mutable_graph()->add_initializer();
  *added = tensor;
  return *added;
}

onnx::ModelProto make_mlp_model() {
  onnx::ModelProto model = make_model();
  add_input(model, "x", {"batch", int64_t{4}});
  std::vector<float> w(12);
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = 0.1f * static_cast<float>(i + 1);
  add_initializer(model, make_float_tensor("W", {4, 3}, w, /*raw=*/true));
  add_initializer(model, make_float_tensor("b", {3}, {-1.0f, 0.0f, 1.0f}, /*raw=*/false));
  add_node(model, "MatMul", {"x", "W"}, {"h"}, "matmul");
  add_node(model, "Add", {"h", "b"}, {"hb"}, "add");
  add_node(model, "Relu", {"hb"}, {"y"}, "relu");
  add_output(model, "y", {"batch", int64_t{3}});
  return model;
}

std::string serialize(const onnx::ModelProto& model) {
  std::string bytes;
  if (!model.SerializeToString(&bytes)) throw std::runtime_error("cannot serialize test model");
  return bytes;
}

TempDir::TempDir() {
  static std::atomic<int> counter{0};
  std::random_device entropy;
  const std::string name = "sparsecol-test-" + std::to_string(::getpid()) + "-" +
                           std::to_string(counter++) + "-" + std::to_string(entropy());
  path_ = std::filesystem::temp_directory_path() / name;
  std::filesystem::create_directories(path_);
}

TempDir::~TempDir() {
  std::error_code ignored;
  std::filesystem::remove_all(path_, ignored);
}

std::string TempDir::write(const std::string& name, const std::string& bytes) const {
  const std::filesystem::path file = path_ / name;
  std::filesystem::create_directories(file.parent_path());
  std::ofstream out(file, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) throw std::runtime_error("cannot write " + file.string());
  return file.string();
}

}  // namespace sparsecol::testing
