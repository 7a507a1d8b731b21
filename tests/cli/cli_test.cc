// The `sparsecol` command line end to end: runs the built binary on tiny models made here with
// the ONNX protobuf classes (so that these tests do not wait for the model export), and checks
// exit codes, messages and output files; numpy checks the computed values.
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>
#include <nlohmann/json.hpp>

#include "../test_util.h"
#include "cli_util.h"
#include "sparsecol/io.h"
#include "sparsecol/sparsecol.h"

namespace sparsecol {
namespace {

namespace fs = std::filesystem;

using testing::CliResult;
using testing::contains;
using testing::read_text;

int count_lines(const std::string& text) {
  return static_cast<int>(std::count(text.begin(), text.end(), '\n'));
}

Tensor random_floats(std::vector<int64_t> shape, uint32_t seed) {
  Tensor t = Tensor::zeros(DType::kFloat32, std::move(shape));
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = dist(rng);
  return t;
}

// Graph-building helpers over the ONNX protobuf classes. A dimension of -1 is the symbol "N".
void set_type(onnx::ValueInfoProto* value, const std::string& name,
              const std::vector<int64_t>& dims) {
  value->set_name(name);
  auto* tensor_type = value->mutable_type()->mutable_tensor_type();
  tensor_type->set_elem_type(onnx::TensorProto::FLOAT);
  for (int64_t d : dims) {
    auto* dim = tensor_type->mutable_shape()->add_dim();
    if (d < 0) {
      dim->set_dim_param("N");
    } else {
      dim->set_dim_value(d);
    }
  }
}

void add_initializer(onnx::GraphProto* graph, const std::string& name, const Tensor& tensor) {
  auto* init = graph->add_initializer();
  init->set_name(name);
  init->set_data_type(onnx::TensorProto::FLOAT);
  for (int64_t d : tensor.shape()) init->add_dims(d);
  init->set_raw_data(tensor.raw_data(), tensor.nbytes());
}

void add_node(onnx::GraphProto* graph, const std::string& op, std::vector<std::string> inputs,
              const std::string& output) {
  auto* node = graph->add_node();
  node->set_op_type(op);
  node->set_name(op + "_" + output);
  for (const std::string& input : inputs) node->add_input(input);
  node->add_output(output);
}

// An ONNX TensorProto file, as in ONNX test data (name "" leaves the name out).
void write_tensor_proto(const std::string& path, const std::string& name, const Tensor& tensor) {
  onnx::TensorProto proto;
  if (!name.empty()) proto.set_name(name);
  proto.set_data_type(onnx::TensorProto::FLOAT);
  for (int64_t d : tensor.shape()) proto.add_dims(d);
  proto.set_raw_data(tensor.raw_data(), tensor.nbytes());
  std::ofstream out(path, std::ios::binary);
  ASSERT_TRUE(proto.SerializeToOstream(&out));
}

void save_model(const onnx::ModelProto& model, const std::string& path) {
  std::ofstream out(path, std::ios::binary);
  ASSERT_TRUE(model.SerializeToOstream(&out));
}

class CliTest : public ::testing::Test {
 protected:
  static constexpr int64_t kFeatures = 8;
  static constexpr int64_t kUnits = 4;

  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = (fs::path(SPARSECOL_TEST_TMPDIR) / "cli_test" / info->name()).string();
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    weight_ = random_floats({kFeatures, kUnits}, 1);
    bias_ = random_floats({kUnits}, 2);
    write_npy(path("W.npy"), weight_);
    write_npy(path("b.npy"), bias_);
  }

  std::string path(const std::string& file) const { return dir_ + "/" + file; }

  // h = x @ W + bias, y = Relu(h), over x [N, 8]; outputs y and h. With `second_input`, the
  // bias is a second model input z [N, 4] instead of an initializer.
  std::string make_model(bool second_input = false) const {
    onnx::ModelProto model;
    model.set_ir_version(8);
    auto* opset = model.add_opset_import();
    opset->set_domain("");
    opset->set_version(13);
    auto* graph = model.mutable_graph();
    graph->set_name("tiny");
    set_type(graph->add_input(), "x", {-1, kFeatures});
    add_initializer(graph, "W", weight_);
    if (second_input) {
      set_type(graph->add_input(), "z", {-1, kUnits});
    } else {
      add_initializer(graph, "b", bias_);
    }
    add_node(graph, "MatMul", {"x", "W"}, "m");
    add_node(graph, "Add", {"m", second_input ? "z" : "b"}, "h");
    add_node(graph, "Relu", {"h"}, "y");
    set_type(graph->add_output(), "y", {-1, kUnits});
    set_type(graph->add_output(), "h", {-1, kUnits});
    const std::string file = path(second_input ? "two_inputs.onnx" : "tiny.onnx");
    save_model(model, file);
    return file;
  }

  testing::CliResult cli(const std::string& args) const { return testing::run_cli(args, dir_); }

  // Runs the tiny model on `samples` random samples (written to x.npy).
  CliResult run_tiny(int64_t samples, const std::string& extra) {
    const std::string model = make_model();
    write_npy(path("x.npy"), random_floats({samples, kFeatures}, 3));
    return cli(fmt::format("run '{}' --input '{}' {}", model, path("x.npy"), extra));
  }

  std::string dir_;
  Tensor weight_, bias_;
};

TEST_F(CliTest, HelpWorksForEverySubcommand) {
  const CliResult main_help = cli("--help");
  ASSERT_EQ(main_help.code, 0) << main_help.err;
  // The subcommands are the lines under "Subcommands:"; each must answer --help.
  std::istringstream lines(main_help.out.substr(main_help.out.find("Subcommands:")));
  std::string line;
  std::getline(lines, line);
  int subcommands = 0;
  while (std::getline(lines, line) && line.starts_with("  ")) {
    const std::string name = line.substr(2, line.find(' ', 2) - 2);
    SCOPED_TRACE(name);
    const CliResult help = cli(name + " --help");
    EXPECT_EQ(help.code, 0) << help.err;
    EXPECT_TRUE(contains(help.out, "Usage: sparsecol " + name)) << help.out;
    ++subcommands;
  }
  EXPECT_GE(subcommands, 2);
  EXPECT_TRUE(contains(main_help.out, "run")) << main_help.out;
  EXPECT_TRUE(contains(main_help.out, "inspect")) << main_help.out;
}

TEST_F(CliTest, RunHelpListsEveryOptionWithItsDefault) {
  const CliResult help = cli("run --help");
  ASSERT_EQ(help.code, 0);
  // The default schedule is one constant (tools/commands.h), not repeated here.
  for (const char* expected :
       {"MODEL", "--input", "--output", "--outputs", "--batch", "=16", "--threads", "=0",
        "--schedule", "--trace", "--quiet", ".npz", ".pb", "read whole"}) {
    EXPECT_TRUE(contains(help.out, expected)) << expected << " missing from\n" << help.out;
  }
}

TEST_F(CliTest, RunScoresInBatchesAndMatchesNumpy) {
  const CliResult small = run_tiny(10000, fmt::format("--batch 64 --output '{}'", path("b64.npz")));
  ASSERT_EQ(small.code, 0) << small.err;
  const CliResult whole = cli(fmt::format("run '{}' --input '{}' --batch 10000 --output '{}'",
                                          path("tiny.onnx"), path("x.npy"), path("b1000.npz")));
  ASSERT_EQ(whole.code, 0) << whole.err;

  const NamedTensors batched = read_npz(path("b64.npz"));
  const NamedTensors at_once = read_npz(path("b1000.npz"));
  ASSERT_EQ(batched.size(), 2u);
  ASSERT_EQ(at_once.size(), 2u);
  for (const char* name : {"y", "h"}) {
    SCOPED_TRACE(name);
    const Tensor& a = batched.at(name);
    const Tensor& b = at_once.at(name);
    ASSERT_EQ(a.shape(), (std::vector<int64_t>{10000, kUnits}));
    ASSERT_EQ(b.shape(), a.shape());
    // Per-sample results must not depend on which batch a sample landed in (10000 = 156 * 64 +
    // 16 also exercises the partial last batch).
    for (int64_t i = 0; i < a.numel(); ++i) {
      ASSERT_NEAR(a.data<float>()[i], b.data<float>()[i], 1e-5f) << "element " << i;
    }
  }
  // numpy computes the same model independently.
  const std::string script = path("check.py");
  std::ofstream(script) << fmt::format(R"(
import numpy as np, sys
d = {:?}
x, W, b = np.load(d + '/x.npy'), np.load(d + '/W.npy'), np.load(d + '/b.npy')
out = np.load(d + '/b64.npz')
h = x @ W + b
ok = np.allclose(out['h'], h, rtol=1e-5, atol=1e-5) and np.allclose(out['y'], np.maximum(h, 0), rtol=1e-5, atol=1e-5)
sys.exit(0 if ok else 1)
)",
                                       dir_);
  EXPECT_EQ(std::system(fmt::format("/usr/bin/python3 '{}'", script).c_str()), 0);
}

TEST_F(CliTest, RunPrintsSummaryUnlessQuiet) {
  const CliResult loud = run_tiny(100, fmt::format("--outputs y --output '{}'", path("y.npy")));
  ASSERT_EQ(loud.code, 0) << loud.err;
  EXPECT_TRUE(contains(loud.err, "100 samples")) << loud.err;
  EXPECT_TRUE(contains(loud.err, "samples/s")) << loud.err;
  EXPECT_TRUE(contains(loud.err, "p50")) << loud.err;
  EXPECT_TRUE(contains(loud.err, "p99")) << loud.err;
  const CliResult quiet =
      run_tiny(100, fmt::format("--quiet --outputs y --output '{}'", path("y.npy")));
  ASSERT_EQ(quiet.code, 0) << quiet.err;
  EXPECT_EQ(quiet.err, "");
  EXPECT_EQ(read_npy(path("y.npy")).shape(), (std::vector<int64_t>{100, kUnits}));
}

TEST_F(CliTest, NpyOutputOfTwoOutputsNeedsOutputsOption) {
  const CliResult both = run_tiny(10, fmt::format("--output '{}'", path("o.npy")));
  EXPECT_EQ(both.code, 2);
  EXPECT_EQ(count_lines(both.err), 1) << both.err;
  EXPECT_TRUE(contains(both.err, "--outputs")) << both.err;
  EXPECT_FALSE(fs::exists(path("o.npy")));

  const CliResult one = run_tiny(10, fmt::format("--outputs h --output '{}'", path("o.npy")));
  ASSERT_EQ(one.code, 0) << one.err;
  const Tensor h = read_npy(path("o.npy"));
  const Tensor x = read_npy(path("x.npy"));
  // h is not clipped by Relu: spot-check one element against the formula.
  float expected = bias_.data<float>()[1];
  for (int64_t k = 0; k < kFeatures; ++k) {
    expected += x.data<float>()[3 * kFeatures + k] * weight_.data<float>()[k * kUnits + 1];
  }
  EXPECT_NEAR(h.data<float>()[3 * kUnits + 1], expected, 1e-5f);

  const CliResult unknown =
      run_tiny(10, fmt::format("--outputs nope --output '{}'", path("p.npy")));
  EXPECT_EQ(unknown.code, 2);
  EXPECT_EQ(count_lines(unknown.err), 1) << unknown.err;
  EXPECT_TRUE(contains(unknown.err, "'nope'")) << unknown.err;
  EXPECT_TRUE(contains(unknown.err, "outputs: y (float32")) << unknown.err;
  EXPECT_FALSE(fs::exists(path("p.npy")));
}

TEST_F(CliTest, MissingModelIsExitTwoWithOneLineNamingTheFile) {
  write_npy(path("x.npy"), random_floats({4, kFeatures}, 3));
  const CliResult result = cli(fmt::format("run '{}' --input '{}' --output '{}'",
                                           path("missing.onnx"), path("x.npy"), path("o.npy")));
  EXPECT_EQ(result.code, 2);
  EXPECT_EQ(count_lines(result.err), 1) << result.err;
  EXPECT_TRUE(result.err.starts_with("sparsecol: error: ")) << result.err;
  EXPECT_TRUE(contains(result.err, path("missing.onnx"))) << result.err;
}

TEST_F(CliTest, WrongInputDtypeIsExitTwoNamingInputAndTypes) {
  const std::string model = make_model();
  write_npy(path("xi.npy"), Tensor::zeros(DType::kInt32, {10, kFeatures}));
  const CliResult result = cli(fmt::format("run '{}' --input '{}' --outputs y --output '{}'", model,
                                           path("xi.npy"), path("o.npy")));
  EXPECT_EQ(result.code, 2);
  EXPECT_EQ(count_lines(result.err), 1) << result.err;
  for (const char* part : {"'x'", "float32", "int32"}) {
    EXPECT_TRUE(contains(result.err, part)) << part << " missing from " << result.err;
  }
  EXPECT_FALSE(fs::exists(path("o.npy")));
}

TEST_F(CliTest, WrongInputShapeIsExitTwo) {
  const std::string model = make_model();
  write_npy(path("x7.npy"), random_floats({10, kFeatures - 1}, 3));
  const CliResult result = cli(fmt::format("run '{}' --input '{}' --outputs y --output '{}'", model,
                                           path("x7.npy"), path("o.npy")));
  EXPECT_EQ(result.code, 2);
  EXPECT_EQ(count_lines(result.err), 1) << result.err;
  EXPECT_TRUE(contains(result.err, "[10, 7]")) << result.err;
}

TEST_F(CliTest, TruncatedInputIsExitTwo) {
  const std::string model = make_model();
  write_npy(path("x.npy"), random_floats({100, kFeatures}, 3));
  const std::string bytes = read_text(path("x.npy"));
  std::ofstream(path("cut.npy"), std::ios::binary) << bytes.substr(0, bytes.size() - 10);
  const CliResult result = cli(fmt::format("run '{}' --input '{}' --outputs y --output '{}'", model,
                                           path("cut.npy"), path("o.npy")));
  EXPECT_EQ(result.code, 2);
  EXPECT_EQ(count_lines(result.err), 1) << result.err;
  EXPECT_TRUE(contains(result.err, "truncated")) << result.err;
}

TEST_F(CliTest, UnknownOptionIsExitOne) {
  const std::string model = make_model();
  write_npy(path("x.npy"), random_floats({4, kFeatures}, 3));
  const CliResult result = cli(fmt::format("run '{}' --input '{}' --output '{}' --no-such-option",
                                           model, path("x.npy"), path("o.npz")));
  EXPECT_EQ(result.code, 1);
  EXPECT_TRUE(contains(result.err, "--no-such-option")) << result.err;
  EXPECT_EQ(cli("frobnicate").code, 1);
  EXPECT_EQ(cli("run").code, 1);  // MODEL, --input and --output are required
  EXPECT_EQ(cli(fmt::format("run '{}' -i x.npy -o o.npz --batch 0", model)).code, 1);
}

TEST_F(CliTest, InputsAreBoundByName) {
  const std::string model = make_model(/*second_input=*/true);
  write_npy(path("x.npy"), random_floats({20, kFeatures}, 3));
  write_npy(path("z.npy"), random_floats({20, kUnits}, 4));
  write_npy(path("z19.npy"), random_floats({19, kUnits}, 4));

  const CliResult named =
      cli(fmt::format("run '{}' --input x='{}' --input z='{}' --batch 6 -q "
                      "--outputs h --output '{}'",
                      model, path("x.npy"), path("z.npy"), path("h.npy")));
  ASSERT_EQ(named.code, 0) << named.err;
  const Tensor h = read_npy(path("h.npy"));
  const Tensor z = read_npy(path("z.npy"));
  const Tensor x = read_npy(path("x.npy"));
  float expected = z.data<float>()[19 * kUnits + 2];
  for (int64_t k = 0; k < kFeatures; ++k) {
    expected += x.data<float>()[19 * kFeatures + k] * weight_.data<float>()[k * kUnits + 2];
  }
  EXPECT_NEAR(h.data<float>()[19 * kUnits + 2], expected, 1e-5f);

  // An unnamed file is ambiguous with two inputs; the message lists them.
  const CliResult unnamed = cli(fmt::format("run '{}' --input '{}' --input '{}' --output '{}'",
                                            model, path("x.npy"), path("z.npy"), path("o.npz")));
  EXPECT_EQ(unnamed.code, 2);
  EXPECT_TRUE(contains(unnamed.err, "x (float32")) << unnamed.err;
  EXPECT_TRUE(contains(unnamed.err, "z (float32")) << unnamed.err;

  const CliResult wrong_name = cli(fmt::format("run '{}' --input q='{}' --input z='{}' -o '{}'",
                                               model, path("x.npy"), path("z.npy"), path("o.npz")));
  EXPECT_EQ(wrong_name.code, 2);
  EXPECT_TRUE(contains(wrong_name.err, "'q'")) << wrong_name.err;
  EXPECT_TRUE(contains(wrong_name.err, "inputs: x")) << wrong_name.err;

  const CliResult missing =
      cli(fmt::format("run '{}' --input x='{}' -o '{}'", model, path("x.npy"), path("o.npz")));
  EXPECT_EQ(missing.code, 2);
  EXPECT_TRUE(contains(missing.err, "'z'")) << missing.err;

  const CliResult uneven = cli(fmt::format("run '{}' --input x='{}' --input z='{}' -o '{}'", model,
                                           path("x.npy"), path("z19.npy"), path("o.npz")));
  EXPECT_EQ(uneven.code, 2);
  EXPECT_TRUE(contains(uneven.err, "20")) << uneven.err;
  EXPECT_TRUE(contains(uneven.err, "19")) << uneven.err;
  EXPECT_FALSE(fs::exists(path("o.npz")));
}

// Peak resident memory (KiB) of `sparsecol ARGS`, from the kernel's accounting of that one child.
long peak_rss_kib(const std::string& args) {
  const std::string command = fmt::format("exec {} {} >/dev/null 2>&1", SPARSECOL_CLI, args);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::execl("/bin/sh", "sh", "-c", command.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  int status = 0;
  struct rusage usage {};
  if (pid < 0 || ::wait4(pid, &status, 0, &usage) != pid) return -1;
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) return -1;
  return usage.ru_maxrss;
}

// A .npy is streamed: scoring 10x the samples (72 MiB more input) must not raise peak memory by
// more than a fraction of that. The model reduces each 4 KiB sample to one float, so the outputs
// held until the end stay small.
TEST_F(CliTest, RunMemoryStaysFlatAsTheInputGrows) {
  // ASan's quarantine holds every freed batch buffer for a while: peak RSS there says nothing
  // about the streaming. The Release job runs this test.
  if (test::kSanitized) GTEST_SKIP() << "peak memory is not meaningful under a sanitizer";
  constexpr int64_t kWidth = 1024;
  onnx::ModelProto model;
  model.set_ir_version(8);
  model.add_opset_import()->set_version(13);
  auto* graph = model.mutable_graph();
  graph->set_name("wide");
  set_type(graph->add_input(), "x", {-1, kWidth});
  add_initializer(graph, "W", random_floats({kWidth, 1}, 1));
  add_node(graph, "MatMul", {"x", "W"}, "y");
  set_type(graph->add_output(), "y", {-1, 1});
  save_model(model, path("wide.onnx"));
  long rss[2] = {0, 0};
  const int64_t samples[2] = {2000, 20000};
  for (int i = 0; i < 2; ++i) {
    const std::string input = path(fmt::format("x{}.npy", samples[i]));
    write_npy(input, random_floats({samples[i], kWidth}, 5));
    rss[i] = peak_rss_kib(fmt::format("run '{}' -i '{}' -o '{}' --batch 100 -q", path("wide.onnx"),
                                      input, path("y.npy")));
    ASSERT_GT(rss[i], 0) << "the run failed";
    EXPECT_EQ(read_npy(path("y.npy")).dim(0), samples[i]);
    fs::remove(input);
  }
  const long input_growth_kib = (samples[1] - samples[0]) * kWidth * 4 / 1024;  // 72 MiB
  EXPECT_LT(rss[1] - rss[0], input_growth_kib / 8)
      << "peak RSS " << rss[0] << " KiB for " << samples[0] << " samples, " << rss[1] << " KiB for "
      << samples[1];
}

// The same samples as .npy, as .npz members (named after the inputs, or one member named on the
// command line) and as TensorProto .pb files score to the same outputs.
TEST_F(CliTest, NpzAndTensorProtoInputsScoreLikeNpy) {
  const std::string model = make_model(/*second_input=*/true);
  const Tensor x = random_floats({30, kFeatures}, 3), z = random_floats({30, kUnits}, 4);
  write_npy(path("x.npy"), x);
  write_npy(path("z.npy"), z);
  write_npz(path("xz.npz"), {{"x", x}, {"z", z}});
  write_npz(path("only.npz"), {{"samples", z}});
  write_tensor_proto(path("x.pb"), "x", x);
  write_tensor_proto(path("anon.pb"), "", z);
  const std::string outputs = "--batch 7 -q --outputs y,h";

  const CliResult npy = cli(fmt::format("run '{}' -i x='{}' -i z='{}' {} -o '{}'", model,
                                        path("x.npy"), path("z.npy"), outputs, path("npy.npz")));
  ASSERT_EQ(npy.code, 0) << npy.err;
  const NamedTensors expected = read_npz(path("npy.npz"));
  ASSERT_EQ(expected.size(), 2u);

  const std::vector<std::string> variants = {
      fmt::format("-i '{}'", path("xz.npz")),  // one archive holds every input by name
      fmt::format("-i x='{}' -i z='{}'", path("xz.npz"), path("xz.npz")),
      fmt::format("-i '{}' -i z='{}'", path("x.pb"), path("only.npz")),  // .pb names its input
      fmt::format("-i x='{}' -i z='{}'", path("x.npy"), path("anon.pb")),
  };
  for (std::size_t v = 0; v < variants.size(); ++v) {
    SCOPED_TRACE(variants[v]);
    const std::string out = path(fmt::format("out{}.npz", v));
    const CliResult result =
        cli(fmt::format("run '{}' {} {} -o '{}'", model, variants[v], outputs, out));
    ASSERT_EQ(result.code, 0) << result.err;
    const NamedTensors actual = read_npz(out);
    ASSERT_EQ(actual.size(), expected.size());
    for (const auto& [name, tensor] : expected) {
      ASSERT_EQ(actual.at(name).shape(), tensor.shape()) << name;
      EXPECT_EQ(std::memcmp(actual.at(name).raw_data(), tensor.raw_data(), tensor.nbytes()), 0)
          << name;
    }
  }
}

TEST_F(CliTest, MissingNpzMemberOrUnknownFileTypeIsExitTwo) {
  const std::string model = make_model(/*second_input=*/true);
  write_npz(path("two.npz"),
            {{"a", random_floats({5, kFeatures}, 3)}, {"b", random_floats({5, kUnits}, 4)}});
  const CliResult member = cli(fmt::format("run '{}' -i x='{}' -i z='{}' -o '{}'", model,
                                           path("two.npz"), path("two.npz"), path("o.npz")));
  EXPECT_EQ(member.code, 2);
  EXPECT_EQ(count_lines(member.err), 1) << member.err;
  EXPECT_TRUE(contains(member.err, "no member 'x' (members: a, b)")) << member.err;

  const CliResult unnamed =
      cli(fmt::format("run '{}' -i '{}' -o '{}'", model, path("two.npz"), path("o.npz")));
  EXPECT_EQ(unnamed.code, 2);
  EXPECT_TRUE(contains(unnamed.err, "no member is named after a model input")) << unnamed.err;

  std::ofstream(path("x.csv")) << "1,2,3\n";
  const CliResult csv = run_tiny(5, fmt::format("-i '{}' -o '{}'", path("x.csv"), path("o.npz")));
  EXPECT_EQ(csv.code, 2);
  EXPECT_TRUE(contains(csv.err, "expected FILE.npy, FILE.npz or FILE.pb")) << csv.err;
  EXPECT_FALSE(fs::exists(path("o.npz")));
}

// A trace is a Chrome trace-event JSON object: one complete event per node run of each batch,
// each on a named thread track of a named process.
TEST_F(CliTest, RunTraceIsChromeTraceJsonWithOneSlicePerNodeAndBatch) {
  const CliResult result = run_tiny(
      50, fmt::format("--batch 10 -q --trace '{}' -o '{}'", path("t.json"), path("o.npz")));
  ASSERT_EQ(result.code, 0) << result.err;
  const nlohmann::json trace = nlohmann::json::parse(read_text(path("t.json")));
  int slices = 0, process_names = 0, thread_names = 0;
  std::map<std::string, int> per_node;
  double last_end = 0;
  for (const nlohmann::json& event : trace.at("traceEvents")) {
    const std::string phase = event.at("ph");
    if (phase == "M") {
      process_names += event.at("name") == "process_name";
      thread_names += event.at("name") == "thread_name";
      continue;
    }
    ASSERT_EQ(phase, "X") << event.dump();
    ++slices;
    ++per_node[event.at("name").get<std::string>()];
    EXPECT_FALSE(event.at("args").at("op").get<std::string>().empty());
    EXPECT_GE(event.at("dur").get<double>(), 0);
    EXPECT_GE(event.at("tid").get<int>(), 0);
    const double start = event.at("ts").get<double>();
    EXPECT_GE(start, 0);
    last_end = std::max(last_end, start + event.at("dur").get<double>());
  }
  EXPECT_EQ(process_names, 1);
  EXPECT_GE(thread_names, 1);
  ASSERT_FALSE(per_node.empty());
  // 5 batches: every node ran (and was traced) once per batch.
  for (const auto& [node, count] : per_node) EXPECT_EQ(count, 5) << node;
  EXPECT_EQ(trace.at("otherData").at("events").get<int>(), slices);
  EXPECT_FALSE(trace.at("otherData").at("truncated").get<bool>());
  EXPECT_GT(last_end, 0);
  // Written atomically: no temporary file is left.
  for (const auto& entry : fs::directory_iterator(dir_)) {
    EXPECT_FALSE(contains(entry.path().filename().string(), ".tmp")) << entry.path();
  }
}

TEST_F(CliTest, UnavailableScheduleIsExitTwoWithTheReason) {
  const CliResult result =
      run_tiny(4, fmt::format("--schedule cuda --outputs y -o '{}'", path("o.npy")));
  // A CUDA build on a machine with a GPU runs it; anywhere else the Engine says why not.
  if (result.code == 0) GTEST_SKIP() << "the cuda schedule runs here";
  EXPECT_EQ(result.code, 2);
  EXPECT_EQ(count_lines(result.err), 1) << result.err;
  std::string lower = result.err;
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  EXPECT_TRUE(contains(lower, "cuda")) << result.err;
}

TEST_F(CliTest, InspectPrintsInputsAndOutputs) {
  const CliResult result = cli(fmt::format("inspect '{}'", make_model()));
  ASSERT_EQ(result.code, 0) << result.err;
  EXPECT_TRUE(contains(result.out, "inputs")) << result.out;
  EXPECT_TRUE(contains(result.out, "[N, 8]")) << result.out;
  EXPECT_TRUE(contains(result.out, "MatMul")) << result.out;
  EXPECT_EQ(cli(fmt::format("inspect '{}'", path("missing.onnx"))).code, 2);
}

// The models exported by tests/models/export_models.py, when the fixture has made them.
TEST_F(CliTest, RunsExportedSmallCnn) {
  const std::string model = std::string(SPARSECOL_MODEL_DIR) + "/small_cnn.onnx";
  const std::string input = std::string(SPARSECOL_MODEL_DIR) + "/small_cnn.input.npy";
  if (!fs::exists(model) || !fs::exists(input)) GTEST_SKIP() << "no exported " << model;
  const CliResult result = cli(
      fmt::format("run '{}' --input '{}' --batch 3 --output '{}'", model, input, path("o.npz")));
  ASSERT_EQ(result.code, 0) << result.err;
  const NamedTensors outputs = read_npz(path("o.npz"));
  ASSERT_FALSE(outputs.empty());
  const int64_t samples = NpyReader(input).samples();
  for (const auto& [name, tensor] : outputs) EXPECT_EQ(tensor.dim(0), samples) << name;
  // PyTorch's output for the same input, saved by the export.
  const std::string expected_file = std::string(SPARSECOL_MODEL_DIR) + "/small_cnn.output.npy";
  if (outputs.size() == 1 && fs::exists(expected_file)) {
    const Tensor expected = read_npy(expected_file);
    const Tensor& actual = outputs.begin()->second;
    ASSERT_EQ(actual.shape(), expected.shape());
    for (int64_t i = 0; i < actual.numel(); ++i) {
      EXPECT_NEAR(actual.data<float>()[i], expected.data<float>()[i], 1e-4f) << "element " << i;
    }
  }
  EXPECT_EQ(cli(fmt::format("inspect '{}'", model)).code, 0);
}

}  // namespace
}  // namespace sparsecol
