// Writes the seed corpora of the fuzz targets, so that no fuzz input is committed:
//
//   sparsecol_fuzz_corpus OUT_DIR [ONNX_TESTDATA_NODE_DIR]
//
// OUT_DIR/importer: hand-crafted models (an MLP, a small CNN, a shape-computing subgraph) and
//   the model.onnx of a few ONNX backend node tests (Debian's libonnx-testdata);
// OUT_DIR/tensor_files: .npy files of every dtype and several ranks, an .npz archive, and the
//   input_0.pb of the same node tests.
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "../unit/test_models.h"
#include "sparsecol/io.h"
#include "sparsecol/sparsecol.h"

namespace {

namespace fs = std::filesystem;
namespace t = sparsecol::testing;
using sparsecol::DType;
using sparsecol::Tensor;

void write_file(const fs::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) throw std::runtime_error("cannot write " + path.string());
}

// x[N, 1, 8, 8] -> Conv 3x3 (4 filters, pad 1) -> Relu -> MaxPool 2x2 -> Flatten -> Gemm -> y[N, 3]
onnx::ModelProto small_cnn() {
  onnx::ModelProto model = t::make_model();
  t::add_input(model, "x", {"N", int64_t{1}, int64_t{8}, int64_t{8}});
  std::vector<float> kernel(4 * 9), fc(3 * 64), bias{0.1f, -0.2f, 0.3f};
  for (std::size_t i = 0; i < kernel.size(); ++i)
    kernel[i] = 0.05f * static_cast<float>(i % 7) - 0.1f;
  for (std::size_t i = 0; i < fc.size(); ++i) fc[i] = 0.01f * static_cast<float>(i % 11) - 0.05f;
  t::add_initializer(model, t::make_float_tensor("K", {4, 1, 3, 3}, kernel));
  t::add_initializer(model, t::make_float_tensor("F", {3, 64}, fc));
  t::add_initializer(model, t::make_float_tensor("B", {3}, bias, /*raw=*/false));
  onnx::NodeProto& conv = t::add_node(model, "Conv", {"x", "K"}, {"c"}, "conv");
  t::set_attr(conv, "kernel_shape", std::vector<int64_t>{3, 3});
  t::set_attr(conv, "pads", std::vector<int64_t>{1, 1, 1, 1});
  t::add_node(model, "Relu", {"c"}, {"r"}, "relu");
  onnx::NodeProto& pool = t::add_node(model, "MaxPool", {"r"}, {"p"}, "pool");
  t::set_attr(pool, "kernel_shape", std::vector<int64_t>{2, 2});
  t::set_attr(pool, "strides", std::vector<int64_t>{2, 2});
  t::add_node(model, "Flatten", {"p"}, {"f"}, "flatten");
  onnx::NodeProto& gemm = t::add_node(model, "Gemm", {"f", "F", "B"}, {"y"}, "fc");
  t::set_attr(gemm, "transB", int64_t{1});
  t::add_output(model, "y", {"N", int64_t{3}});
  return model;
}

// x[N, 12] -> Shape -> Gather(0) -> Concat with [3, 4] -> Reshape -> Softmax -> y[N, 3, 4]
onnx::ModelProto shape_subgraph() {
  onnx::ModelProto model = t::make_model();
  t::add_input(model, "x", {"N", int64_t{12}});
  t::add_initializer(model, t::make_int64_tensor("zero", {1}, {0}));
  t::add_initializer(model, t::make_int64_tensor("rest", {2}, {3, 4}));
  t::add_node(model, "Shape", {"x"}, {"s"}, "shape");
  t::set_attr(t::add_node(model, "Gather", {"s", "zero"}, {"n"}, "gather"), "axis", int64_t{0});
  t::set_attr(t::add_node(model, "Concat", {"n", "rest"}, {"target"}, "concat"), "axis",
              int64_t{0});
  t::add_node(model, "Reshape", {"x", "target"}, {"r"}, "reshape");
  t::set_attr(t::add_node(model, "Softmax", {"r"}, {"y"}, "softmax"), "axis", int64_t{-1});
  t::add_output(model, "y", {"N", int64_t{3}, int64_t{4}});
  return model;
}

// Node tests whose model.onnx and input_0.pb seed the corpora: ops from every family.
const char* const kNodeTests[] = {
    "test_conv_with_strides_padding",
    "test_relu",
    "test_gemm_default_single_elem_vector_bias",
    "test_matmul_2d",
    "test_maxpool_2d_pads",
    "test_averagepool_2d_strides",
    "test_batchnorm_example",
    "test_reshape_negative_dim",
    "test_concat_2d_axis_1",
    "test_softmax_axis_1",
    "test_transpose_default",
    "test_gather_0",
    "test_slice",
    "test_add_bcast",
    "test_flatten_axis1",
    "test_globalaveragepool",
    "test_clip_example",
    "test_expand_dim_changed",
    "test_split_equal_parts_1d",
    "test_pad",
    "test_sigmoid",
    "test_reduce_mean_keepdims_example",
    "test_layer_normalization_2d_axis0",
    "test_where_example",
    "test_cast_FLOAT_to_DOUBLE",
    "test_unsqueeze_axis_0",
    "test_squeeze",
    "test_erf",
    "test_convtranspose_pads",
    "test_top_k",
    "test_quantizelinear",
    "test_lstm_with_peepholes",
    "test_gru_seq_length",
    "test_einsum_batch_matmul",
    "test_gridsample_bicubic",
    "test_sce_mean_weight_ii_3d_log_prob",
    "test_nllloss_NCd1d2_with_weight_reduction_sum_ii",
};

template <typename T>
Tensor counting(std::vector<int64_t> shape) {
  Tensor tensor = Tensor::zeros(sparsecol::DTypeOf<T>::kValue, std::move(shape));
  T* p = tensor.data<T>();
  for (int64_t i = 0; i < tensor.numel(); ++i) p[i] = static_cast<T>(i % 3);
  return tensor;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || argc > 3) {
    std::cerr << "usage: " << argv[0] << " OUT_DIR [ONNX_TESTDATA_NODE_DIR]\n";
    return 1;
  }
  const fs::path out = argv[1];
  const fs::path testdata = argc > 2 ? argv[2] : "/usr/share/libonnx-testdata/data/node";
  const fs::path models = out / "importer", tensors = out / "tensor_files";
  fs::create_directories(models);
  fs::create_directories(tensors);

  write_file(models / "mlp.onnx", t::serialize(t::make_mlp_model()));
  write_file(models / "small_cnn.onnx", t::serialize(small_cnn()));
  write_file(models / "shape_subgraph.onnx", t::serialize(shape_subgraph()));

  sparsecol::write_npy((tensors / "f32_4d.npy").string(), counting<float>({2, 1, 3, 3}));
  sparsecol::write_npy((tensors / "f64_2d.npy").string(), counting<double>({3, 2}));
  sparsecol::write_npy((tensors / "i64_1d.npy").string(), counting<int64_t>({5}));
  sparsecol::write_npy((tensors / "i32_scalar.npy").string(), counting<int32_t>({}));
  sparsecol::write_npy((tensors / "i8_empty.npy").string(), counting<int8_t>({0, 4}));
  sparsecol::write_npy((tensors / "u8_3d.npy").string(), counting<uint8_t>({2, 2, 2}));
  sparsecol::write_npy((tensors / "bool_2d.npy").string(), counting<bool>({4, 1}));
  sparsecol::write_npz((tensors / "pair.npz").string(),
                       {{"a", counting<float>({2, 3})}, {"b", counting<int64_t>({2})}});

  int copied = 0;
  for (const char* name : kNodeTests) {
    const fs::path dir = testdata / name;
    if (fs::exists(dir / "model.onnx")) {
      fs::copy_file(dir / "model.onnx", models / (std::string(name) + ".onnx"),
                    fs::copy_options::overwrite_existing);
      ++copied;
    }
    if (fs::exists(dir / "test_data_set_0" / "input_0.pb")) {
      fs::copy_file(dir / "test_data_set_0" / "input_0.pb",
                    tensors / (std::string(name) + ".input_0.pb"),
                    fs::copy_options::overwrite_existing);
    }
  }
  std::cout << "corpus in " << out.string() << ": 3 hand-crafted models, " << copied
            << " node-test models, 8 tensor files and their .pb inputs\n";
  return 0;
}
