// Internals shared by the .npy and .npz code: the .npy header (parse and format) and the
// write-to-temporary-then-rename file that makes every write atomic.
//
// The .npy format: https://numpy.org/doc/stable/reference/generated/numpy.lib.format.html
//   "\x93NUMPY" | major | minor | header length (uint16 LE for 1.0, uint32 LE for 2.0/3.0) |
//   a Python dict literal {'descr': ..., 'fortran_order': ..., 'shape': (...), } padded with
//   spaces and ended by '\n' | the raw C-ordered data.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "api/atomic_file.h"
#include "sparsecol/sparsecol.h"

namespace sparsecol::io {

// Bytes a reader needs to know the header length: magic (6), version (2), length (up to 4).
inline constexpr std::size_t kNpyPreambleBytes = 12;

struct NpyHeader {
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;
  std::size_t data_offset = 0;  // bytes before the data: preamble + header dict
  uint64_t data_bytes = 0;      // numel * itemsize
};

// Validates magic and version in `prefix` (the first min(total, kNpyPreambleBytes) bytes) and
// returns the data offset, checked to lie within `total` bytes. `what` names the file in errors.
std::size_t npy_data_offset(std::string_view prefix, uint64_t total, const std::string& what);

// Parses the header (`header` holds the first data_offset bytes) and checks that `total`, the
// size of the whole file, is exactly data_offset + data_bytes. Throws Error naming `what`.
NpyHeader parse_npy_header(std::string_view header, uint64_t total, const std::string& what);

// The header (preamble and dict) for a C-ordered array; format 1.0 unless the dict needs 2.0.
std::string format_npy_header(DType dtype, const std::vector<int64_t>& shape);

// Refuses a tensor without storage (a default-constructed one) before anything is written.
void check_has_data(const Tensor& tensor, const std::string& what);

// numpy stores bools as bytes 0/1; any other byte would be undefined behaviour as a C++ bool.
void check_bool_bytes(const void* data, std::size_t count, const std::string& what);

}  // namespace sparsecol::io
