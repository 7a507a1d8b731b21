#include "input_files.h"

#include <algorithm>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace sparsecol::cli {
namespace {

std::string member_names(const NamedTensors& members) {
  std::vector<std::string> names;
  for (const auto& [name, tensor] : members) names.push_back(name);
  return fmt::format("{}", fmt::join(names, ", "));
}

class Binder {
 public:
  explicit Binder(const std::vector<TensorInfo>& model_inputs) : model_inputs_(model_inputs) {}

  void bind_spec(const std::string& spec) {
    const std::size_t eq = spec.find('=');
    const bool named = eq != std::string::npos;
    const std::string name = named ? spec.substr(0, eq) : std::string();
    const std::string path = named ? spec.substr(eq + 1) : spec;
    if (named && find_tensor(model_inputs_, name) == nullptr) {
      throw Error(ErrorCode::kInvalidArgument,
                  fmt::format("--input {}: the model has no input named '{}' (inputs: {})", spec,
                              name, list_tensors(model_inputs_)));
    }
    if (path.ends_with(".npz")) {
      bind_archive(spec, name, path);
    } else if (path.ends_with(".pb")) {
      std::string stored;
      Tensor tensor = read_tensor_proto(path, &stored);
      // ONNX test data name the input a .pb feeds; an explicit NAME= wins.
      const std::string target =
          named ? name
                : (find_tensor(model_inputs_, stored) != nullptr ? stored : only_input(spec));
      bind(target, InputFile(path, std::move(tensor)));
    } else if (path.ends_with(".npy")) {
      bind(named ? name : only_input(spec), InputFile(path));
    } else {
      throw Error(ErrorCode::kInvalidArgument,
                  fmt::format("--input {}: unknown file type (expected FILE.npy, FILE.npz or "
                              "FILE.pb)",
                              spec));
    }
  }

  std::vector<BoundInput> take(bool require_all) {
    if (require_all) {
      for (const TensorInfo& info : model_inputs_) {
        if (bound(info) == nullptr) {
          throw Error(ErrorCode::kInvalidArgument,
                      fmt::format("no file for model input '{}' (pass --input {}=FILE.npy; "
                                  "inputs: {})",
                                  info.name, info.name, list_tensors(model_inputs_)));
        }
      }
    }
    return std::move(bound_);
  }

 private:
  void bind_archive(const std::string& spec, const std::string& name, const std::string& path) {
    NamedTensors members = read_npz(path);
    const auto take_member = [&](const std::string& input, NamedTensors::iterator member) {
      bind(input, InputFile(fmt::format("{}:{}", path, member->first), std::move(member->second)));
    };
    if (!name.empty()) {
      auto member = members.find(name);
      if (member == members.end() && members.size() == 1) member = members.begin();
      if (member == members.end()) {
        throw Error(ErrorCode::kInvalidArgument,
                    fmt::format("--input {}: the archive has no member '{}' (members: {})", spec,
                                name, member_names(members)));
      }
      take_member(name, member);
      return;
    }
    if (model_inputs_.size() == 1 && members.size() == 1) {
      take_member(model_inputs_.front().name, members.begin());
      return;
    }
    int matched = 0;
    for (const TensorInfo& info : model_inputs_) {
      const auto member = members.find(info.name);
      if (member == members.end()) continue;
      take_member(info.name, member);
      ++matched;
    }
    if (matched == 0) {
      throw Error(ErrorCode::kInvalidArgument,
                  fmt::format("--input {}: no member is named after a model input (members: {}; "
                              "inputs: {}); name one with --input NAME={}",
                              spec, member_names(members), list_tensors(model_inputs_), path));
    }
  }

  std::string only_input(const std::string& spec) const {
    if (model_inputs_.size() == 1) return model_inputs_.front().name;
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("--input {}: the model has {} inputs, name each one with --input "
                            "NAME=FILE (inputs: {})",
                            spec, model_inputs_.size(), list_tensors(model_inputs_)));
  }

  const BoundInput* bound(const TensorInfo& info) const {
    for (const BoundInput& b : bound_) {
      if (b.info == &info) return &b;
    }
    return nullptr;
  }

  void bind(const std::string& name, InputFile file) {
    const TensorInfo* info = find_tensor(model_inputs_, name);
    if (const BoundInput* other = bound(*info)) {
      throw Error(ErrorCode::kInvalidArgument,
                  fmt::format("input '{}' is given twice ({} and {})", name, other->file.where(),
                              file.where()));
    }
    bound_.push_back({info, std::move(file)});
  }

  const std::vector<TensorInfo>& model_inputs_;
  std::vector<BoundInput> bound_;
};

}  // namespace

InputFile::InputFile(const std::string& path)
    : where_(path), mapped_(std::make_unique<NpyReader>(path)) {}

InputFile::InputFile(std::string where, Tensor tensor)
    : where_(std::move(where)), whole_(std::move(tensor)) {
  if (whole_.rank() == 0) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("{}: holds a scalar (shape ()), which has no sample axis", where_));
  }
}

DType InputFile::dtype() const { return mapped_ ? mapped_->dtype() : whole_.dtype(); }

const std::vector<int64_t>& InputFile::shape() const {
  return mapped_ ? mapped_->shape() : whole_.shape();
}

Tensor InputFile::samples_view(int64_t begin, int64_t count) const {
  if (mapped_) return mapped_->samples_view(begin, count);
  if (begin < 0 || count < 0 || begin > samples() || count > samples() - begin) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("{}: samples [{}, {}) are outside its {} samples", where_, begin,
                            begin + count, samples()));
  }
  const std::size_t sample_bytes = whole_.nbytes() / static_cast<std::size_t>(samples());
  std::vector<int64_t> shape = whole_.shape();
  shape[0] = count;
  char* data = static_cast<char*>(const_cast<void*>(whole_.raw_data()));
  return Tensor::view(data + static_cast<std::size_t>(begin) * sample_bytes, whole_.dtype(),
                      std::move(shape));
}

std::vector<BoundInput> bind_inputs(const std::vector<TensorInfo>& model_inputs,
                                    const std::vector<std::string>& specs, bool require_all) {
  Binder binder(model_inputs);
  for (const std::string& spec : specs) binder.bind_spec(spec);
  return binder.take(require_all);
}

void check_input_fits(const BoundInput& input) {
  const TensorInfo& info = *input.info;
  const std::string where = fmt::format("input '{}' ({})", info.name, input.file.where());
  if (input.file.dtype() != info.dtype) {
    throw Error(ErrorCode::kDtypeMismatch,
                fmt::format("{}: the model expects dtype {}, the file holds {}", where,
                            to_string(info.dtype), to_string(input.file.dtype())));
  }
  if (!info.shape_known) return;
  const std::vector<int64_t>& shape = input.file.shape();
  bool fits = shape.size() == info.shape.size();
  for (std::size_t axis = 1; fits && axis < shape.size(); ++axis) {
    fits = info.shape[axis] < 0 || info.shape[axis] == shape[axis];
  }
  if (!fits) {
    throw Error(ErrorCode::kShapeMismatch,
                fmt::format("{}: the file's shape {} does not fit the model's {} (axis 0 is the "
                            "sample axis)",
                            where, shape_string(shape), shape_string(info)));
  }
}

std::string list_tensors(const std::vector<TensorInfo>& infos) {
  std::vector<std::string> items;
  items.reserve(infos.size());
  for (const TensorInfo& info : infos) {
    items.push_back(
        fmt::format("{} ({} {})", info.name, to_string(info.dtype), shape_string(info)));
  }
  return fmt::format("{}", fmt::join(items, ", "));
}

const TensorInfo* find_tensor(const std::vector<TensorInfo>& infos, const std::string& name) {
  for (const TensorInfo& info : infos) {
    if (info.name == name) return &info;
  }
  return nullptr;
}

}  // namespace sparsecol::cli
