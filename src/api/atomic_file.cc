#include "api/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <system_error>
#include <utility>

#include <fmt/format.h>

#include "sparsecol/sparsecol.h"

namespace sparsecol::io {

void throw_errno(int error, const std::string& what) {
  throw Error(error == ENOENT ? ErrorCode::kNotFound : ErrorCode::kIoError,
              fmt::format("{}: {}", what, std::generic_category().message(error)));
}

AtomicFile::AtomicFile(std::string path)
    : path_(std::move(path)), temp_path_(fmt::format("{}.tmp.{}", path_, ::getpid())) {}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(temp_path_.c_str());
}

void AtomicFile::open_temp() {
  fd_ = ::open(temp_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
  if (fd_ < 0) throw_errno(errno, fmt::format("cannot write '{}'", path_));
}

void AtomicFile::append(const void* data, std::size_t size) {
  if (fd_ < 0) open_temp();
  const auto* in = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t done = ::write(fd_, in, std::min<std::size_t>(size, 1u << 30));
    if (done < 0 && errno == EINTR) continue;
    if (done < 0) throw_errno(errno, fmt::format("cannot write '{}'", path_));
    in += done;
    size -= static_cast<std::size_t>(done);
  }
}

void AtomicFile::commit() {
  if (fd_ < 0) {
    fd_ = ::open(temp_path_.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) throw_errno(errno, fmt::format("cannot write '{}'", path_));
  }
  // Without the fsync a crash after the rename could leave an empty file under the final name.
  if (::fsync(fd_) != 0) throw_errno(errno, fmt::format("cannot write '{}'", path_));
  const int fd = std::exchange(fd_, -1);
  if (::close(fd) != 0) throw_errno(errno, fmt::format("cannot write '{}'", path_));
  if (::rename(temp_path_.c_str(), path_.c_str()) != 0) {
    throw_errno(errno, fmt::format("cannot rename '{}' to '{}'", temp_path_, path_));
  }
  committed_ = true;
  // Make the rename itself durable; best effort, the data are complete either way.
  const std::size_t slash = path_.rfind('/');
  const std::string folder = slash == std::string::npos ? "." : path_.substr(0, slash + 1);
  const int dir = ::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir >= 0) {
    ::fsync(dir);
    ::close(dir);
  }
}

}  // namespace sparsecol::io
