#include "onnx/tensor_proto.h"

#include <charconv>
#include <climits>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <new>
#include <type_traits>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "onnx/onnx_importer.h"

namespace sparsecol::onnx_import {

namespace fs = std::filesystem;
using onnx::TensorProto;

namespace {

constexpr std::pair<TensorProto::DataType, DType> kSupportedTypes[] = {
    {TensorProto::FLOAT, DType::kFloat32}, {TensorProto::DOUBLE, DType::kFloat64},
    {TensorProto::INT64, DType::kInt64},   {TensorProto::INT32, DType::kInt32},
    {TensorProto::INT8, DType::kInt8},     {TensorProto::UINT8, DType::kUInt8},
    {TensorProto::BOOL, DType::kBool},
};

[[noreturn]] void fail(ErrorCode code, const std::string& where, const std::string& message) {
  throw Error(code, fmt::format("{}: {}", where, message));
}

std::string describe(const std::vector<int64_t>& dims, DType dtype) {
  return fmt::format("{} [{}]", to_string(dtype), fmt::join(dims, ", "));
}

// Bytes needed by the tensor, computed before any allocation so that hostile dims
// (negative, or 2^62 elements) are refused instead of exhausting memory.
int64_t expected_bytes(const std::vector<int64_t>& dims, DType dtype, const std::string& where) {
  for (int64_t d : dims) {
    if (d < 0) {
      fail(ErrorCode::kInvalidModel, where,
           fmt::format("negative dimension in dims [{}]", fmt::join(dims, ", ")));
    }
  }
  int64_t count = 0;
  try {
    count = checked_numel(dims);
  } catch (const Error& e) {
    fail(ErrorCode::kInvalidModel, where, e.what());
  }
  const auto element = static_cast<int64_t>(dtype_size(dtype));
  if (count > std::numeric_limits<int64_t>::max() / element) {
    fail(ErrorCode::kInvalidModel, where,
         fmt::format("{} elements of {} overflow 64 bits (dims [{}])", count, to_string(dtype),
                     fmt::join(dims, ", ")));
  }
  return count * element;
}

Tensor allocate(DType dtype, const std::vector<int64_t>& dims, const std::string& where) {
  try {
    return Tensor::zeros(dtype, dims);
  } catch (const Error& e) {
    fail(e.code(), where, e.what());
  }
}

// The typed repeated field that holds `dtype` when raw_data is not used (onnx.proto: int32_data
// also carries int8, uint8 and bool).
std::pair<const char*, int> typed_field(const TensorProto& proto, DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return {"float_data", proto.float_data_size()};
    case DType::kFloat64:
      return {"double_data", proto.double_data_size()};
    case DType::kInt64:
      return {"int64_data", proto.int64_data_size()};
    case DType::kInt32:
    case DType::kInt8:
    case DType::kUInt8:
    case DType::kBool:
      return {"int32_data", proto.int32_data_size()};
  }
  return {"?", 0};
}

template <typename T, typename Source>
void copy_field(const google::protobuf::RepeatedField<Source>& src, Tensor& dst, const char* field,
                const std::string& where) {
  T* out = dst.data<T>();
  for (int i = 0; i < src.size(); ++i) {
    const Source v = src.Get(i);
    if constexpr (std::is_same_v<T, bool>) {
      out[i] = v != 0;
    } else if constexpr (std::is_integral_v<T> && sizeof(T) < sizeof(Source)) {
      if (v < std::numeric_limits<T>::min() || v > std::numeric_limits<T>::max()) {
        fail(ErrorCode::kInvalidModel, where,
             fmt::format("{}[{}] = {} does not fit in {}", field, i, v,
                         to_string(DTypeOf<T>::kValue)));
      }
      out[i] = static_cast<T>(v);
    } else {
      out[i] = v;
    }
  }
}

void copy_typed_field(const TensorProto& proto, Tensor& dst, const std::string& where) {
  switch (dst.dtype()) {
    case DType::kFloat32:
      return copy_field<float>(proto.float_data(), dst, "float_data", where);
    case DType::kFloat64:
      return copy_field<double>(proto.double_data(), dst, "double_data", where);
    case DType::kInt64:
      return copy_field<int64_t>(proto.int64_data(), dst, "int64_data", where);
    case DType::kInt32:
      return copy_field<int32_t>(proto.int32_data(), dst, "int32_data", where);
    case DType::kInt8:
      return copy_field<int8_t>(proto.int32_data(), dst, "int32_data", where);
    case DType::kUInt8:
      return copy_field<uint8_t>(proto.int32_data(), dst, "int32_data", where);
    case DType::kBool:
      return copy_field<bool>(proto.int32_data(), dst, "int32_data", where);
  }
}

// Bytes other than 0 and 1 in a bool tensor would make every later read of it undefined.
void normalize_bools(Tensor& tensor) {
  if (tensor.dtype() != DType::kBool) return;
  auto* bytes = static_cast<unsigned char*>(tensor.raw_data());
  for (std::size_t i = 0; i < tensor.nbytes(); ++i) bytes[i] = bytes[i] != 0 ? 1 : 0;
}

uint64_t parse_size(const std::string& key, const std::string& text, const std::string& where) {
  uint64_t value = 0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (text.empty() || ec != std::errc() || ptr != end) {
    fail(ErrorCode::kInvalidModel, where,
         fmt::format("external data '{}' is '{}', not a non-negative integer", key, text));
  }
  return value;
}

// A model file is untrusted input: its external-data locations must stay inside the model's
// folder, so that a model cannot make us read (and later reveal through outputs) other files.
// Refuses absolute paths and ".." lexically, then resolves symbolic links and checks again.
fs::path resolve_location(const std::string& location, const std::string& base_dir,
                          const std::string& where) {
  if (base_dir.empty()) {
    fail(ErrorCode::kInvalidArgument, where,
         "tensor has external data, but the model's folder is not known (load the model from "
         "a file)");
  }
  if (location.empty() || location.find('\0') != std::string::npos) {
    fail(ErrorCode::kInvalidModel, where, "external data has an empty or invalid 'location'");
  }
  const fs::path relative(location);
  if (relative.has_root_path()) {
    fail(ErrorCode::kInvalidModel, where,
         fmt::format("external data location '{}' is an absolute path; it must be relative to "
                     "the model's folder",
                     location));
  }
  for (const fs::path& part : relative) {
    if (part == "..") {
      fail(ErrorCode::kInvalidModel, where,
           fmt::format("external data location '{}' contains '..'; it must stay inside the "
                       "model's folder",
                       location));
    }
  }
  std::error_code ec;
  fs::path base = fs::absolute(base_dir, ec);
  if (!ec) base = fs::weakly_canonical(base, ec);
  fs::path full;
  if (!ec) full = fs::weakly_canonical(base / relative, ec);
  if (ec) {
    fail(ErrorCode::kIoError, where,
         fmt::format("cannot resolve external data location '{}' in '{}': {}", location, base_dir,
                     ec.message()));
  }
  const fs::path inside = full.lexically_relative(base);
  if (inside.empty() || *inside.begin() == "..") {
    fail(ErrorCode::kInvalidModel, where,
         fmt::format("external data location '{}' resolves to '{}', outside the model's folder "
                     "'{}' (through a symbolic link)",
                     location, full.string(), base.string()));
  }
  return full;
}

// Where a tensor's external bytes lie, checked against the file before anything is allocated.
struct ExternalSpan {
  fs::path path;
  uint64_t offset = 0;
};

ExternalSpan locate_external(const TensorProto& proto, const std::string& base_dir, int64_t needed,
                             const std::string& what, const std::string& where) {
  std::string location;
  std::optional<uint64_t> offset, length;
  for (const onnx::StringStringEntryProto& entry : proto.external_data()) {
    if (entry.key() == "location") {
      location = entry.value();
    } else if (entry.key() == "offset") {
      offset = parse_size("offset", entry.value(), where);
    } else if (entry.key() == "length") {
      length = parse_size("length", entry.value(), where);
    }
  }
  ExternalSpan span{resolve_location(location, base_dir, where), offset.value_or(0)};
  const std::string path = span.path.string();
  std::error_code ec;
  const fs::file_status status = fs::status(span.path, ec);
  if (!fs::exists(status)) {
    fail(ErrorCode::kNotFound, where, fmt::format("external data file '{}' does not exist", path));
  }
  if (!fs::is_regular_file(status)) {
    fail(ErrorCode::kIoError, where, fmt::format("external data '{}' is not a regular file", path));
  }
  const uint64_t file_size = fs::file_size(span.path, ec);
  if (ec) {
    fail(ErrorCode::kIoError, where,
         fmt::format("cannot read the size of '{}': {}", path, ec.message()));
  }
  if (span.offset > file_size || length.value_or(0) > file_size - span.offset) {
    fail(ErrorCode::kInvalidModel, where,
         fmt::format("external data offset {} + length {} is beyond the end of '{}' ({} bytes)",
                     span.offset, length.value_or(0), path, file_size));
  }
  const uint64_t available = length.value_or(file_size - span.offset);
  if (available != static_cast<uint64_t>(needed)) {
    fail(ErrorCode::kInvalidModel, where,
         fmt::format("external data in '{}' holds {} bytes, but {} needs {}", path, available, what,
                     needed));
  }
  return span;
}

void read_external(const ExternalSpan& span, Tensor& dst, const std::string& where) {
  std::ifstream in(span.path, std::ios::binary);
  in.seekg(static_cast<std::streamoff>(span.offset));
  in.read(static_cast<char*>(dst.raw_data()), static_cast<std::streamsize>(dst.nbytes()));
  if (!in || in.gcount() != static_cast<std::streamsize>(dst.nbytes())) {
    fail(ErrorCode::kIoError, where,
         fmt::format("cannot read {} bytes at offset {} of '{}'", dst.nbytes(), span.offset,
                     span.path.string()));
  }
}

}  // namespace

std::optional<DType> dtype_from_onnx(int32_t elem_type) {
  for (const auto& [onnx_type, dtype] : kSupportedTypes) {
    if (onnx_type == elem_type) return dtype;
  }
  return std::nullopt;
}

std::string onnx_type_name(int32_t elem_type) {
  if (!TensorProto::DataType_IsValid(elem_type)) return std::to_string(elem_type);
  return TensorProto::DataType_Name(static_cast<TensorProto::DataType>(elem_type));
}

std::string supported_onnx_types() {
  std::vector<std::string> names;
  for (const auto& [onnx_type, dtype] : kSupportedTypes) names.push_back(onnx_type_name(onnx_type));
  return fmt::format("{}", fmt::join(names, ", "));
}

Tensor tensor_from_proto(const TensorProto& proto, const std::string& base_dir,
                         const std::string& where) {
  const std::optional<DType> dtype = dtype_from_onnx(proto.data_type());
  if (!dtype) {
    fail(ErrorCode::kUnsupported, where,
         fmt::format("tensor element type {} is not supported (supported: {})",
                     onnx_type_name(proto.data_type()), supported_onnx_types()));
  }
  if (proto.has_segment()) {
    fail(ErrorCode::kUnsupported, where, "segmented tensors are not supported");
  }
  const std::vector<int64_t> dims(proto.dims().begin(), proto.dims().end());
  const int64_t needed = expected_bytes(dims, *dtype, where);

  if (proto.data_location() == TensorProto::EXTERNAL) {
    const ExternalSpan span =
        locate_external(proto, base_dir, needed, describe(dims, *dtype), where);
    Tensor tensor = allocate(*dtype, dims, where);
    read_external(span, tensor, where);
    normalize_bools(tensor);
    return tensor;
  }
  if (proto.has_raw_data()) {
    if (proto.raw_data().size() != static_cast<uint64_t>(needed)) {
      fail(ErrorCode::kInvalidModel, where,
           fmt::format("raw_data holds {} bytes, but {} needs {}", proto.raw_data().size(),
                       describe(dims, *dtype), needed));
    }
    Tensor tensor = allocate(*dtype, dims, where);
    // ONNX stores raw_data little-endian, the byte order of every CPU this engine targets.
    if (needed > 0) std::memcpy(tensor.raw_data(), proto.raw_data().data(), tensor.nbytes());
    normalize_bools(tensor);
    return tensor;
  }
  const auto [field, count] = typed_field(proto, *dtype);
  const int64_t numel = needed / static_cast<int64_t>(dtype_size(*dtype));
  if (count != numel) {
    fail(ErrorCode::kInvalidModel, where,
         fmt::format("{} holds {} values, but {} needs {}", field, count, describe(dims, *dtype),
                     numel));
  }
  Tensor tensor = allocate(*dtype, dims, where);
  copy_typed_field(proto, tensor, where);
  return tensor;
}

std::string read_whole_file(const std::string& path, const char* what) {
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  if (!fs::exists(status)) {
    throw Error(ErrorCode::kNotFound, fmt::format("{} file '{}' does not exist", what, path));
  }
  if (fs::is_directory(status)) {
    throw Error(ErrorCode::kIoError, fmt::format("'{}' is a directory, not a {} file", path, what));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw Error(ErrorCode::kIoError,
                fmt::format("cannot open {} file '{}': {}", what, path, std::strerror(errno)));
  }
  std::string bytes;
  try {
    const uintmax_t size = fs::file_size(path, ec);
    if (!ec) bytes.reserve(static_cast<std::size_t>(size));
    char chunk[1 << 16];
    while (in.read(chunk, sizeof(chunk)) || in.gcount() > 0) {
      bytes.append(chunk, static_cast<std::size_t>(in.gcount()));
    }
  } catch (const std::exception&) {  // bad_alloc, or length_error from reserve()
    throw Error(ErrorCode::kOutOfMemory,
                fmt::format("{} file '{}' does not fit in memory", what, path));
  }
  if (in.bad()) {
    throw Error(ErrorCode::kIoError, fmt::format("cannot read {} file '{}'", what, path));
  }
  return bytes;
}

Tensor read_tensor_proto_file(const std::string& path, std::string* name) {
  const std::string bytes = read_whole_file(path, "tensor");
  TensorProto proto;
  if (bytes.size() > static_cast<std::size_t>(INT_MAX) ||
      !proto.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    throw Error(ErrorCode::kInvalidModel,
                fmt::format("{}: not a valid TensorProto file (protobuf parse failed)", path));
  }
  if (name != nullptr) *name = proto.name();
  const fs::path folder = fs::path(path).parent_path();
  return tensor_from_proto(proto, folder.empty() ? "." : folder.string(), path);
}

}  // namespace sparsecol::onnx_import
