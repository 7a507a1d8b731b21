// Writing files so that readers never see a partial one, and errno as an Error. In the API
// library because every layer that writes a user's file uses it: the tensor files (src/io) and
// the pruned models (importers/onnx).
#pragma once

#include <cstddef>
#include <string>

namespace sparsecol::io {

// A file written under a temporary name in the destination's folder (`path.tmp.<pid>`) and
// renamed over `path` by commit(), so that readers see the old file or the complete new one,
// never a partial one. Destroying it uncommitted removes the temporary file.
class AtomicFile {
 public:
  explicit AtomicFile(std::string path);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  const std::string& temp_path() const { return temp_path_; }
  // Appends to the temporary file, creating it on the first call.
  void append(const void* data, std::size_t size);
  // Flushes the temporary file to disk (it may have been written by someone else, e.g. libzip)
  // and renames it over the destination.
  void commit();

 private:
  void open_temp();

  std::string path_;
  std::string temp_path_;
  int fd_ = -1;
  bool committed_ = false;
};

// Throws Error for a failed system call: kNotFound for ENOENT, else kIoError; with strerror.
[[noreturn]] void throw_errno(int error, const std::string& what);

}  // namespace sparsecol::io
