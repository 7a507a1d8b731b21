// Tensor, Error and the small enums of the public API.
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "sparsecol/sparsecol.h"

namespace sparsecol {

const char* to_string(ErrorCode code) {
  switch (code) {
    case ErrorCode::kInvalidArgument:
      return "invalid argument";
    case ErrorCode::kNotFound:
      return "not found";
    case ErrorCode::kIoError:
      return "I/O error";
    case ErrorCode::kInvalidModel:
      return "invalid model";
    case ErrorCode::kUnsupported:
      return "unsupported";
    case ErrorCode::kShapeMismatch:
      return "shape mismatch";
    case ErrorCode::kDtypeMismatch:
      return "dtype mismatch";
    case ErrorCode::kOutOfMemory:
      return "out of memory";
    case ErrorCode::kInternal:
      return "internal error";
  }
  return "unknown error";
}

Error::Error(ErrorCode code, const std::string& message)
    : std::runtime_error(message), code_(code) {}

const char* to_string(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return "float32";
    case DType::kFloat64:
      return "float64";
    case DType::kInt64:
      return "int64";
    case DType::kInt32:
      return "int32";
    case DType::kInt8:
      return "int8";
    case DType::kUInt8:
      return "uint8";
    case DType::kBool:
      return "bool";
  }
  return "unknown";
}

std::size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::kFloat64:
    case DType::kInt64:
      return 8;
    case DType::kFloat32:
    case DType::kInt32:
      return 4;
    case DType::kInt8:
    case DType::kUInt8:
    case DType::kBool:
      return 1;
  }
  return 1;
}

void throw_dtype_mismatch(DType expected, DType actual) {
  throw Error(ErrorCode::kDtypeMismatch, fmt::format("tensor holds {} elements, accessed as {}",
                                                     to_string(actual), to_string(expected)));
}

int64_t checked_numel(const std::vector<int64_t>& shape) {
  int64_t count = 1;
  for (int64_t d : shape) {
    if (d < 0) {
      throw Error(ErrorCode::kShapeMismatch,
                  fmt::format("negative dimension in shape [{}]", fmt::join(shape, ", ")));
    }
    if (d != 0 && count > std::numeric_limits<int64_t>::max() / d) {
      throw Error(
          ErrorCode::kShapeMismatch,
          fmt::format("element count of shape [{}] overflows 64 bits", fmt::join(shape, ", ")));
    }
    count *= d;
  }
  return count;
}

int64_t Tensor::numel() const {
  int64_t count = 1;
  for (int64_t d : shape_) count *= d;
  return count;
}

Tensor Tensor::zeros(DType dtype, std::vector<int64_t> shape) {
  const int64_t count = checked_numel(shape);
  const std::size_t element = dtype_size(dtype);
  if (static_cast<uint64_t>(count) > std::numeric_limits<std::size_t>::max() / 64 / element) {
    throw Error(ErrorCode::kOutOfMemory,
                fmt::format("tensor of shape [{}] is too large", fmt::join(shape, ", ")));
  }
  // 64-byte alignment: one AVX-512 register, one cache line.
  const std::size_t bytes = (static_cast<std::size_t>(count) * element + 63) / 64 * 64;
  void* memory = std::aligned_alloc(64, bytes == 0 ? 64 : bytes);
  if (memory == nullptr) {
    throw Error(ErrorCode::kOutOfMemory,
                fmt::format("cannot allocate {} bytes for a {} tensor of shape [{}]", bytes,
                            to_string(dtype), fmt::join(shape, ", ")));
  }
  std::memset(memory, 0, bytes == 0 ? 64 : bytes);
  Tensor t;
  t.storage_ = std::shared_ptr<void>(memory, std::free);
  t.data_ = memory;
  t.dtype_ = dtype;
  t.shape_ = std::move(shape);
  return t;
}

Tensor Tensor::view(void* data, DType dtype, std::vector<int64_t> shape) {
  checked_numel(shape);
  Tensor t;
  t.data_ = data;
  t.dtype_ = dtype;
  t.shape_ = std::move(shape);
  return t;
}

Tensor Tensor::clone() const {
  Tensor copy = zeros(dtype_, shape_);
  if (nbytes() > 0) std::memcpy(copy.data_, data_, nbytes());
  return copy;
}

Tensor Tensor::reshaped(std::vector<int64_t> shape) const {
  if (checked_numel(shape) != numel()) {
    throw Error(ErrorCode::kShapeMismatch,
                fmt::format("cannot reshape [{}] ({} elements) to [{}]", fmt::join(shape_, ", "),
                            numel(), fmt::join(shape, ", ")));
  }
  Tensor t = *this;
  t.shape_ = std::move(shape);
  return t;
}

const char* to_string(Schedule schedule) {
  switch (schedule) {
    case Schedule::kReference:
      return "reference";
    case Schedule::kLayerWise:
      return "layerwise";
    case Schedule::kOneDnn:
      return "onednn";
    case Schedule::kDepthWise:
      return "depthwise";
    case Schedule::kCuda:
      return "cuda";
    case Schedule::kCudaSparse:
      return "cuda-sparse";
  }
  return "unknown";
}

Schedule parse_schedule(const std::string& name) {
  constexpr Schedule kAll[] = {Schedule::kReference, Schedule::kLayerWise, Schedule::kOneDnn,
                               Schedule::kDepthWise, Schedule::kCuda,      Schedule::kCudaSparse};
  std::vector<std::string> names;
  for (Schedule s : kAll) {
    if (name == to_string(s)) return s;
    names.push_back(to_string(s));
  }
  throw Error(ErrorCode::kInvalidArgument,
              fmt::format("unknown schedule '{}' (accepted: {})", name, fmt::join(names, ", ")));
}

std::string shape_string(const std::vector<int64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

std::string shape_string(const TensorInfo& info) {
  if (!info.shape_known) return "[unknown shape]";
  std::vector<std::string> dims;
  for (std::size_t i = 0; i < info.shape.size(); ++i) {
    const bool named = i < info.dim_names.size() && !info.dim_names[i].empty();
    dims.push_back(info.shape[i] >= 0 ? std::to_string(info.shape[i])
                                      : (named ? info.dim_names[i] : "?"));
  }
  return fmt::format("[{}]", fmt::join(dims, ", "));
}

}  // namespace sparsecol
