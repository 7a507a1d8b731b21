// Reading and writing tensors in the formats users bring: NumPy .npy/.npz and ONNX TensorProto
// .pb files (as in ONNX test data). Standard library only, like sparsecol.h.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "sparsecol/sparsecol.h"

namespace sparsecol {

// Reads a whole .npy file (C order; float32, float64, int64, int32, int8, uint8, bool) into an
// owning Tensor. Throws Error naming the file: kNotFound, kIoError, kInvalidArgument for a
// malformed or truncated file, kUnsupported for a dtype or Fortran order it does not read.
Tensor read_npy(const std::string& path);
// Writes `tensor` as .npy, atomically: to `path.tmp.<pid>` in the same folder, flushed to disk
// and renamed over `path` on success, removed on failure.
void write_npy(const std::string& path, const Tensor& tensor);

// .npz archives (zip of .npy members, read with libzip); member names without ".npy".
NamedTensors read_npz(const std::string& path);
void write_npz(const std::string& path, const NamedTensors& tensors);  // atomic, like write_npy

// A serialized ONNX TensorProto (.pb). `name` receives the tensor's name when not null.
Tensor read_tensor_proto(const std::string& path, std::string* name = nullptr);

// Dispatches on the extension: .npy, .pb.
Tensor read_tensor_file(const std::string& path);

// A .npy file opened by memory map, read in slices along the first (sample) axis so that
// scoring a file far larger than memory keeps memory flat.
class NpyReader {
 public:
  explicit NpyReader(const std::string& path);  // validates the header and the file size
  ~NpyReader();
  NpyReader(const NpyReader&) = delete;
  NpyReader& operator=(const NpyReader&) = delete;

  DType dtype() const;
  const std::vector<int64_t>& shape() const;
  int64_t samples() const;  // shape()[0]
  // A view of samples [begin, begin + count) valid while the reader lives. The memory is mapped
  // read-only: do not write through the view. (A hand-made file whose data are not aligned to
  // the element size yields an owning copy instead.) Throws Error(kInvalidArgument) for a range
  // outside the file, or for bool bytes other than 0 and 1 in the range.
  Tensor samples_view(int64_t begin, int64_t count) const;
  // Says that samples before `sample` will not be read again, so that their pages leave the
  // process's memory: a front-to-back scan then keeps memory flat however large the file.
  // Views of those samples must no longer be used (reading them again maps the file anew).
  void release_before(int64_t sample) const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace sparsecol
