// NumPy .npz archives: a zip of .npy members, read (stored or deflated) and written (stored)
// with libzip.
#include <zip.h>

#include <memory>

#include <fmt/format.h>

#include "io/npy_format.h"
#include "sparsecol/io.h"

namespace sparsecol {
namespace {

constexpr std::string_view kMemberSuffix = ".npy";

struct ZipDiscard {
  void operator()(zip_t* archive) const { zip_discard(archive); }
};
using ZipArchive = std::unique_ptr<zip_t, ZipDiscard>;

struct ZipFileClose {
  void operator()(zip_file_t* file) const { zip_fclose(file); }
};
using ZipMember = std::unique_ptr<zip_file_t, ZipFileClose>;

ZipArchive open_archive(const std::string& path, int flags) {
  int code = 0;
  zip_t* archive = zip_open(path.c_str(), flags, &code);
  if (archive != nullptr) return ZipArchive(archive);
  zip_error_t error;
  zip_error_init_with_code(&error, code);
  const std::string reason = zip_error_strerror(&error);
  zip_error_fini(&error);
  const ErrorCode kind = code == ZIP_ER_NOENT ? ErrorCode::kNotFound
                         : code == ZIP_ER_NOZIP || code == ZIP_ER_INCONS
                             ? ErrorCode::kInvalidArgument
                             : ErrorCode::kIoError;
  throw Error(kind, fmt::format("cannot open '{}' as a .npz archive: {}", path, reason));
}

// Reads exactly `size` bytes of a member; a short read means the archive lies about the size.
void read_member(zip_file_t* member, void* dst, uint64_t size, const std::string& what) {
  auto* out = static_cast<char*>(dst);
  while (size > 0) {
    const zip_int64_t got = zip_fread(member, out, size);
    if (got < 0) {
      throw Error(ErrorCode::kInvalidArgument,
                  fmt::format("{}: cannot read member: {}", what,
                              zip_error_strerror(zip_file_get_error(member))));
    }
    if (got == 0) {
      throw Error(ErrorCode::kInvalidArgument,
                  fmt::format("{}: member is shorter than its stated size", what));
    }
    out += got;
    size -= static_cast<uint64_t>(got);
  }
}

Tensor read_npy_member(zip_t* archive, zip_uint64_t index, uint64_t size, const std::string& what) {
  ZipMember member(zip_fopen_index(archive, index, 0));
  if (member == nullptr) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("{}: cannot open member: {}", what, zip_strerror(archive)));
  }
  // Members may be deflated, so the header is read front to back: the preamble gives the
  // header length, the header the data size, checked against the stated size before allocating.
  std::string header(std::min<uint64_t>(size, io::kNpyPreambleBytes), '\0');
  read_member(member.get(), header.data(), header.size(), what);
  const std::size_t offset = io::npy_data_offset(header, size, what);
  const std::size_t have = header.size();
  header.resize(offset);
  read_member(member.get(), header.data() + have, offset - have, what);
  const io::NpyHeader parsed = io::parse_npy_header(header, size, what);
  Tensor tensor = Tensor::zeros(parsed.dtype, parsed.shape);
  read_member(member.get(), tensor.raw_data(), parsed.data_bytes, what);
  char extra = 0;
  if (zip_fread(member.get(), &extra, 1) != 0) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("{}: member is longer than its stated size", what));
  }
  // Closing checks the CRC of the member.
  if (const int status = zip_fclose(member.release()); status != 0) {
    zip_error_t error;
    zip_error_init_with_code(&error, status);
    const std::string reason = zip_error_strerror(&error);
    zip_error_fini(&error);
    throw Error(ErrorCode::kInvalidArgument, fmt::format("{}: corrupt member: {}", what, reason));
  }
  if (parsed.dtype == DType::kBool) io::check_bool_bytes(tensor.raw_data(), tensor.nbytes(), what);
  return tensor;
}

}  // namespace

NamedTensors read_npz(const std::string& path) {
  ZipArchive archive = open_archive(path, ZIP_RDONLY | ZIP_CHECKCONS);
  NamedTensors tensors;
  const zip_int64_t count = zip_get_num_entries(archive.get(), 0);
  for (zip_int64_t i = 0; i < count; ++i) {
    const auto index = static_cast<zip_uint64_t>(i);
    zip_stat_t stat;
    zip_stat_init(&stat);
    if (zip_stat_index(archive.get(), index, 0, &stat) != 0 ||
        (stat.valid & (ZIP_STAT_NAME | ZIP_STAT_SIZE)) != (ZIP_STAT_NAME | ZIP_STAT_SIZE)) {
      throw Error(ErrorCode::kInvalidArgument, fmt::format("{}: cannot read member {}: {}", path, i,
                                                           zip_strerror(archive.get())));
    }
    const std::string member = stat.name;
    const std::string what = fmt::format("{}:{}", path, member);
    if (!member.ends_with(kMemberSuffix) || member.size() == kMemberSuffix.size()) {
      throw Error(
          ErrorCode::kInvalidArgument,
          fmt::format("{}: member is not a .npy file (an .npz holds only name.npy members)", what));
    }
    const std::string name = member.substr(0, member.size() - kMemberSuffix.size());
    if (tensors.count(name) != 0) {
      throw Error(ErrorCode::kInvalidArgument, fmt::format("{}: member appears twice", what));
    }
    tensors.emplace(name, read_npy_member(archive.get(), index, stat.size, what));
  }
  return tensors;
}

void write_npz(const std::string& path, const NamedTensors& tensors) {
  for (const auto& [name, tensor] : tensors)
    io::check_has_data(tensor, fmt::format("{}:{}", path, name));
  io::AtomicFile file(path);
  if (tensors.empty()) {
    // libzip writes no file at all for an empty archive; numpy writes the bare end-of-central-
    // directory record (signature "PK\5\6" and 18 zero bytes), and so do we.
    const char empty_zip[22] = {'P', 'K', 5, 6};
    file.append(empty_zip, sizeof(empty_zip));
    file.commit();
    return;
  }
  // libzip writes the archive to its own temporary name and renames it to file.temp_path() on
  // zip_close; commit() then makes it durable and moves it into place.
  ZipArchive archive = open_archive(file.temp_path(), ZIP_CREATE | ZIP_TRUNCATE);
  std::vector<std::string> headers;
  headers.reserve(tensors.size());  // the sources point into these strings until zip_close
  for (const auto& [name, tensor] : tensors) {
    if (name.empty()) {
      throw Error(ErrorCode::kInvalidArgument, fmt::format("{}: a tensor has an empty name", path));
    }
    const std::string& header =
        headers.emplace_back(io::format_npy_header(tensor.dtype(), tensor.shape()));
    const zip_buffer_fragment_t fragments[2] = {
        {reinterpret_cast<zip_uint8_t*>(const_cast<char*>(header.data())), header.size()},
        {static_cast<zip_uint8_t*>(const_cast<void*>(tensor.raw_data())), tensor.nbytes()},
    };
    zip_error_t error;
    zip_error_init(&error);
    zip_source_t* source =
        zip_source_buffer_fragment_create(fragments, tensor.nbytes() > 0 ? 2 : 1, 0, &error);
    if (source == nullptr) {
      const std::string reason = zip_error_strerror(&error);
      zip_error_fini(&error);
      throw Error(ErrorCode::kOutOfMemory, fmt::format("cannot write '{}': {}", path, reason));
    }
    const std::string member = name + std::string(kMemberSuffix);
    const zip_int64_t index = zip_file_add(archive.get(), member.c_str(), source, ZIP_FL_ENC_UTF_8);
    if (index < 0) {
      zip_source_free(source);
      throw Error(ErrorCode::kIoError, fmt::format("cannot write '{}': member '{}': {}", path,
                                                   member, zip_strerror(archive.get())));
    }
    // Stored, like numpy.savez: scoring outputs are floats that barely compress, and stored
    // members can be memory-mapped by readers.
    if (zip_set_file_compression(archive.get(), static_cast<zip_uint64_t>(index), ZIP_CM_STORE,
                                 0) != 0) {
      throw Error(ErrorCode::kIoError,
                  fmt::format("cannot write '{}': {}", path, zip_strerror(archive.get())));
    }
  }
  if (zip_close(archive.get()) != 0) {
    throw Error(ErrorCode::kIoError,
                fmt::format("cannot write '{}': {}", path, zip_strerror(archive.get())));
  }
  static_cast<void>(archive.release());  // zip_close freed it
  file.commit();
}

}  // namespace sparsecol
