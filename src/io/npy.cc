// NumPy .npy files: strict header parsing, whole-file reads, memory-mapped slices, atomic writes.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <limits>
#include <string_view>
#include <system_error>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "io/npy_format.h"
#include "sparsecol/io.h"

// .npy data are stored in the byte order the header names; we read '<' (little-endian) data
// by plain copies and views, which is only right on a little-endian host.
static_assert(std::endian::native == std::endian::little, "sparsecol assumes a little-endian host");

namespace sparsecol::io {
namespace {

constexpr std::string_view kMagic = "\x93NUMPY";

// numpy's dtype strings for the types we read. One-byte types have no byte order ('|').
struct DescrEntry {
  std::string_view descr;
  DType dtype;
};
constexpr DescrEntry kDescrs[] = {
    {"<f4", DType::kFloat32}, {"<f8", DType::kFloat64}, {"<i8", DType::kInt64},
    {"<i4", DType::kInt32},   {"|i1", DType::kInt8},    {"|u1", DType::kUInt8},
    {"|b1", DType::kBool},
};

std::string_view descr_of(DType dtype) {
  for (const DescrEntry& entry : kDescrs) {
    if (entry.dtype == dtype) return entry.descr;
  }
  throw Error(ErrorCode::kInternal, fmt::format("no .npy descr for {}", to_string(dtype)));
}

std::string shape_string(const std::vector<int64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

// A recursive-descent parser for the one dict literal numpy writes. It accepts Python literal
// syntax for exactly the keys and value kinds the format defines and rejects everything else,
// because a lenient parser would read a malformed header as some other array.
class HeaderParser {
 public:
  HeaderParser(std::string_view text, const std::string& what) : text_(text), what_(what) {}

  NpyHeader parse() {
    NpyHeader header;
    bool have_descr = false, have_order = false, have_shape = false;
    expect('{');
    while (true) {
      skip_space();
      if (peek() == '}') break;
      const std::string key = parse_string();
      expect(':');
      if (key == "descr") {
        once(have_descr, key);
        header.dtype = parse_descr();
      } else if (key == "fortran_order") {
        once(have_order, key);
        if (parse_bool()) {
          throw Error(ErrorCode::kUnsupported,
                      fmt::format("{}: Fortran-ordered .npy arrays are not supported; save a "
                                  "C-ordered array (numpy.ascontiguousarray)",
                                  what_));
        }
      } else if (key == "shape") {
        once(have_shape, key);
        header.shape = parse_shape();
      } else {
        fail(fmt::format("unknown key '{}'", key));
      }
      skip_space();
      if (peek() != ',') break;
      ++pos_;
    }
    expect('}');
    // Padding: spaces, then the one newline that ends every header.
    while (pos_ < text_.size() && text_[pos_] == ' ') ++pos_;
    if (pos_ + 1 != text_.size() || text_[pos_] != '\n') {
      fail("the header does not end with spaces and a newline after the dict");
    }
    if (!have_descr || !have_order || !have_shape) {
      fail("the header must have the keys 'descr', 'fortran_order' and 'shape'");
    }
    return header;
  }

 private:
  [[noreturn]] void fail(const std::string& message) const {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("{}: malformed .npy header: {} (header: {:?})", what_, message,
                            std::string(text_.substr(0, 200))));
  }

  void skip_space() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\t')) ++pos_;
  }
  char peek() const { return pos_ < text_.size() ? text_[pos_] : '\0'; }
  void expect(char c) {
    skip_space();
    if (peek() != c) fail(fmt::format("expected '{}' at offset {}", c, pos_));
    ++pos_;
  }
  void once(bool& seen, const std::string& key) {
    if (seen) fail(fmt::format("key '{}' appears twice", key));
    seen = true;
  }

  std::string parse_string() {
    skip_space();
    const char quote = peek();
    if (quote != '\'' && quote != '"') fail(fmt::format("expected a string at offset {}", pos_));
    const std::size_t end = text_.find(quote, pos_ + 1);
    if (end == std::string_view::npos) fail("unterminated string");
    std::string value(text_.substr(pos_ + 1, end - pos_ - 1));
    if (value.find('\\') != std::string::npos) fail("escapes in strings are not supported");
    pos_ = end + 1;
    return value;
  }

  DType parse_descr() {
    skip_space();
    if (peek() == '[') {
      throw Error(ErrorCode::kUnsupported,
                  fmt::format("{}: structured .npy arrays are not supported", what_));
    }
    const std::string descr = parse_string();
    for (const DescrEntry& entry : kDescrs) {
      if (entry.descr == descr) return entry.dtype;
    }
    if (descr.size() == 3 && descr[0] == '>') {
      throw Error(ErrorCode::kUnsupported,
                  fmt::format("{}: big-endian .npy data ('{}') are not supported; save with "
                              "array.astype(array.dtype.newbyteorder('<'))",
                              what_, descr));
    }
    throw Error(ErrorCode::kUnsupported,
                fmt::format("{}: .npy dtype '{}' is not supported (supported: float32 '<f4', "
                            "float64 '<f8', int64 '<i8', int32 '<i4', int8 '|i1', uint8 '|u1', "
                            "bool '|b1')",
                            what_, descr));
  }

  bool parse_bool() {
    skip_space();
    for (const auto& [word, value] : {std::pair{"True", true}, std::pair{"False", false}}) {
      if (text_.substr(pos_).starts_with(word)) {
        pos_ += std::strlen(word);
        return value;
      }
    }
    fail(fmt::format("expected True or False at offset {}", pos_));
  }

  int64_t parse_dim() {
    skip_space();
    if (peek() < '0' || peek() > '9') fail(fmt::format("expected a dimension at offset {}", pos_));
    int64_t value = 0;
    while (peek() >= '0' && peek() <= '9') {
      const int digit = text_[pos_++] - '0';
      if (value > (std::numeric_limits<int64_t>::max() - digit) / 10) fail("dimension overflows");
      value = value * 10 + digit;
    }
    return value;
  }

  // A Python tuple of ints: (), (n,), (a, b) or (a, b,).
  std::vector<int64_t> parse_shape() {
    expect('(');
    std::vector<int64_t> shape;
    skip_space();
    if (peek() == ')') {
      ++pos_;
      return shape;
    }
    while (true) {
      shape.push_back(parse_dim());
      skip_space();
      if (peek() == ')') {
        // "(n)" is an int in Python, not a tuple.
        if (shape.size() == 1) fail("a one-dimensional shape must be written (n,)");
        ++pos_;
        return shape;
      }
      expect(',');
      skip_space();
      if (peek() == ')') {
        ++pos_;
        return shape;
      }
    }
  }

  std::string_view text_;
  const std::string& what_;
  std::size_t pos_ = 0;
};

std::size_t preamble_size(uint8_t major) { return major == 1 ? 10 : 12; }

// An open file for reading, closed on scope exit.
class InputFile {
 public:
  explicit InputFile(const std::string& path) : path_(path) {
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) throw_errno(errno, fmt::format("cannot open '{}'", path));
    struct stat info {};
    if (::fstat(fd_, &info) != 0) throw_errno(errno, fmt::format("cannot stat '{}'", path));
    if (!S_ISREG(info.st_mode)) {
      throw Error(ErrorCode::kIoError, fmt::format("'{}' is not a regular file", path));
    }
    size_ = static_cast<uint64_t>(info.st_size);
  }
  ~InputFile() {
    if (fd_ >= 0) ::close(fd_);
  }
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;

  int fd() const { return fd_; }
  uint64_t size() const { return size_; }

  void read_at(uint64_t offset, void* dst, uint64_t size) const {
    auto* out = static_cast<char*>(dst);
    while (size > 0) {
      // pread moves at most 0x7ffff000 bytes per call on Linux.
      const std::size_t chunk = static_cast<std::size_t>(std::min<uint64_t>(size, 1u << 30));
      const ssize_t got = ::pread(fd_, out, chunk, static_cast<off_t>(offset));
      if (got < 0 && errno == EINTR) continue;
      if (got < 0) throw_errno(errno, fmt::format("cannot read '{}'", path_));
      if (got == 0) {
        throw Error(ErrorCode::kIoError, fmt::format("'{}' shrank while it was being read", path_));
      }
      out += got;
      offset += static_cast<uint64_t>(got);
      size -= static_cast<uint64_t>(got);
    }
  }

 private:
  std::string path_;
  int fd_ = -1;
  uint64_t size_ = 0;
};

}  // namespace

std::size_t npy_data_offset(std::string_view prefix, uint64_t total, const std::string& what) {
  if (!prefix.starts_with(kMagic.substr(0, std::min(prefix.size(), kMagic.size())))) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("{}: not a .npy file (it does not start with \"\\x93NUMPY\")", what));
  }
  if (total < 8) {
    throw Error(
        ErrorCode::kInvalidArgument,
        fmt::format("{}: truncated .npy file: {} bytes, too short for a header", what, total));
  }
  const auto major = static_cast<uint8_t>(prefix[6]);
  const auto minor = static_cast<uint8_t>(prefix[7]);
  if (major < 1 || major > 3 || minor != 0) {
    throw Error(ErrorCode::kUnsupported,
                fmt::format("{}: .npy format version {}.{} is not supported (1.0, 2.0, 3.0 are)",
                            what, major, minor));
  }
  const std::size_t preamble = preamble_size(major);
  if (total < preamble) {
    throw Error(
        ErrorCode::kInvalidArgument,
        fmt::format("{}: truncated .npy file: {} bytes, too short for a header", what, total));
  }
  uint64_t header_length = 0;
  for (std::size_t i = preamble; i-- > 8;) {
    header_length = header_length << 8 | static_cast<uint8_t>(prefix[i]);
  }
  const uint64_t offset = preamble + header_length;
  if (offset > total) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("{}: truncated .npy file: the header claims {} bytes but the file has "
                            "only {}",
                            what, offset, total));
  }
  return static_cast<std::size_t>(offset);
}

NpyHeader parse_npy_header(std::string_view header, uint64_t total, const std::string& what) {
  const std::size_t preamble = preamble_size(static_cast<uint8_t>(header[6]));
  NpyHeader result = HeaderParser(header.substr(preamble), what).parse();
  result.data_offset = header.size();
  int64_t numel = 0;
  try {
    numel = checked_numel(result.shape);
  } catch (const Error& e) {
    throw Error(ErrorCode::kInvalidArgument, fmt::format("{}: {}", what, e.what()));
  }
  const uint64_t item = dtype_size(result.dtype);
  const uint64_t max_data = std::numeric_limits<uint64_t>::max() - result.data_offset;
  if (static_cast<uint64_t>(numel) > max_data / item) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("{}: shape {} is too large", what, shape_string(result.shape)));
  }
  result.data_bytes = static_cast<uint64_t>(numel) * item;
  const uint64_t expected = result.data_offset + result.data_bytes;
  if (total != expected) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("{}: {} .npy file: a {} array of shape {} needs {} bytes ({}-byte "
                            "header + {} data bytes) but the file has {}",
                            what, total < expected ? "truncated" : "oversized",
                            to_string(result.dtype), shape_string(result.shape), expected,
                            result.data_offset, result.data_bytes, total));
  }
  return result;
}

std::string format_npy_header(DType dtype, const std::vector<int64_t>& shape) {
  std::string dims;
  for (int64_t d : shape) dims += fmt::format("{}, ", d);
  // Python's tuple repr: "()", "(3,)", "(2, 3)".
  if (shape.size() > 1) dims.resize(dims.size() - 2);
  if (shape.size() == 1) dims.pop_back();
  std::string dict = fmt::format("{{'descr': '{}', 'fortran_order': False, 'shape': ({}), }}",
                                 descr_of(dtype), dims);
  // numpy pads the header with spaces so that the data start 64-byte aligned (aligned loads
  // straight from a memory map), and uses format 2.0 only when the dict outgrows uint16.
  const bool v1 = dict.size() + 10 + 64 < 65536;
  const std::size_t preamble = v1 ? 10 : 12;
  const std::size_t unpadded = preamble + dict.size() + 1;
  dict.append((64 - unpadded % 64) % 64, ' ');
  dict.push_back('\n');
  std::string result(kMagic);
  result.push_back(static_cast<char>(v1 ? 1 : 2));
  result.push_back('\0');
  const uint64_t length = dict.size();
  for (std::size_t i = 0; i < preamble - 8; ++i)
    result.push_back(static_cast<char>(length >> (8 * i)));
  return result + dict;
}

void check_has_data(const Tensor& tensor, const std::string& what) {
  if (tensor.raw_data() == nullptr && tensor.nbytes() > 0) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("{}: the tensor to write has no data", what));
  }
}

void check_bool_bytes(const void* data, std::size_t count, const std::string& what) {
  const auto* bytes = static_cast<const uint8_t*>(data);
  const auto* bad = std::find_if(bytes, bytes + count, [](uint8_t b) { return b > 1; });
  if (bad != bytes + count) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("{}: bool element {} holds byte {} (expected 0 or 1)", what,
                            bad - bytes, *bad));
  }
}

}  // namespace sparsecol::io

namespace sparsecol {

Tensor read_npy(const std::string& path) {
  const io::InputFile file(path);
  std::string prefix(std::min<uint64_t>(file.size(), io::kNpyPreambleBytes), '\0');
  file.read_at(0, prefix.data(), prefix.size());
  std::string header(io::npy_data_offset(prefix, file.size(), path), '\0');
  file.read_at(0, header.data(), header.size());
  const io::NpyHeader parsed = io::parse_npy_header(header, file.size(), path);
  Tensor tensor = Tensor::zeros(parsed.dtype, parsed.shape);
  file.read_at(parsed.data_offset, tensor.raw_data(), parsed.data_bytes);
  if (parsed.dtype == DType::kBool) io::check_bool_bytes(tensor.raw_data(), tensor.nbytes(), path);
  return tensor;
}

void write_npy(const std::string& path, const Tensor& tensor) {
  io::check_has_data(tensor, path);
  io::AtomicFile file(path);
  const std::string header = io::format_npy_header(tensor.dtype(), tensor.shape());
  file.append(header.data(), header.size());
  file.append(tensor.raw_data(), tensor.nbytes());
  file.commit();
}

struct NpyReader::Impl {
  std::string path;
  io::NpyHeader header;
  void* map = nullptr;
  std::size_t map_size = 0;
  std::size_t sample_bytes = 0;

  ~Impl() {
    if (map != nullptr) ::munmap(map, map_size);
  }
};

NpyReader::NpyReader(const std::string& path) : impl_(std::make_unique<Impl>()) {
  impl_->path = path;
  const io::InputFile file(path);
  std::string prefix(std::min<uint64_t>(file.size(), io::kNpyPreambleBytes), '\0');
  file.read_at(0, prefix.data(), prefix.size());
  std::string header(io::npy_data_offset(prefix, file.size(), path), '\0');
  file.read_at(0, header.data(), header.size());
  impl_->header = io::parse_npy_header(header, file.size(), path);
  const std::vector<int64_t>& shape = impl_->header.shape;
  if (shape.empty()) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("{}: holds a scalar (shape ()), which has no sample axis", path));
  }
  impl_->sample_bytes = dtype_size(impl_->header.dtype);
  for (std::size_t axis = 1; axis < shape.size(); ++axis) {
    impl_->sample_bytes *= static_cast<std::size_t>(shape[axis]);
  }
  // The header makes the file at least 10 bytes long, so the map is never empty.
  impl_->map_size = static_cast<std::size_t>(file.size());
  void* map = ::mmap(nullptr, impl_->map_size, PROT_READ, MAP_PRIVATE, file.fd(), 0);
  if (map == MAP_FAILED) io::throw_errno(errno, fmt::format("cannot map '{}'", path));
  impl_->map = map;
  // Scoring reads the file front to back once.
  ::madvise(map, impl_->map_size, MADV_SEQUENTIAL);
}

NpyReader::~NpyReader() = default;

DType NpyReader::dtype() const { return impl_->header.dtype; }
const std::vector<int64_t>& NpyReader::shape() const { return impl_->header.shape; }
int64_t NpyReader::samples() const { return impl_->header.shape[0]; }

Tensor NpyReader::samples_view(int64_t begin, int64_t count) const {
  if (begin < 0 || count < 0 || begin > samples() || count > samples() - begin) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("{}: samples [{}, {}) are outside the file's {} samples", impl_->path,
                            begin, begin + count, samples()));
  }
  std::vector<int64_t> shape = impl_->header.shape;
  shape[0] = count;
  char* data = static_cast<char*>(impl_->map) + impl_->header.data_offset +
               static_cast<std::size_t>(begin) * impl_->sample_bytes;
  const std::size_t bytes = static_cast<std::size_t>(count) * impl_->sample_bytes;
  if (impl_->header.dtype == DType::kBool) io::check_bool_bytes(data, bytes, impl_->path);
  // numpy aligns the data to 64 bytes; a hand-made header may not, and a misaligned float
  // pointer is undefined behaviour, so such slices are copied.
  if (impl_->header.data_offset % dtype_size(impl_->header.dtype) != 0) {
    Tensor copy = Tensor::zeros(impl_->header.dtype, std::move(shape));
    std::memcpy(copy.raw_data(), data, bytes);
    return copy;
  }
  // The map is read-only: the view must not be written to.
  return Tensor::view(data, impl_->header.dtype, std::move(shape));
}

void NpyReader::release_before(int64_t sample) const {
  // Whole pages only: the page holding `sample`'s first byte is still needed.
  const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  const std::size_t end =
      impl_->header.data_offset +
      static_cast<std::size_t>(std::clamp<int64_t>(sample, 0, samples())) * impl_->sample_bytes;
  const std::size_t bytes = end / page * page;
  // On a read-only private file mapping, MADV_DONTNEED drops the pages from the resident set;
  // a later access reads them from the file again (madvise(2)), so this cannot lose data.
  if (bytes > 0) ::madvise(impl_->map, bytes, MADV_DONTNEED);
}

}  // namespace sparsecol
