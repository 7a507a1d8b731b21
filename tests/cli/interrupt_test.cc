// `sparsecol run` interrupted: SIGINT stops it after the batch in progress with a message and
// exit code 130, writing nothing; SIGKILL leaves nothing at the output path. In both cases an
// output file that looks complete but is not must never appear.
//
// The model (8 layers of 256x256 MatMul + Relu over 20000 samples, on one OpenMP thread) takes
// several seconds to score, so a signal sent a second after the start arrives mid-run.
// (The SIGINT test first waits for the handler to be installed, as /proc/PID/status shows.)
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>

#include "sparsecol/io.h"
#include "sparsecol/sparsecol.h"

extern char** environ;

namespace sparsecol {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kWidth = 256, kLayers = 8, kSamples = 20000;

void declare(onnx::ValueInfoProto* value, const std::string& name) {
  value->set_name(name);
  auto* tensor = value->mutable_type()->mutable_tensor_type();
  tensor->set_elem_type(onnx::TensorProto::FLOAT);
  tensor->mutable_shape()->add_dim()->set_dim_param("N");
  tensor->mutable_shape()->add_dim()->set_dim_value(kWidth);
}

// x[N, 256] -> (MatMul W_i -> Relu) x 8 -> y[N, 256].
void write_model(const std::string& path) {
  onnx::ModelProto model;
  model.set_ir_version(8);
  model.add_opset_import()->set_version(13);
  onnx::GraphProto* graph = model.mutable_graph();
  graph->set_name("deep_mlp");
  declare(graph->add_input(), "x");
  std::string previous = "x";
  std::vector<float> weights(static_cast<std::size_t>(kWidth * kWidth));
  for (std::size_t i = 0; i < weights.size(); ++i) {
    weights[i] = static_cast<float>(static_cast<int>(i % 13) - 6) / 64.0f;
  }
  for (int64_t layer = 0; layer < kLayers; ++layer) {
    const std::string w = fmt::format("W{}", layer), m = fmt::format("m{}", layer);
    const std::string out = layer + 1 == kLayers ? "y" : fmt::format("r{}", layer);
    onnx::TensorProto* init = graph->add_initializer();
    init->set_name(w);
    init->set_data_type(onnx::TensorProto::FLOAT);
    init->add_dims(kWidth);
    init->add_dims(kWidth);
    init->set_raw_data(weights.data(), weights.size() * sizeof(float));
    onnx::NodeProto* matmul = graph->add_node();
    matmul->set_op_type("MatMul");
    matmul->set_name(m);
    matmul->add_input(previous);
    matmul->add_input(w);
    matmul->add_output(m);
    onnx::NodeProto* relu = graph->add_node();
    relu->set_op_type("Relu");
    relu->set_name(out);
    relu->add_input(m);
    relu->add_output(out);
    previous = out;
  }
  declare(graph->add_output(), "y");
  std::ofstream file(path, std::ios::binary);
  ASSERT_TRUE(model.SerializeToOstream(&file));
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

class InterruptTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::path(SPARSECOL_TEST_TMPDIR) / "interrupt_test" / info->name();
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    write_model(path("model.onnx"));
    Tensor x = Tensor::zeros(DType::kFloat32, {kSamples, kWidth});
    for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = static_cast<float>(i % 17) / 8;
    write_npy(path("x.npy"), x);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  // Starts `sparsecol run` on the model, stderr to a file; returns its pid.
  pid_t start(const std::string& output) {
    const std::string stderr_path = path("stderr.txt");
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, stderr_path.c_str(),
                                     O_WRONLY | O_CREAT | O_TRUNC, 0644);
    std::vector<std::string> args = {
        SPARSECOL_CLI, "run", path("model.onnx"), "--input",  path("x.npy"), "--output", output,
        "--batch",     "64",  "--schedule",       "reference"};
    std::vector<char*> argv;
    for (std::string& arg : args) argv.push_back(arg.data());
    argv.push_back(nullptr);
    // One kernel thread, so that the run takes seconds on any machine.
    std::vector<std::string> env_strings = {"OMP_NUM_THREADS=1"};
    for (char** e = environ; *e != nullptr; ++e) {
      if (std::string(*e).rfind("OMP_NUM_THREADS=", 0) != 0) env_strings.emplace_back(*e);
    }
    std::vector<char*> envp;
    for (std::string& e : env_strings) envp.push_back(e.data());
    envp.push_back(nullptr);
    pid_t pid = -1;
    const int rc = posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), envp.data());
    posix_spawn_file_actions_destroy(&actions);
    EXPECT_EQ(rc, 0) << "cannot start " << SPARSECOL_CLI;
    return pid;
  }

  // Waits for `pid`; returns its wait status.
  static int wait_for(pid_t pid) {
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    return status;
  }

  // Waits until `pid` catches SIGINT (bit 2 of SigCgt in /proc/PID/status), i.e. until
  // `sparsecol run` has installed its handler; a signal sent before would kill it outright.
  static bool wait_until_catching_sigint(pid_t pid) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (std::chrono::steady_clock::now() < deadline) {
      std::ifstream status(fmt::format("/proc/{}/status", pid));
      std::string line;
      while (std::getline(status, line)) {
        if (line.rfind("SigCgt:", 0) != 0) continue;
        const uint64_t caught = std::stoull(line.substr(7), nullptr, 16);
        if ((caught >> (SIGINT - 1)) & 1) return true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  }

  // Files in the folder other than the inputs: what the run left behind.
  std::vector<std::string> leftovers() const {
    std::vector<std::string> names;
    for (const fs::directory_entry& entry : fs::directory_iterator(dir_)) {
      const std::string name = entry.path().filename().string();
      if (name != "model.onnx" && name != "x.npy" && name != "stderr.txt") names.push_back(name);
    }
    return names;
  }

  fs::path dir_;
};

TEST_F(InterruptTest, SigintStopsAfterTheCurrentBatchWithAMessageAndWritesNothing) {
  const std::string output = path("y.npy");
  const pid_t pid = start(output);
  ASSERT_GT(pid, 0);
  ASSERT_TRUE(wait_until_catching_sigint(pid));
  std::this_thread::sleep_for(std::chrono::seconds(1));  // into the scoring loop
  ASSERT_EQ(::kill(pid, SIGINT), 0);
  const auto signalled = std::chrono::steady_clock::now();
  const int status = wait_for(pid);
  const double stop_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - signalled).count();
  const std::string err = read_text(path("stderr.txt"));
  ASSERT_TRUE(WIFEXITED(status)) << "killed by signal " << WTERMSIG(status) << "; stderr: " << err;
  ASSERT_NE(WEXITSTATUS(status), 0) << "the run finished before the signal; stderr: " << err;
  EXPECT_EQ(WEXITSTATUS(status), 130) << err;
  const std::regex message(R"(interrupted after (\d+) of (\d+) samples.*nothing written to )");
  std::smatch match;
  ASSERT_TRUE(std::regex_search(err, match, message)) << err;
  const int64_t done = std::stoll(match[1]);
  EXPECT_EQ(std::stoll(match[2]), kSamples);
  EXPECT_LT(done, kSamples);
  EXPECT_EQ(done % 64, 0) << "stopped between batches of 64";
  EXPECT_NE(err.find(output), std::string::npos) << err;
  EXPECT_FALSE(fs::exists(output));
  EXPECT_TRUE(leftovers().empty()) << leftovers().front();
  // "After the current batch": one batch of 64 samples takes milliseconds, not the whole run.
  EXPECT_LT(stop_seconds, 5.0);
}

TEST_F(InterruptTest, SigkillLeavesNoFileAtTheOutputPath) {
  for (const char* name : {"y.npy", "y.npz"}) {
    SCOPED_TRACE(name);
    const std::string output = path(name);
    const pid_t pid = start(output);
    ASSERT_GT(pid, 0);
    std::this_thread::sleep_for(std::chrono::seconds(1));
    ASSERT_EQ(::kill(pid, SIGKILL), 0);
    const int status = wait_for(pid);
    ASSERT_TRUE(WIFSIGNALED(status))
        << "the run ended before the signal: " << read_text(path("stderr.txt"));
    EXPECT_EQ(WTERMSIG(status), SIGKILL);
    EXPECT_FALSE(fs::exists(output));
    // Only an unfinished temporary file may remain, never under the output's own name.
    for (const std::string& left : leftovers()) {
      EXPECT_NE(left, name);
      EXPECT_EQ(left.rfind(std::string(name) + ".tmp.", 0), 0u) << left;
    }
  }
}

// A run that is left alone still writes the whole output: the handler changes nothing else.
TEST_F(InterruptTest, UninterruptedRunOfAFewSamplesWritesTheOutput) {
  write_npy(path("x.npy"), Tensor::zeros(DType::kFloat32, {130, kWidth}));
  const std::string output = path("y.npy");
  const int status = wait_for(start(output));
  ASSERT_TRUE(WIFEXITED(status));
  ASSERT_EQ(WEXITSTATUS(status), 0) << read_text(path("stderr.txt"));
  EXPECT_EQ(read_npy(output).shape(), (std::vector<int64_t>{130, kWidth}));
}

}  // namespace
}  // namespace sparsecol
