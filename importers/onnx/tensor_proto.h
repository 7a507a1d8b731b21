// TensorProto -> Tensor, and the file reading shared by the importer. Internal to the importer:
// this header exposes protobuf types; callers outside importers/onnx include onnx_importer.h.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <onnx/onnx_pb.h>

#include "sparsecol/sparsecol.h"

namespace sparsecol::onnx_import {

// The engine's element type for an ONNX TensorProto::DataType; nullopt when unsupported.
std::optional<DType> dtype_from_onnx(int32_t elem_type);
// "FLOAT16" for messages; the number for values outside the enum.
std::string onnx_type_name(int32_t elem_type);
// The element types the engine accepts, for messages ("FLOAT, DOUBLE, ...").
std::string supported_onnx_types();

// Converts a TensorProto into an owning Tensor. Reads raw_data, the typed fields (float_data,
// int32_data, int64_data, double_data) or external data resolved inside `base_dir` (the model's
// folder; empty refuses external data). Sizes are checked against the dims before anything is
// allocated. `where` starts every error message, e.g. "initializer 'w' in model.onnx".
Tensor tensor_from_proto(const onnx::TensorProto& proto, const std::string& base_dir,
                         const std::string& where);

// The whole file; Error(kNotFound) when it does not exist, Error(kIoError) when it cannot be
// read. `what` names the file's role in messages ("model", "tensor file").
std::string read_whole_file(const std::string& path, const char* what);

}  // namespace sparsecol::onnx_import
