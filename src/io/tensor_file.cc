// Tensor files by extension, and ONNX TensorProto files through the importer (the only code
// that sees protobuf).
#include <fmt/format.h>

#include "onnx/onnx_importer.h"
#include "sparsecol/io.h"

namespace sparsecol {

Tensor read_tensor_proto(const std::string& path, std::string* name) {
  return onnx_import::read_tensor_proto_file(path, name);
}

Tensor read_tensor_file(const std::string& path) {
  if (path.ends_with(".npy")) return read_npy(path);
  if (path.ends_with(".pb")) return read_tensor_proto(path);
  throw Error(ErrorCode::kInvalidArgument,
              fmt::format("'{}': unknown tensor file type (expected .npy or .pb)", path));
}

}  // namespace sparsecol
