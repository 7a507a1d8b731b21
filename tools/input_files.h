// The `--input` files of `run` and `bench`: which model input each feeds, and its samples.
//
//   --input FILE            a model with one input; or FILE.npz whose members are named after the
//                           model's inputs (one archive for all of them); or FILE.pb that
//                           names its input (ONNX test data do)
//   --input NAME=FILE.npy   the model input NAME (repeatable); for FILE.npz the member NAME, or
//                           the archive's only member
//
// A .npy is memory-mapped and read in slices, so memory stays flat however many samples it
// holds; a .npz member or a TensorProto .pb is read whole (neither format can be sliced in place:
// npz members may be compressed, protobuf is not laid out by sample).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "sparsecol/io.h"
#include "sparsecol/sparsecol.h"

namespace sparsecol::cli {

// One model input's data; axis 0 is the sample axis.
class InputFile {
 public:
  // A .npy, memory-mapped.
  explicit InputFile(const std::string& path);
  // A tensor already read (a .npz member, a .pb); `where` names it in messages.
  InputFile(std::string where, Tensor tensor);

  const std::string& where() const { return where_; }
  DType dtype() const;
  const std::vector<int64_t>& shape() const;
  int64_t samples() const { return shape().front(); }
  // Samples [begin, begin + count): a view valid while this InputFile lives; do not write to it.
  Tensor samples_view(int64_t begin, int64_t count) const;
  // Samples before `sample` will not be read again: a mapped .npy drops their pages, so a scan
  // keeps memory flat (NpyReader::release_before); a tensor read whole keeps them.
  void release_before(int64_t sample) const {
    if (mapped_) mapped_->release_before(sample);
  }

 private:
  std::string where_;
  std::unique_ptr<NpyReader> mapped_;
  Tensor whole_;
};

struct BoundInput {
  const TensorInfo* info;  // the model input it feeds (points into the Engine's inputs())
  InputFile file;
};

// Maps every --input spec to model inputs (see the top of this file). Throws
// Error(kInvalidArgument) for an unknown name, an input given twice, an unnamed file a model with
// several inputs cannot place, and, with `require_all`, a model input left without a file.
std::vector<BoundInput> bind_inputs(const std::vector<TensorInfo>& model_inputs,
                                    const std::vector<std::string>& specs, bool require_all);

// Checks an input file's dtype and per-sample shape against the model's (axis 0 free): Error
// kDtypeMismatch / kShapeMismatch naming the input, the file and both sides.
void check_input_fits(const BoundInput& input);

// "x (float32 [N, 8]), z (float32 [N, 4])": the tensors a message offers to choose from.
std::string list_tensors(const std::vector<TensorInfo>& infos);
const TensorInfo* find_tensor(const std::vector<TensorInfo>& infos, const std::string& name);

}  // namespace sparsecol::cli
