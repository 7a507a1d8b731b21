// .npy / .npz reading and writing. numpy (Debian's, via /usr/bin/python3) is the ground truth
// for the format: files it writes must read back right, files we write must load in numpy.
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>

#include "sparsecol/io.h"
#include "sparsecol/sparsecol.h"

namespace sparsecol {
namespace {

namespace fs = std::filesystem;

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// The Error `action` throws; a test failure if it throws none.
Error error_of(const std::function<void()>& action) {
  try {
    action();
  } catch (const Error& e) {
    return e;
  }
  ADD_FAILURE() << "expected a sparsecol::Error";
  return Error(ErrorCode::kInternal, "<no error thrown>");
}

// Runs a python script with Debian's numpy; returns its exit status.
int run_python(const std::string& dir, const std::string& script) {
  const std::string file = dir + "/script.py";
  write_bytes(file, "import numpy as np\n" + script);
  const int status = std::system(fmt::format("/usr/bin/python3 '{}'", file).c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// A .npy file made by hand: magic, version, header length, the dict (padded to 64 bytes
// unless told otherwise) and the data.
std::string make_npy(const std::string& dict, const std::string& data, int major = 1,
                     bool pad = true) {
  const std::size_t preamble = major == 1 ? 10 : 12;
  std::string header = dict;
  if (pad) header.append((64 - (preamble + header.size() + 1) % 64) % 64, ' ');
  header.push_back('\n');
  std::string bytes = "\x93NUMPY";
  bytes.push_back(static_cast<char>(major));
  bytes.push_back('\0');
  for (std::size_t i = 0; i < preamble - 8; ++i) {
    bytes.push_back(static_cast<char>(header.size() >> (8 * i)));
  }
  return bytes + header + data;
}

template <typename T>
Tensor random_tensor(std::vector<int64_t> shape, uint32_t seed) {
  Tensor t = Tensor::zeros(DTypeOf<T>::kValue, std::move(shape));
  std::mt19937 rng(seed);
  T* data = t.data<T>();
  for (int64_t i = 0; i < t.numel(); ++i) {
    if constexpr (std::is_same_v<T, bool>) {
      data[i] = rng() % 2 == 1;
    } else if constexpr (std::is_floating_point_v<T>) {
      data[i] = std::uniform_real_distribution<T>(-100, 100)(rng);
    } else {
      data[i] = static_cast<T>(rng());
    }
  }
  return t;
}

void expect_same(const Tensor& expected, const Tensor& actual) {
  ASSERT_EQ(to_string(expected.dtype()), to_string(actual.dtype()));
  ASSERT_EQ(expected.shape(), actual.shape());
  ASSERT_EQ(0, std::memcmp(expected.raw_data(), actual.raw_data(), expected.nbytes()));
}

class NpyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    std::string name = fmt::format("{}.{}", info->test_suite_name(), info->name());
    for (char& c : name) c = c == '/' ? '_' : c;
    dir_ = (fs::path(SPARSECOL_TEST_TMPDIR) / "npy_test" / name).string();
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  std::string path(const std::string& file) const { return dir_ + "/" + file; }
  std::vector<std::string> files() const {
    std::vector<std::string> names;
    for (const auto& entry : fs::directory_iterator(dir_)) {
      names.push_back(entry.path().filename().string());
    }
    std::sort(names.begin(), names.end());
    return names;
  }
  // A valid little float32 file of shape [4, 3] whose element i holds i.
  std::string valid_npy() const {
    std::string data;
    for (int i = 0; i < 12; ++i) {
      const float v = static_cast<float>(i);
      data.append(reinterpret_cast<const char*>(&v), sizeof(v));
    }
    return make_npy("{'descr': '<f4', 'fortran_order': False, 'shape': (4, 3), }", data);
  }

  std::string dir_;
};

// ---- round trips for every dtype and shape ----

template <typename T>
class NpyTypedTest : public NpyTest {};
using AllTypes = ::testing::Types<float, double, int64_t, int32_t, int8_t, uint8_t, bool>;
TYPED_TEST_SUITE(NpyTypedTest, AllTypes);

TYPED_TEST(NpyTypedTest, RoundTripsEveryShape) {
  const std::vector<std::vector<int64_t>> shapes = {{}, {0}, {7}, {2, 3, 4}, {3, 0, 2}};
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    SCOPED_TRACE(fmt::format("shape #{}", i));
    const Tensor original = random_tensor<TypeParam>(shapes[i], static_cast<uint32_t>(i));
    const std::string file = this->path(fmt::format("t{}.npy", i));
    write_npy(file, original);
    expect_same(original, read_npy(file));
  }
}

TYPED_TEST(NpyTypedTest, NpzRoundTripsEveryShape) {
  NamedTensors original;
  original["scalar"] = random_tensor<TypeParam>({}, 1);
  original["empty"] = random_tensor<TypeParam>({0}, 2);
  original["vector"] = random_tensor<TypeParam>({5}, 3);
  original["cube"] = random_tensor<TypeParam>({2, 3, 4}, 4);
  write_npz(this->path("t.npz"), original);
  const NamedTensors loaded = read_npz(this->path("t.npz"));
  ASSERT_EQ(loaded.size(), original.size());
  for (const auto& [name, tensor] : original) {
    SCOPED_TRACE(name);
    ASSERT_EQ(loaded.count(name), 1u);
    expect_same(tensor, loaded.at(name));
  }
}

// ---- numpy as the ground truth ----

TEST_F(NpyTest, ReadsWhatNumpyWrites) {
  // Every dtype, formats 1.0, 2.0 and 3.0, and the shapes (), (0,), (n,) and (2, 3, 4).
  ASSERT_EQ(0, run_python(dir_, fmt::format(R"(
import os
d = {:?}
for name in ['float32', 'float64', 'int64', 'int32', 'int8', 'uint8', 'bool']:
    a = (np.arange(24) % 7 - 3).astype(name).reshape(2, 3, 4)
    np.save(os.path.join(d, name + '.npy'), a)
    for version in [(2, 0), (3, 0)]:
        with open(os.path.join(d, '%s.v%d.npy' % (name, version[0])), 'wb') as f:
            np.lib.format.write_array(f, a, version=version)
np.save(os.path.join(d, 'scalar.npy'), np.float32(2.5))
np.save(os.path.join(d, 'empty.npy'), np.zeros((0,), np.float32))
np.save(os.path.join(d, 'vector.npy'), np.arange(5, dtype=np.int64))
)",
                                            dir_)));
  const std::pair<const char*, DType> types[] = {
      {"float32", DType::kFloat32}, {"float64", DType::kFloat64}, {"int64", DType::kInt64},
      {"int32", DType::kInt32},     {"int8", DType::kInt8},       {"uint8", DType::kUInt8},
      {"bool", DType::kBool}};
  for (const auto& [name, dtype] : types) {
    for (const std::string suffix : {"", ".v2", ".v3"}) {
      SCOPED_TRACE(fmt::format("{}{}", name, suffix));
      const Tensor t = read_npy(path(fmt::format("{}{}.npy", name, suffix)));
      ASSERT_EQ(t.dtype(), dtype);
      ASSERT_EQ(t.shape(), (std::vector<int64_t>{2, 3, 4}));
      for (int i = 0; i < 24; ++i) {
        const int64_t value = i % 7 - 3;
        // numpy's astype: wraps for uint8, non-zero is True for bool.
        const auto* bytes = static_cast<const uint8_t*>(t.raw_data()) + i * dtype_size(dtype);
        switch (dtype) {
          case DType::kFloat32:
            EXPECT_EQ(t.data<float>()[i], static_cast<float>(value));
            break;
          case DType::kFloat64:
            EXPECT_EQ(t.data<double>()[i], static_cast<double>(value));
            break;
          case DType::kInt64:
            EXPECT_EQ(t.data<int64_t>()[i], value);
            break;
          case DType::kInt32:
            EXPECT_EQ(t.data<int32_t>()[i], value);
            break;
          case DType::kInt8:
            EXPECT_EQ(t.data<int8_t>()[i], value);
            break;
          case DType::kUInt8:
            EXPECT_EQ(*bytes, static_cast<uint8_t>(value));
            break;
          case DType::kBool:
            EXPECT_EQ(*bytes, value != 0 ? 1 : 0);
            break;
        }
      }
    }
  }
  const Tensor scalar = read_npy(path("scalar.npy"));
  EXPECT_TRUE(scalar.shape().empty());
  EXPECT_EQ(scalar.data<float>()[0], 2.5f);
  EXPECT_EQ(read_npy(path("empty.npy")).shape(), std::vector<int64_t>{0});
  const Tensor vector = read_npy(path("vector.npy"));
  ASSERT_EQ(vector.shape(), std::vector<int64_t>{5});
  EXPECT_EQ(vector.data<int64_t>()[4], 4);
}

TEST_F(NpyTest, NumpyLoadsWhatWeWrite) {
  // Element i of each file is (i % 7 - 3) in its dtype; numpy checks dtype, shape and values.
  const auto fill = [](DType dtype, std::vector<int64_t> shape) {
    Tensor t = Tensor::zeros(dtype, std::move(shape));
    auto* bytes = static_cast<uint8_t*>(t.raw_data());
    for (int64_t i = 0; i < t.numel(); ++i) {
      const int64_t v = i % 7 - 3;
      uint8_t* at = bytes + i * static_cast<int64_t>(dtype_size(dtype));
      switch (dtype) {
        case DType::kFloat32:
          *reinterpret_cast<float*>(at) = static_cast<float>(v);
          break;
        case DType::kFloat64:
          *reinterpret_cast<double*>(at) = static_cast<double>(v);
          break;
        case DType::kInt64:
          *reinterpret_cast<int64_t*>(at) = v;
          break;
        case DType::kInt32:
          *reinterpret_cast<int32_t*>(at) = static_cast<int32_t>(v);
          break;
        case DType::kInt8:
          *reinterpret_cast<int8_t*>(at) = static_cast<int8_t>(v);
          break;
        case DType::kUInt8:
          *at = static_cast<uint8_t>(v);
          break;
        case DType::kBool:
          *at = v != 0 ? 1 : 0;
          break;
      }
    }
    return t;
  };
  NamedTensors archive;
  for (DType dtype : {DType::kFloat32, DType::kFloat64, DType::kInt64, DType::kInt32, DType::kInt8,
                      DType::kUInt8, DType::kBool}) {
    for (const auto& [tag, shape] : std::vector<std::pair<std::string, std::vector<int64_t>>>{
             {"s", {}}, {"e", {0}}, {"v", {5}}, {"c", {2, 3, 4}}}) {
      const std::string name = fmt::format("{}_{}", to_string(dtype), tag);
      const Tensor t = fill(dtype, shape);
      write_npy(path(name + ".npy"), t);
      archive[name] = t;
    }
  }
  write_npz(path("all.npz"), archive);
  write_npz(path("none.npz"), {});
  EXPECT_EQ(0, run_python(dir_, fmt::format(R"(
import os, sys
d = {:?}
shapes = {{'s': (), 'e': (0,), 'v': (5,), 'c': (2, 3, 4)}}
archive = np.load(os.path.join(d, 'all.npz'))
assert len(np.load(os.path.join(d, 'none.npz')).files) == 0
for dtype in ['float32', 'float64', 'int64', 'int32', 'int8', 'uint8', 'bool']:
    for tag, shape in shapes.items():
        name = '%s_%s' % (dtype, tag)
        expected = (np.arange(int(np.prod(shape))) % 7 - 3).astype(dtype).reshape(shape)
        for a in [np.load(os.path.join(d, name + '.npy')), archive[name]]:
            if a.dtype != np.dtype(dtype) or a.shape != shape or not np.array_equal(a, expected):
                print('mismatch', name, a.dtype, a.shape, a, expected)
                sys.exit(1)
)",
                                            dir_)));
}

TEST_F(NpyTest, ReadsCompressedNpzFromNumpy) {
  ASSERT_EQ(0, run_python(dir_, fmt::format(R"(
np.savez_compressed({:?}, x=np.arange(1000, dtype=np.float32).reshape(10, 100),
                    y=np.array([True, False, True]))
)",
                                            path("c.npz"))));
  const NamedTensors loaded = read_npz(path("c.npz"));
  ASSERT_EQ(loaded.size(), 2u);
  const Tensor& x = loaded.at("x");
  ASSERT_EQ(x.shape(), (std::vector<int64_t>{10, 100}));
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(x.data<float>()[i], static_cast<float>(i));
  const Tensor& y = loaded.at("y");
  ASSERT_EQ(y.dtype(), DType::kBool);
  EXPECT_EQ(std::vector<bool>(y.data<bool>(), y.data<bool>() + 3),
            (std::vector<bool>{true, false, true}));
}

// ---- malformed files are refused cleanly ----

TEST_F(NpyTest, TruncatedFileIsInvalidArgumentNamingSizes) {
  const std::string full = valid_npy();
  const std::size_t header = full.size() - 48;
  for (std::size_t size :
       {std::size_t{0}, std::size_t{3}, std::size_t{6}, std::size_t{8}, std::size_t{9},
        std::size_t{20}, header - 1, header, header + 5, full.size() - 1}) {
    SCOPED_TRACE(fmt::format("{} of {} bytes", size, full.size()));
    const std::string file = path(fmt::format("cut{}.npy", size));
    write_bytes(file, full.substr(0, size));
    for (const auto& read : std::vector<std::function<void()>>{[&] { read_npy(file); },
                                                               [&] { NpyReader reader(file); }}) {
      const Error e = error_of(read);
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
      EXPECT_TRUE(contains(e.what(), file)) << e.what();
      EXPECT_TRUE(contains(e.what(), "truncated")) << e.what();
      if (size >= header) {
        // Expected and actual sizes, so the user can tell a cut download from a wrong shape.
        EXPECT_TRUE(contains(e.what(), std::to_string(full.size()))) << e.what();
        EXPECT_TRUE(contains(e.what(), fmt::format("has {}", size))) << e.what();
      }
    }
  }
}

TEST_F(NpyTest, TrailingBytesAreRefused) {
  write_bytes(path("long.npy"), valid_npy() + "xx");
  EXPECT_EQ(error_of([&] { read_npy(path("long.npy")); }).code(), ErrorCode::kInvalidArgument);
}

TEST_F(NpyTest, BadMagicIsRefused) {
  std::string bytes = valid_npy();
  bytes[1] = 'X';
  write_bytes(path("magic.npy"), bytes);
  const Error e = error_of([&] { read_npy(path("magic.npy")); });
  EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
  EXPECT_TRUE(contains(e.what(), "not a .npy file")) << e.what();
}

TEST_F(NpyTest, HeaderLengthBeyondFileIsRefused) {
  std::string bytes = valid_npy();
  bytes[8] = '\xff';
  bytes[9] = '\xff';
  write_bytes(path("long_header.npy"), bytes);
  for (const auto& read :
       std::vector<std::function<void()>>{[&] { read_npy(path("long_header.npy")); },
                                          [&] { NpyReader reader(path("long_header.npy")); }}) {
    const Error e = error_of(read);
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_TRUE(contains(e.what(), "65545")) << e.what();  // 10 + 0xffff claimed
  }
}

struct UnsupportedCase {
  const char* label;
  std::string file;
  const char* message;
};

TEST_F(NpyTest, UnsupportedFeaturesAreUnsupported) {
  const std::string data(24, '\0');
  const std::vector<UnsupportedCase> cases = {
      {"fortran", make_npy("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }", data),
       "Fortran"},
      {"big_endian", make_npy("{'descr': '>f4', 'fortran_order': False, 'shape': (2, 3), }", data),
       "big-endian"},
      {"float16", make_npy("{'descr': '<f2', 'fortran_order': False, 'shape': (12,), }", data),
       "'<f2'"},
      {"structured",
       make_npy("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (6,), }", data),
       "structured"},
      {"version",
       [&] {
         std::string bytes = valid_npy();
         bytes[6] = 4;
         return bytes;
       }(),
       "version 4.0"},
  };
  for (const UnsupportedCase& c : cases) {
    SCOPED_TRACE(c.label);
    const std::string file = path(std::string(c.label) + ".npy");
    write_bytes(file, c.file);
    const Error e = error_of([&] { read_npy(file); });
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported) << e.what();
    EXPECT_TRUE(contains(e.what(), c.message)) << e.what();
    EXPECT_TRUE(contains(e.what(), file)) << e.what();
  }
}

TEST_F(NpyTest, MalformedHeadersAreInvalidArgument) {
  const std::string data(24, '\0');  // six float32
  const std::vector<std::string> dicts = {
      "{'descr': '<f4', 'shape': (6,), }",                                          // missing key
      "{'descr': '<f4', 'fortran_order': False, 'shape': (6,), 'x': 1, }",          // unknown key
      "{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (6,), }",  // twice
      "{'descr': '<f4', 'fortran_order': False, 'shape': (6), }",     // an int, not a tuple
      "{'descr': '<f4', 'fortran_order': False, 'shape': (-6,), }",   // negative dimension
      "{'descr': '<f4', 'fortran_order': false, 'shape': (6,), }",    // not a Python bool
      "{'descr': '<f4', 'fortran_order': False, 'shape': (6,), ",     // unclosed dict
      "{'descr': '<f4",                                               // unclosed string
      "{'descr': '<f4', 'fortran_order': False, 'shape': (6,), } x",  // junk after the dict
      "{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,), }",
      "{'descr': '<f4', 'fortran_order': False, 'shape': (4611686018427387904, 4), }",
  };
  for (std::size_t i = 0; i < dicts.size(); ++i) {
    SCOPED_TRACE(dicts[i]);
    const std::string file = path(fmt::format("bad{}.npy", i));
    write_bytes(file, make_npy(dicts[i], data));
    const Error e = error_of([&] { read_npy(file); });
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
    EXPECT_TRUE(contains(e.what(), file)) << e.what();
  }
}

TEST_F(NpyTest, BoolBytesOtherThanZeroOrOneAreRefused) {
  write_bytes(path("b.npy"), make_npy("{'descr': '|b1', 'fortran_order': False, 'shape': (3,), }",
                                      std::string("\1\2\0", 3)));
  EXPECT_EQ(error_of([&] { read_npy(path("b.npy")); }).code(), ErrorCode::kInvalidArgument);
  NpyReader reader(path("b.npy"));
  EXPECT_NO_THROW(reader.samples_view(0, 1));
  EXPECT_EQ(error_of([&] { reader.samples_view(0, 2); }).code(), ErrorCode::kInvalidArgument);
}

TEST_F(NpyTest, MissingFileIsNotFoundAndFolderIsIoError) {
  const Error missing = error_of([&] { read_npy(path("nope.npy")); });
  EXPECT_EQ(missing.code(), ErrorCode::kNotFound);
  EXPECT_TRUE(contains(missing.what(), path("nope.npy"))) << missing.what();
  EXPECT_EQ(error_of([&] { NpyReader reader(path("nope.npy")); }).code(), ErrorCode::kNotFound);
  EXPECT_EQ(error_of([&] { read_npz(path("nope.npz")); }).code(), ErrorCode::kNotFound);
  EXPECT_EQ(error_of([&] { read_npy(dir_); }).code(), ErrorCode::kIoError);
}

TEST_F(NpyTest, CorruptNpzIsInvalidArgument) {
  NamedTensors tensors;
  tensors["x"] = random_tensor<float>({100}, 7);
  write_npz(path("ok.npz"), tensors);
  const std::string bytes = read_bytes(path("ok.npz"));
  write_bytes(path("cut.npz"), bytes.substr(0, bytes.size() / 2));
  EXPECT_EQ(error_of([&] { read_npz(path("cut.npz")); }).code(), ErrorCode::kInvalidArgument);
  write_bytes(path("text.npz"), "this is not a zip archive at all");
  EXPECT_EQ(error_of([&] { read_npz(path("text.npz")); }).code(), ErrorCode::kInvalidArgument);
  // A flipped data byte breaks the member's CRC.
  std::string flipped = bytes;
  flipped[bytes.size() / 2] ^= 0x55;
  write_bytes(path("flipped.npz"), flipped);
  EXPECT_EQ(error_of([&] { read_npz(path("flipped.npz")); }).code(), ErrorCode::kInvalidArgument);
}

// ---- the memory-mapped reader ----

TEST_F(NpyTest, ReaderSlicesEqualReadNpySlices) {
  const Tensor full = random_tensor<float>({10, 3, 2}, 11);
  write_npy(path("x.npy"), full);
  const Tensor read = read_npy(path("x.npy"));
  NpyReader reader(path("x.npy"));
  EXPECT_EQ(reader.dtype(), DType::kFloat32);
  EXPECT_EQ(reader.shape(), full.shape());
  EXPECT_EQ(reader.samples(), 10);
  for (const auto& [begin, count] :
       std::vector<std::pair<int64_t, int64_t>>{{0, 10}, {0, 0}, {3, 4}, {9, 1}, {10, 0}}) {
    SCOPED_TRACE(fmt::format("[{}, {})", begin, begin + count));
    const Tensor view = reader.samples_view(begin, count);
    EXPECT_FALSE(view.owns_data());
    ASSERT_EQ(view.shape(), (std::vector<int64_t>{count, 3, 2}));
    EXPECT_EQ(0, std::memcmp(view.raw_data(), read.data<float>() + begin * 6, view.nbytes()));
  }
  for (const auto& [begin, count] :
       std::vector<std::pair<int64_t, int64_t>>{{-1, 1}, {0, 11}, {10, 1}, {5, -1}, {11, 0}}) {
    EXPECT_EQ(error_of([&] { reader.samples_view(begin, count); }).code(),
              ErrorCode::kInvalidArgument);
  }
}

TEST_F(NpyTest, ReaderCopiesMisalignedData) {
  // A hand-made header whose length leaves the float data at an odd offset.
  std::string data;
  for (int i = 0; i < 6; ++i) {
    const float v = static_cast<float>(i) + 0.5f;
    data.append(reinterpret_cast<const char*>(&v), sizeof(v));
  }
  std::string dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 2), }";
  if ((10 + dict.size() + 1) % 4 == 0) dict += " ";
  write_bytes(path("odd.npy"), make_npy(dict, data, 1, /*pad=*/false));
  NpyReader reader(path("odd.npy"));
  const Tensor slice = reader.samples_view(1, 2);
  ASSERT_EQ(slice.shape(), (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(reinterpret_cast<uintptr_t>(slice.raw_data()) % alignof(float), 0u);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(slice.data<float>()[i], static_cast<float>(i + 2) + 0.5f);
}

TEST_F(NpyTest, ReaderRefusesScalars) {
  write_npy(path("s.npy"), random_tensor<float>({}, 1));
  EXPECT_EQ(error_of([&] { NpyReader reader(path("s.npy")); }).code(), ErrorCode::kInvalidArgument);
}

// ---- atomic writes ----

TEST_F(NpyTest, WriteReplacesAnExistingFile) {
  write_npy(path("x.npy"), random_tensor<int32_t>({100}, 1));
  const Tensor second = random_tensor<int32_t>({3, 3}, 2);
  write_npy(path("x.npy"), second);
  expect_same(second, read_npy(path("x.npy")));
  EXPECT_EQ(files(), std::vector<std::string>{"x.npy"});
}

// A write that fails half way (here: the file size limit, which binds even for root, unlike
// folder permissions) leaves the old file as it was and no temporary file behind.
TEST_F(NpyTest, FailedWriteLeavesOldFileAndNoTemporary) {
  const Tensor old_tensor = random_tensor<float>({16}, 1);
  write_npy(path("x.npy"), old_tensor);
  const Tensor big = random_tensor<float>({1 << 16}, 2);
  NamedTensors archive{{"big", big}};

  rlimit saved{};
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &saved), 0);
  rlimit small = saved;
  small.rlim_cur = 64 * 1024;                           // less than the 256 KiB of `big`
  const auto saved_handler = signal(SIGXFSZ, SIG_IGN);  // write() returns EFBIG instead
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
  const Error npy_error = error_of([&] { write_npy(path("x.npy"), big); });
  const Error npz_error = error_of([&] { write_npz(path("y.npz"), archive); });
  setrlimit(RLIMIT_FSIZE, &saved);
  signal(SIGXFSZ, saved_handler);

  EXPECT_EQ(npy_error.code(), ErrorCode::kIoError) << npy_error.what();
  EXPECT_TRUE(contains(npy_error.what(), path("x.npy"))) << npy_error.what();
  EXPECT_EQ(npz_error.code(), ErrorCode::kIoError) << npz_error.what();
  expect_same(old_tensor, read_npy(path("x.npy")));
  EXPECT_EQ(files(), std::vector<std::string>{"x.npy"});
}

TEST_F(NpyTest, WriteIntoMissingFolderFailsCleanly) {
  const Error e = error_of([&] { write_npy(path("no/such/x.npy"), random_tensor<float>({2}, 1)); });
  EXPECT_EQ(e.code(), ErrorCode::kNotFound);
  EXPECT_TRUE(contains(e.what(), path("no/such/x.npy"))) << e.what();
  EXPECT_TRUE(files().empty());
}

TEST_F(NpyTest, WritingATensorWithoutDataFailsCleanly) {
  EXPECT_EQ(error_of([&] { write_npy(path("x.npy"), Tensor()); }).code(),
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(error_of([&] {
              write_npz(path("x.npz"), {{"t", Tensor()}});
            }).code(),
            ErrorCode::kInvalidArgument);
  EXPECT_TRUE(files().empty());
}

TEST_F(NpyTest, ReadTensorFileDispatchesOnExtension) {
  const Tensor t = random_tensor<double>({2, 2}, 3);
  write_npy(path("t.npy"), t);
  expect_same(t, read_tensor_file(path("t.npy")));
  EXPECT_EQ(error_of([&] { read_tensor_file(path("t.txt")); }).code(), ErrorCode::kInvalidArgument);
}

TEST_F(NpyTest, ReadTensorFileReadsTensorProtoThroughTheImporter) {
  onnx::TensorProto proto;
  proto.set_name("t");
  proto.set_data_type(onnx::TensorProto::FLOAT);
  proto.add_dims(2);
  proto.add_dims(3);
  for (int i = 0; i < 6; ++i) proto.add_float_data(0.5f * static_cast<float>(i));
  write_bytes(path("t.pb"), proto.SerializeAsString());
  std::string name;
  const Tensor t = read_tensor_proto(path("t.pb"), &name);
  EXPECT_EQ(name, "t");
  ASSERT_EQ(t.shape(), (std::vector<int64_t>{2, 3}));
  for (int i = 0; i < 6; ++i) EXPECT_EQ(t.data<float>()[i], 0.5f * static_cast<float>(i));
  expect_same(t, read_tensor_file(path("t.pb")));
}

}  // namespace
}  // namespace sparsecol
