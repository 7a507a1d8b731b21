// libFuzzer target: arbitrary bytes as each tensor file format sparsecol reads — a .npy file
// (whole-file read and the memory-mapped NpyReader with its sample slices), an ONNX TensorProto
// .pb, and an .npz archive. The only exception allowed out is sparsecol::Error.
//
// The .npy and .npz readers take a path, so the bytes go to an in-memory file (memfd) opened
// through /proc/self/fd: no disk traffic, no temporary files left behind by a crash. The
// TensorProto is parsed and converted in memory (tensor_from_proto, as read_tensor_proto_file
// does after reading the file).
#include <sys/mman.h>
#include <unistd.h>

#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include <onnx/onnx_pb.h>

#include "onnx/tensor_proto.h"
#include "sparsecol/io.h"
#include "sparsecol/sparsecol.h"

namespace {

// One in-memory file for the whole fuzzing session, rewritten for every input.
class MemoryFile {
 public:
  MemoryFile() : fd_(::memfd_create("sparsecol_fuzz", 0)) {
    if (fd_ < 0) std::abort();
    path_ = "/proc/self/fd/" + std::to_string(fd_);
  }
  const std::string& write(const uint8_t* data, std::size_t size) {
    if (::ftruncate(fd_, 0) != 0) std::abort();
    std::size_t done = 0;
    while (done < size) {
      const ssize_t n = ::pwrite(fd_, data + done, size - done, static_cast<off_t>(done));
      if (n <= 0) std::abort();
      done += static_cast<std::size_t>(n);
    }
    return path_;
  }

 private:
  int fd_;
  std::string path_;
};

// Reads every value so that a view into unmapped or uninitialized memory is noticed.
uint64_t touch(const sparsecol::Tensor& tensor) {
  const auto* bytes = static_cast<const unsigned char*>(tensor.raw_data());
  uint64_t sum = 0;
  for (std::size_t i = 0; i < tensor.nbytes(); ++i) sum += bytes[i];
  return sum;
}

template <typename Fn>
void refused_or_read(Fn&& fn) {
  try {
    fn();
  } catch (const sparsecol::Error&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  static MemoryFile file;
  static volatile uint64_t sink = 0;
  const std::string& path = file.write(data, size);

  refused_or_read([&] { sink = sink + touch(sparsecol::read_npy(path)); });
  refused_or_read([&] {
    const sparsecol::NpyReader reader(path);
    const int64_t samples = reader.samples();
    // The first sample, the last two, and a range running past the end (refused).
    if (samples > 0) sink = sink + touch(reader.samples_view(0, 1));
    if (samples > 1) sink = sink + touch(reader.samples_view(samples - 2, 2));
    sink = sink + touch(reader.samples_view(samples, 1));
  });
  refused_or_read([&] {
    for (const auto& [name, tensor] : sparsecol::read_npz(path)) sink = sink + touch(tensor);
  });
  refused_or_read([&] {
    onnx::TensorProto proto;
    if (size > static_cast<std::size_t>(INT_MAX) ||
        !proto.ParseFromArray(data, static_cast<int>(size))) {
      return;
    }
    // No folder: external data must be refused, never looked up.
    sink = sink + touch(sparsecol::onnx_import::tensor_from_proto(proto, "", "fuzz.pb"));
  });
  return 0;
}
