// `sparsecol check MODEL DIR` end to end, on ONNX's backend node tests (Debian's
// libonnx-testdata) and on copies of them whose expected outputs were tampered with.
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>

#include "cli_util.h"
#include "sparsecol/io.h"
#include "sparsecol/sparsecol.h"

namespace sparsecol {
namespace {

namespace fs = std::filesystem;

using testing::CliResult;
using testing::contains;

const fs::path kNodeTests = "/usr/share/libonnx-testdata/data/node";

class CheckTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(kNodeTests / "test_relu")) {
      GTEST_SKIP() << kNodeTests << " is missing (Debian package libonnx-testdata)";
    }
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = (fs::path(SPARSECOL_TEST_TMPDIR) / "check_test" / info->name()).string();
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }

  CliResult cli(const std::string& args) const { return testing::run_cli(args, dir_); }

  CliResult check(const std::string& name, const std::string& extra = "") const {
    const fs::path test = kNodeTests / name;
    return cli(
        fmt::format("check '{}' '{}' {}", (test / "model.onnx").string(), test.string(), extra));
  }

  // A copy of node test `name` in the temporary folder.
  fs::path copy_test(const std::string& name) const {
    const fs::path copy = fs::path(dir_) / name;
    fs::copy(kNodeTests / name, copy, fs::copy_options::recursive);
    return copy;
  }

  std::string dir_;
};

int count_word(const std::string& text, const std::string& word) {
  int count = 0;
  for (std::size_t at = text.find(word); at != std::string::npos; at = text.find(word, at + 1)) {
    ++count;
  }
  return count;
}

TEST_F(CheckTest, OnnxNodeTestsPass) {
  for (const char* name : {"test_relu", "test_conv_with_strides_padding",
                           "test_basic_conv_with_padding", "test_gemm_all_attributes"}) {
    SCOPED_TRACE(name);
    const CliResult result = check(name);
    EXPECT_EQ(result.code, 0) << result.out << result.err;
    EXPECT_TRUE(contains(result.out, "test_data_set_0")) << result.out;
    EXPECT_TRUE(contains(result.out, "max abs")) << result.out;
    EXPECT_TRUE(contains(result.out, "max rel")) << result.out;
    EXPECT_EQ(count_word(result.out, "FAIL"), 0) << result.out;
    EXPECT_TRUE(result.out.starts_with("test_data_set_0")) << result.out;
    EXPECT_TRUE(contains(result.out, "\nPASS: 1 of 1 outputs PASS")) << result.out;
  }
  // One data set folder is accepted as DIR too, and another schedule.
  const fs::path test = kNodeTests / "test_relu";
  const CliResult one =
      cli(fmt::format("check '{}' '{}' --schedule layerwise", (test / "model.onnx").string(),
                      (test / "test_data_set_0").string()));
  EXPECT_EQ(one.code, 0) << one.out << one.err;
}

// One element of the expected output moved by 1e-2: FAIL with exit code 4, and the error shown;
// a tolerance that covers it passes.
TEST_F(CheckTest, TamperedExpectedOutputFailsWithExitFour) {
  const fs::path test = copy_test("test_relu");
  const fs::path output = test / "test_data_set_0" / "output_0.pb";
  onnx::TensorProto proto;
  {
    std::ifstream in(output, std::ios::binary);
    ASSERT_TRUE(proto.ParseFromIstream(&in));
  }
  ASSERT_EQ(proto.data_type(), onnx::TensorProto::FLOAT);
  std::string raw = proto.raw_data();
  ASSERT_GE(raw.size(), sizeof(float));
  float value;
  std::memcpy(&value, raw.data(), sizeof value);
  value += 0.5f;
  std::memcpy(raw.data(), &value, sizeof value);
  proto.set_raw_data(raw);
  {
    std::ofstream out(output, std::ios::binary | std::ios::trunc);
    ASSERT_TRUE(proto.SerializeToOstream(&out));
  }
  const std::string args =
      fmt::format("check '{}' '{}'", (test / "model.onnx").string(), test.string());
  const CliResult strict = cli(args);
  EXPECT_EQ(strict.code, 4) << strict.out << strict.err;
  EXPECT_TRUE(contains(strict.out, "max abs 5.00e-01")) << strict.out;
  EXPECT_TRUE(contains(strict.out, "FAIL (1 of 60 elements outside)")) << strict.out;
  EXPECT_TRUE(contains(strict.out, "\nFAIL: 0 of 1 outputs PASS")) << strict.out;

  const CliResult lenient = cli(args + " --atol 0.6");
  EXPECT_EQ(lenient.code, 0) << lenient.out << lenient.err;
}

// An expected output of another shape fails (it does not crash or pass).
TEST_F(CheckTest, ExpectedOutputOfAnotherShapeFails) {
  const fs::path test = copy_test("test_relu");
  onnx::TensorProto proto;
  proto.set_name("y");
  proto.set_data_type(onnx::TensorProto::FLOAT);
  proto.add_dims(2);
  proto.add_float_data(0);
  proto.add_float_data(0);
  std::ofstream out(test / "test_data_set_0" / "output_0.pb", std::ios::binary | std::ios::trunc);
  ASSERT_TRUE(proto.SerializeToOstream(&out));
  out.close();
  const CliResult result =
      cli(fmt::format("check '{}' '{}'", (test / "model.onnx").string(), test.string()));
  EXPECT_EQ(result.code, 4) << result.out << result.err;
  EXPECT_TRUE(contains(result.out, "expected float32 [2]")) << result.out;
}

TEST_F(CheckTest, UnreadableModelOrDataIsExitTwo) {
  // test_add's data sets have two inputs; test_relu's model has one.
  const CliResult extra_input =
      cli(fmt::format("check '{}' '{}'", (kNodeTests / "test_relu" / "model.onnx").string(),
                      (kNodeTests / "test_add").string()));
  EXPECT_EQ(extra_input.code, 2) << extra_input.out << extra_input.err;
  EXPECT_TRUE(contains(extra_input.err, "2 input_N.pb files for a model with 1 input"))
      << extra_input.err;

  const CliResult no_data =
      cli(fmt::format("check '{}' '{}'", (kNodeTests / "test_relu" / "model.onnx").string(), dir_));
  EXPECT_EQ(no_data.code, 2);
  EXPECT_TRUE(contains(no_data.err, "no test_data_set_N folder")) << no_data.err;

  const CliResult no_model = cli(fmt::format("check '{}/absent.onnx' '{}'", dir_, dir_));
  EXPECT_EQ(no_model.code, 2);
  EXPECT_TRUE(contains(no_model.err, "absent.onnx")) << no_model.err;
}

}  // namespace
}  // namespace sparsecol
