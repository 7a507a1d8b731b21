// ONNX model -> graph::Graph. The only code that sees protobuf or ONNX; this header exposes
// neither, so that callers need not compile against them.
//
// Import parses the ModelProto, checks what sparsecol supports (default-domain opset 11 to 17,
// ops known to graph::find_op, element types of sparsecol::DType, no subgraphs), converts
// initializers (inline or external data kept inside the model's folder), runs the ONNX checker
// and ONNX shape inference, and returns a linked Graph whose values carry the dtypes and
// (possibly symbolic) shapes found. Every failure is a sparsecol::Error naming the file and,
// where there is one, the node, op, tensor or value.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "graph/graph.h"

namespace sparsecol::onnx_import {

// The default-domain opset versions the importer accepts.
inline constexpr int64_t kMinOpset = 11;
// Older opsets are read as kMinOpset when none of the model's ops changed in between.
inline constexpr int64_t kOldestOpset = 1;
inline constexpr int64_t kMaxOpset = 17;

// Reads and imports a .onnx file; external data is looked up next to it.
// Error(kNotFound) if the file does not exist.
graph::Graph import_model_file(const std::string& path);

// Imports a serialized ModelProto. `source_name` names the model in messages and becomes
// Graph::source; `base_dir` is the folder external data is resolved in (empty: the model may
// not use external data).
graph::Graph import_model_bytes(const void* data, std::size_t size, const std::string& source_name,
                                const std::string& base_dir);

// Reads a serialized TensorProto (the input_N.pb / output_N.pb files of ONNX test data) into an
// owning Tensor; stores the tensor's name in *name when given.
Tensor read_tensor_proto_file(const std::string& path, std::string* name = nullptr);

}  // namespace sparsecol::onnx_import
