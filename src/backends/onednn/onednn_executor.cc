// The oneDNN schedule: the whole graph as oneDNN (v2.6 API) primitives, op by op, the way a
// competent oneDNN user writes it. This is the dense baseline the other schedules are measured
// against, so it gets oneDNN's best path:
//
// - Conv (and pooling, eltwise and binary ops after it) run in the layouts oneDNN picks
//   (format_tag::any: nChw16c and friends on AVX-512); a reorder is inserted only where a
//   consumer needs another layout (plain row-major for MatMul, Softmax, reshapes, fallbacks),
//   and each value is reordered at most once per layout.
// - Fused epilogues (graph::EpilogueOp) become post-ops: eltwise relu/clip/gelu_erf, a `sum`
//   for the first residual Add (done in place in the residual's buffer when nobody reads it
//   afterwards), `binary_add` for any other Add. A MatMul's bias Add becomes the primitive's
//   bias.
// - Weights are reordered once, at build, into the layout the primitive asked for; a run only
//   executes the prebuilt primitives over prebuilt buffers. Activations live in a pool of
//   blocks, each buffer taking a block freed by buffers dead before its first use
//   (plan_memory).
// - Threads: oneDNN's Debian build runs on OpenMP (libgomp), so the thread count is OpenMP's,
//   set around build and run.
// - RNN, GRU and LSTM run as oneDNN's recurrent primitives (map_recurrent says which nodes).
//
// Ops without a primitive here (Gather, Expand, Where, ...) run their reference op
// (runtime::find_reference_op) on plain-layout buffers, with reorders around them; so does any
// node whose primitive oneDNN refuses to create (dnnl::error at build).
#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <numeric>
#include <optional>
#include <unordered_map>

#include <fmt/format.h>
#include <oneapi/dnnl/dnnl.hpp>

#include "graph/op_params.h"
#include "graph/ops_tensor.h"
#include "runtime/epilogue.h"
#include "runtime/executor.h"
#include "runtime/kernel_bindings.h"
#include "runtime/reference/reference_ops.h"

namespace sparsecol::runtime {

namespace {

using dnnl::algorithm;
using dnnl::memory;
using Dims = memory::dims;

// Sets OpenMP's thread count (oneDNN's Debian build runs on libgomp) for a scope and restores
// the caller's afterwards: oneDNN reads it both when it creates a primitive (blocking choices)
// and when it executes one.
class ScopedOmpThreads {
 public:
  explicit ScopedOmpThreads(int threads) : saved_(omp_get_max_threads()) {
    omp_set_num_threads(threads);
  }
  ~ScopedOmpThreads() { omp_set_num_threads(saved_); }
  ScopedOmpThreads(const ScopedOmpThreads&) = delete;
  ScopedOmpThreads& operator=(const ScopedOmpThreads&) = delete;

 private:
  int saved_;
};

// Row-major strides of `dims`.
Dims plain_strides(const Dims& dims) {
  Dims strides(dims.size(), 1);
  for (std::size_t i = dims.size(); i-- > 1;) strides[i - 1] = strides[i] * dims[i];
  return strides;
}

memory::desc plain_md(const Dims& dims) {
  return memory::desc(dims, memory::data_type::f32, plain_strides(dims));
}

memory::desc any_md(const Dims& dims) {
  return memory::desc(dims, memory::data_type::f32, memory::format_tag::any);
}

// oneDNN has no rank-0 tensors: a scalar is [1].
Dims to_dims(const std::vector<int64_t>& shape) {
  return shape.empty() ? Dims{1} : Dims(shape.begin(), shape.end());
}

// `dims` with 1s prepended up to `rank` (numpy broadcasting aligns shapes on the right).
Dims pad_rank(const Dims& dims, std::size_t rank) {
  Dims padded(rank > dims.size() ? rank - dims.size() : 0, 1);
  padded.insert(padded.end(), dims.begin(), dims.end());
  return padded;
}

int64_t product(const Dims& dims) {
  return std::accumulate(dims.begin(), dims.end(), int64_t{1}, std::multiplies<>());
}

// Thrown by an op mapper that cannot serve a node; the node then runs its reference op.
struct Unmapped {
  std::string reason;
};

// Where a value lives while the executor runs.
struct Slot {
  std::vector<int64_t> shape;
  DType dtype = DType::kFloat32;
  bool in_dnnl = false;  // float32 and rank <= DNNL_MAX_NDIMS: oneDNN primitives may read it
  memory::desc md;       // its layout (plain row-major for values outside oneDNN)
  int buffer = -1;
  // Copies of the value in other layouts, made for consumers that need them.
  std::vector<std::pair<memory::desc, int>> copies;
};

// Constants and reordered weights have their own storage from build on; every other buffer
// (activations, layout copies, scratch) gets a place in a shared arena once the whole graph is
// built, reusing the memory of buffers that are dead by then (plan_memory).
struct Buffer {
  Tensor storage;        // constants and weights only; shared with the graph for constants
  void* data = nullptr;  // null until plan_memory for arena buffers and always for inputs
  std::size_t bytes = 0;
  int graph_input = -1;     // value id when the caller provides the data at run time
  bool read_only = false;   // constants and caller inputs: never written
  std::vector<int> values;  // the values whose data this buffer holds (aliases of one another)
};

// One thing to do at run time: a primitive over prebuilt memories, or a reference op.
struct Step {
  int node = -1;  // the node it belongs to (a reorder: the node that reads the copy)
  std::optional<dnnl::primitive> primitive;
  std::unordered_map<int, memory> args;
  std::function<void(const std::vector<void*>&)> fallback;  // gets each buffer's data pointer
  std::vector<int> fallback_buffers;                        // the buffers the fallback touches
};

class OneDnnExecutor final : public Executor {
 public:
  OneDnnExecutor(graph::Graph graph, int threads)
      : graph_(std::move(graph)),
        threads_(threads),
        engine_(dnnl::engine::kind::cpu, 0),
        stream_(engine_) {
    ScopedOmpThreads omp(threads_);
    build();
    plan_memory();
  }

  NamedTensors run(const NamedTensors& inputs) override {
    ScopedOmpThreads omp(threads_);
    std::vector<void*> data(buffers_.size(), nullptr);
    for (std::size_t b = 0; b < buffers_.size(); ++b) {
      const Buffer& buffer = buffers_[b];
      if (buffer.graph_input >= 0) {
        const std::string& name = value(buffer.graph_input).name;
        // Inputs are only read; oneDNN's memory API takes a non-const handle.
        data[b] = const_cast<void*>(inputs.at(name).raw_data());
      } else {
        data[b] = buffer.data;
      }
    }
    for (auto& [memory_object, b] : input_memories_) memory_object.set_data_handle(data[b]);
    if (profiler_ != nullptr) profiler_->begin_run(1);
    // A node's steps are consecutive: one profile event each, which includes the reorders made
    // for the node, and ends when its last step has (the CPU stream runs them in order anyway).
    for (std::size_t i = 0; i < steps_.size();) {
      const int node = steps_[i].node;
      Profiler::Scope timed(profiler_, 0, graph_.nodes[static_cast<std::size_t>(node)]);
      for (; i < steps_.size() && steps_[i].node == node; ++i) {
        Step& step = steps_[i];
        if (step.primitive) {
          step.primitive->execute(stream_, step.args);
        } else {
          stream_.wait();
          step.fallback(data);
        }
      }
      if (profiler_ != nullptr) stream_.wait();
    }
    stream_.wait();
    NamedTensors outputs;
    for (int v : graph_.outputs) {
      const Slot& s = slot(v);
      Tensor out = Tensor::zeros(s.dtype, s.shape);
      if (s.in_dnnl && s.md != plain_md(to_dims(s.shape))) {
        memory src(s.md, engine_, data[static_cast<std::size_t>(s.buffer)]);
        memory dst(plain_md(to_dims(s.shape)), engine_, out.raw_data());
        dnnl::reorder(src, dst).execute(stream_, src, dst);
        stream_.wait();
      } else if (out.nbytes() > 0) {
        std::memcpy(out.raw_data(), data[static_cast<std::size_t>(s.buffer)], out.nbytes());
      }
      outputs[value(v).name] = std::move(out);
    }
    return outputs;
  }

  // oneDNN chooses its kernels inside the primitives; per node we only know it runs there.
  std::vector<LayerInfo> layers() const override {
    std::vector<LayerInfo> infos;
    for (std::size_t n = 0; n < graph_.nodes.size(); ++n) {
      infos.push_back(describe_node(graph_, graph_.nodes[n]));
      infos.back().implementation = falls_back_[n] ? "reference" : "onednn";
    }
    return infos;
  }

 private:
  const graph::Value& value(int id) const { return graph_.values[static_cast<std::size_t>(id)]; }
  Slot& slot(int id) { return slots_[static_cast<std::size_t>(id)]; }
  const Slot& slot(int id) const { return slots_[static_cast<std::size_t>(id)]; }
  Dims dims_of(int id) const { return to_dims(slot(id).shape); }
  bool is_constant(int id) const { return id >= 0 && value(id).constant.has_value(); }

  // ---- buffers and layouts ----

  int add_buffer(Buffer buffer, int value_id) {
    buffer.values.push_back(value_id);
    buffers_.push_back(std::move(buffer));
    return static_cast<int>(buffers_.size()) - 1;
  }

  // A fresh buffer of `bytes` in the arena, written by the value `value_id` (-1 for scratch).
  int new_buffer(std::size_t bytes, int value_id) {
    Buffer buffer;
    buffer.bytes = bytes;
    return add_buffer(std::move(buffer), value_id);
  }

  // Gives value `id` a fresh buffer in layout `md`.
  void define(int id, const memory::desc& md) {
    Slot& s = slot(id);
    s.md = md;
    s.buffer = new_buffer(md.get_size(), id);
  }

  // Makes value `id` share buffer `b` (a reshape), seen through `md`.
  void alias(int id, int b, const memory::desc& md) {
    slot(id).md = md;
    slot(id).buffer = b;
    buffers_[static_cast<std::size_t>(b)].values.push_back(id);
  }

  // A memory object over buffer `b` seen as `md`; bound to its arena place by plan_memory, or
  // to the caller's data at each run when `b` is a graph input.
  memory make_memory(int b, const memory::desc& md) {
    Buffer& buffer = buffers_[static_cast<std::size_t>(b)];
    if (buffer.data != nullptr) return memory(md, engine_, buffer.data);
    memory m(md, engine_, DNNL_MEMORY_NONE);
    (buffer.graph_input >= 0 ? input_memories_ : arena_memories_).emplace_back(m, b);
    return m;
  }

  void add_reorder(int src_buffer, const memory::desc& src_md, int dst_buffer,
                   const memory::desc& dst_md) {
    memory src = make_memory(src_buffer, src_md);
    memory dst = make_memory(dst_buffer, dst_md);
    Step step;
    step.primitive = dnnl::reorder(src, dst);
    step.args = {{DNNL_ARG_FROM, src}, {DNNL_ARG_TO, dst}};
    steps_.push_back(std::move(step));
  }

  // The buffer holding value `id` in layout `md`: its own, or a copy reordered once (at the
  // first consumer that needs it) and reused by later consumers.
  int in_layout(int id, const memory::desc& md) {
    Slot& s = slot(id);
    if (s.md == md) return s.buffer;
    for (const auto& [copy_md, b] : s.copies) {
      if (copy_md == md) return b;
    }
    // The copy is registered as holding `id`, so that its last reader protects it too.
    const int b = new_buffer(md.get_size(), id);
    add_reorder(s.buffer, s.md, b, md);
    slot(id).copies.emplace_back(md, b);
    return b;
  }

  int in_plain_layout(int id) {
    return slot(id).in_dnnl ? in_layout(id, plain_md(dims_of(id))) : slot(id).buffer;
  }

  // Weights and other constants: reordered into `md` now, once.
  int constant_in_layout(const Tensor& t, const memory::desc& src_md, const memory::desc& md) {
    if (src_md == md) {  // already in the wanted layout: use the graph's copy, no second one
      Buffer buffer;
      buffer.storage = t;
      buffer.data = buffer.storage.raw_data();
      buffer.bytes = t.nbytes();
      buffer.read_only = true;
      return add_buffer(std::move(buffer), -1);
    }
    Buffer buffer;
    buffer.storage =
        Tensor::zeros(DType::kFloat32, {static_cast<int64_t>((md.get_size() + 3) / sizeof(float))});
    buffer.data = buffer.storage.raw_data();
    buffer.bytes = md.get_size();
    const int b = add_buffer(std::move(buffer), -1);
    memory src(src_md, engine_, const_cast<void*>(t.raw_data()));
    memory dst(md, engine_, buffers_[static_cast<std::size_t>(b)].data);
    dnnl::reorder(src, dst).execute(stream_, src, dst);
    stream_.wait();
    return b;
  }

  // ---- memory planning ----

  // Places every arena buffer: each lives from the first to the last step that touches it
  // (graph outputs to the end of the run); a buffer takes the smallest free block that fits,
  // freed by buffers whose last step came before its first, or a new block. Peak memory is then
  // about the largest set of simultaneously live activations, as in any inference engine.
  void plan_memory() {
    const std::size_t none = std::numeric_limits<std::size_t>::max();
    std::vector<std::size_t> first(buffers_.size(), none), last(buffers_.size(), 0);
    std::unordered_map<dnnl_memory_t, int> memory_buffer;
    for (const auto& [m, b] : arena_memories_) memory_buffer[m.get()] = b;
    auto touch = [&](int b, std::size_t step) {
      const auto i = static_cast<std::size_t>(b);
      first[i] = std::min(first[i], step);
      last[i] = std::max(last[i], step);
    };
    for (std::size_t i = 0; i < steps_.size(); ++i) {
      for (const auto& [arg, m] : steps_[i].args) {
        auto it = memory_buffer.find(m.get());
        if (it != memory_buffer.end()) touch(it->second, i);
      }
      for (int b : steps_[i].fallback_buffers) touch(b, i);
    }
    for (int v : graph_.outputs) touch(slot(v).buffer, steps_.size());
    std::vector<int> order;
    for (std::size_t b = 0; b < buffers_.size(); ++b) {
      if (buffers_[b].data == nullptr && buffers_[b].graph_input < 0) {
        if (first[b] == none) first[b] = last[b] = 0;  // never touched: still give it a place
        order.push_back(static_cast<int>(b));
      }
    }
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
      return first[static_cast<std::size_t>(a)] < first[static_cast<std::size_t>(b)];
    });
    std::vector<std::pair<std::size_t, int>> busy;  // (last step, block) of placed buffers
    std::vector<int> free_blocks;
    for (int b : order) {
      const auto i = static_cast<std::size_t>(b);
      std::erase_if(busy, [&](const std::pair<std::size_t, int>& placed) {
        if (placed.first >= first[i]) return false;
        free_blocks.push_back(placed.second);
        return true;
      });
      const std::size_t bytes = std::max<std::size_t>(buffers_[i].bytes, 1);
      auto fits = [&](int block) {
        return arena_[static_cast<std::size_t>(block)].nbytes() >= bytes;
      };
      auto best = free_blocks.end();
      for (auto it = free_blocks.begin(); it != free_blocks.end(); ++it) {
        if (fits(*it) &&
            (best == free_blocks.end() || arena_[static_cast<std::size_t>(*it)].nbytes() <
                                              arena_[static_cast<std::size_t>(*best)].nbytes())) {
          best = it;
        }
      }
      int block;
      if (best != free_blocks.end()) {
        block = *best;
        free_blocks.erase(best);
      } else {
        arena_.push_back(
            Tensor::zeros(DType::kFloat32, {static_cast<int64_t>((bytes + 3) / sizeof(float))}));
        block = static_cast<int>(arena_.size()) - 1;
      }
      buffers_[i].data = arena_[static_cast<std::size_t>(block)].raw_data();
      busy.emplace_back(last[i], block);
    }
    for (auto& [m, b] : arena_memories_)
      m.set_data_handle(buffers_[static_cast<std::size_t>(b)].data);
  }

  // ---- build ----

  void build() {
    slots_.resize(graph_.values.size());
    last_reader_.assign(graph_.values.size(), -1);
    for (std::size_t n = 0; n < graph_.nodes.size(); ++n) {
      for (int v : graph_.nodes[n].inputs) {
        if (v >= 0) last_reader_[static_cast<std::size_t>(v)] = static_cast<int>(n);
      }
    }
    for (int v : graph_.outputs) last_reader_[static_cast<std::size_t>(v)] = kGraphOutput;
    for (std::size_t i = 0; i < graph_.values.size(); ++i) {
      const graph::Value& v = graph_.values[i];
      std::optional<std::vector<int64_t>> dims = v.shape ? graph::concrete(*v.shape) : std::nullopt;
      if (!dims) {
        if (v.producer < 0 && !v.constant) continue;  // an unused value
        throw Error(ErrorCode::kInternal,
                    fmt::format("{}: value '{}' has no concrete shape after specialization",
                                graph_.source, v.name));
      }
      Slot& s = slots_[i];
      s.shape = *dims;
      s.dtype = v.dtype;
      s.in_dnnl = v.dtype == DType::kFloat32 && s.shape.size() <= DNNL_MAX_NDIMS;
      if (s.in_dnnl) s.md = plain_md(to_dims(s.shape));
    }
    for (std::size_t i = 0; i < graph_.values.size(); ++i) {
      if (!graph_.values[i].constant) continue;
      Buffer buffer;
      buffer.storage = *graph_.values[i].constant;
      buffer.data = buffer.storage.raw_data();
      buffer.bytes = buffer.storage.nbytes();
      buffer.read_only = true;
      slots_[i].buffer = add_buffer(std::move(buffer), static_cast<int>(i));
    }
    for (int v : graph_.inputs) {
      Buffer buffer;
      buffer.graph_input = v;
      buffer.read_only = true;
      slot(v).buffer = add_buffer(std::move(buffer), v);
    }
    falls_back_.assign(graph_.nodes.size(), false);
    for (std::size_t n = 0; n < graph_.nodes.size(); ++n) {
      node_index_ = static_cast<int>(n);
      const std::size_t first_step = steps_.size();
      build_node(graph_.nodes[n]);
      for (std::size_t i = first_step; i < steps_.size(); ++i) steps_[i].node = node_index_;
    }
  }

  void build_node(const graph::Node& node) {
    const std::size_t steps_before = steps_.size();
    const std::size_t buffers_before = buffers_.size();
    std::vector<std::pair<int, Slot>> slots_before;  // the slots this node may change
    for (int v : node.inputs) {
      if (v >= 0) slots_before.emplace_back(v, slot(v));
    }
    for (int v : node.outputs) {
      if (v >= 0) slots_before.emplace_back(v, slot(v));
    }
    const std::size_t memories_before = input_memories_.size();
    const std::size_t arena_memories_before = arena_memories_.size();
    try {
      if (map_node(node)) return;
    } catch (const dnnl::error& e) {
      // oneDNN has no implementation for this configuration: undo and fall back.
      if (verbose()) {
        fmt::print(stderr, "sparsecol onednn: {}: {} (reference op instead)\n", graph_.where(node),
                   e.what());
      }
    } catch (const Unmapped& u) {
      if (verbose()) {
        fmt::print(stderr, "sparsecol onednn: {}: {} (reference op instead)\n", graph_.where(node),
                   u.reason);
      }
    }
    steps_.resize(steps_before);
    buffers_.resize(buffers_before);
    for (Buffer& b : buffers_) {
      std::erase_if(b.values, [&](int v) { return v >= 0 && is_output_of(node, v); });
    }
    for (auto& [v, saved] : slots_before) slot(v) = std::move(saved);
    input_memories_.resize(memories_before);
    arena_memories_.resize(arena_memories_before);
    add_fallback(node);
  }

  static bool is_output_of(const graph::Node& node, int v) {
    return std::find(node.outputs.begin(), node.outputs.end(), v) != node.outputs.end();
  }

  static bool verbose() {
    const char* env = std::getenv("SPARSECOL_VERBOSE");
    return env != nullptr && std::string(env) == "1";
  }

  // Emits the node's steps; false (or Unmapped, or a dnnl::error) sends it to the fallback.
  bool map_node(const graph::Node& node) {
    for (int v : node.inputs) {
      if (v >= 0 && slot(v).in_dnnl && product(dims_of(v)) == 0) throw Unmapped{"empty tensor"};
    }
    const std::string& op = node.op_type;
    if (op == "Conv") return map_conv(node);
    if (op == "ConvTranspose") return map_conv_transpose(node);
    if (op == "MatMul" || op == "Gemm") return map_matmul(node);
    if (op == "Einsum") return map_einsum(node);
    if (op == "MaxPool" || op == "AveragePool" || op == "GlobalAveragePool" ||
        op == "GlobalMaxPool") {
      return map_pool(node);
    }
    if (op == "Softmax" || op == "LogSoftmax") return map_softmax(node);
    if (op == "LayerNormalization") return map_layer_norm(node);
    if (op == "Add" || op == "Sub" || op == "Mul" || op == "Div" || op == "Max" || op == "Min") {
      return map_binary(node);
    }
    if (op == "Reshape" || op == "Flatten" || op == "Squeeze" || op == "Unsqueeze" ||
        op == "Identity" || op == "Dropout") {
      return map_reshape(node);
    }
    if (op == "Transpose") return map_transpose(node);
    if (op == "Concat") return map_concat(node);
    if (op == "RNN" || op == "GRU" || op == "LSTM") return map_recurrent(node);
    return map_eltwise(node);
  }

  // Every float input and output of the node lives in oneDNN memory.
  bool all_in_dnnl(const graph::Node& node) const {
    for (int v : node.inputs) {
      if (v >= 0 && !slot(v).in_dnnl) return false;
    }
    for (int v : node.outputs) {
      if (v < 0 || !slot(v).in_dnnl) return false;
    }
    return true;
  }

  // The node's outputs other than the first are absent or unread.
  bool extra_outputs_unused(const graph::Node& node) const {
    for (std::size_t i = 1; i < node.outputs.size(); ++i) {
      if (node.outputs[i] >= 0 && last_reader_[static_cast<std::size_t>(node.outputs[i])] != -1) {
        return false;
      }
    }
    return true;
  }

  // ---- epilogues as post-ops ----

  struct PostOps {
    dnnl::post_ops ops;
    int sum_operand = -1;  // the value a `sum` post-op adds (it must be in dst first)
    std::vector<std::pair<int, int>> binary;  // (post-op index, value) of binary_add operands
    std::vector<memory::desc> binary_mds;
  };

  // The node's epilogue, from index `first` on, as post-ops on a destination of `dst_dims`
  // (MatMul's may be the output's dims with the batch folded into the rows). With
  // `residual_md`, full-size residual Adds become binary_add post-ops reading the residual in
  // that layout instead of a `sum`.
  PostOps make_post_ops(const graph::Node& node, std::size_t first, const Dims& dst_dims,
                        const std::optional<memory::desc>& residual_md = std::nullopt) {
    PostOps post;
    const Dims out_dims = dims_of(node.outputs.at(0));
    for (std::size_t i = first; i < node.epilogue.size(); ++i) {
      const graph::EpilogueOp& op = node.epilogue[i];
      switch (op.kind) {
        case graph::EpilogueOp::Kind::kRelu:
          post.ops.append_eltwise(1.0f, algorithm::eltwise_relu, 0.0f, 0.0f);
          break;
        case graph::EpilogueOp::Kind::kClip:
          post.ops.append_eltwise(1.0f, algorithm::eltwise_clip_v2, op.min, op.max);
          break;
        case graph::EpilogueOp::Kind::kGelu:
          post.ops.append_eltwise(1.0f, algorithm::eltwise_gelu_erf, 0.0f, 0.0f);
          break;
        case graph::EpilogueOp::Kind::kAdd: {
          const int operand = node.inputs.at(static_cast<std::size_t>(op.input));
          if (!slot(operand).in_dnnl) throw Unmapped{"a fused Add operand oneDNN cannot read"};
          const Dims operand_dims = dims_of(operand);
          const bool full = operand_dims == out_dims;
          if (full && !is_constant(operand) && residual_md) {
            post.binary.emplace_back(post.ops.len(), operand);
            post.binary_mds.push_back(*residual_md);
            post.ops.append_binary(algorithm::binary_add, *residual_md);
            break;
          }
          if (full && post.sum_operand < 0 && !is_constant(operand)) {
            post.sum_operand = operand;
            post.ops.append_sum(1.0f);
            break;
          }
          Dims dims = full ? dst_dims : operand_dims;
          while (dims.size() > dst_dims.size() && dims.front() == 1) dims.erase(dims.begin());
          if (dims.size() > dst_dims.size()) throw Unmapped{"fused Add operand has a higher rank"};
          const memory::desc md = plain_md(pad_rank(dims, dst_dims.size()));
          post.binary.emplace_back(post.ops.len(), operand);
          post.binary_mds.push_back(md);
          post.ops.append_binary(algorithm::binary_add, md);
          break;
        }
      }
    }
    return post;
  }

  // Wires the post-ops' operands into `step` and gives the node's output its buffer in
  // layout `dst_md`: the residual's own buffer when the sum can run in place, else a fresh one
  // that the residual is copied into before the primitive runs.
  void bind_post_ops_and_output(const graph::Node& node, const PostOps& post,
                                const memory::desc& dst_md, Step& step) {
    for (std::size_t i = 0; i < post.binary.size(); ++i) {
      const auto& [index, operand] = post.binary[i];
      const memory::desc& md = post.binary_mds[i];
      const int b = md == plain_md(md.dims()) ? in_plain_layout(operand) : in_layout(operand, md);
      step.args[DNNL_ARG_ATTR_MULTIPLE_POST_OP(index) | DNNL_ARG_SRC_1] = make_memory(b, md);
    }
    const int out = node.outputs[0];
    const int residual = post.sum_operand;
    // A plain residual is also a plain destination of other (flattened) dims.
    const bool plain_dst = dst_md == plain_md(dst_md.dims());
    const bool same_layout =
        residual >= 0 && (slot(residual).md == dst_md ||
                          (plain_dst && slot(residual).md == plain_md(dims_of(residual))));
    if (same_layout && can_overwrite(node, residual)) {
      alias(out, slot(residual).buffer, dst_md);
    } else {
      define(out, dst_md);
      if (residual >= 0 && plain_dst) {
        add_reorder(in_plain_layout(residual), dst_md, slot(out).buffer, dst_md);
      } else if (residual >= 0) {
        add_reorder(slot(residual).buffer, slot(residual).md, slot(out).buffer, dst_md);
      }
    }
    step.args[DNNL_ARG_DST] = make_memory(slot(out).buffer, dst_md);
  }

  // True when node `node` is the last reader of every value in `id`'s buffer, none of them is a
  // graph output, and the node does not read the buffer otherwise: the sum may overwrite it.
  bool can_overwrite(const graph::Node& node, int id) const {
    const Buffer& buffer = buffers_[static_cast<std::size_t>(slot(id).buffer)];
    if (buffer.read_only) return false;
    for (int v : buffer.values) {
      if (v < 0 || last_reader_[static_cast<std::size_t>(v)] > node_index_) return false;
    }
    for (std::size_t i = 0; i < node.own_input_count(); ++i) {
      const int v = node.inputs[i];
      if (v >= 0 && slot(v).buffer == slot(id).buffer) return false;
    }
    return true;
  }

  // ---- op mappers ----

  // Conv's or ConvTranspose's parameters; weights or a bias that are not constants are refused.
  graph::ConvParams constant_conv_params(const graph::Node& node, bool transposed) const {
    const int x = node.input(0), w = node.input(1), bias = node.input(2);
    if (!is_constant(w) || (bias >= 0 && !is_constant(bias))) {
      throw Unmapped{"weights or bias are not constant"};
    }
    std::optional<std::vector<int64_t>> bias_shape;
    if (bias >= 0) bias_shape = slot(bias).shape;
    return (transposed ? graph::parse_conv_transpose : graph::parse_conv)(
        graph_, node, slot(x).shape, slot(w).shape, bias_shape);
  }

  // The step of a (de)convolution primitive: its weight reordered once from `w_plain` into the
  // layout the primitive chose, the bias, the source and the post-ops.
  template <typename PrimitiveDesc>
  void push_conv_step(const graph::Node& node, dnnl::primitive primitive, const PrimitiveDesc& pd,
                      const memory::desc& w_plain, const memory::desc& bias_md,
                      const PostOps& post) {
    const int x = node.input(0), w = node.input(1), bias = node.input(2);
    Step step;
    step.primitive = std::move(primitive);
    const int wb = constant_in_layout(*value(w).constant, w_plain, pd.weights_desc());
    step.args[DNNL_ARG_WEIGHTS] = make_memory(wb, pd.weights_desc());
    if (bias >= 0) step.args[DNNL_ARG_BIAS] = make_memory(slot(bias).buffer, bias_md);
    step.args[DNNL_ARG_SRC] = make_memory(in_layout(x, pd.src_desc()), pd.src_desc());
    bind_post_ops_and_output(node, post, pd.dst_desc(), step);
    steps_.push_back(std::move(step));
  }

  bool map_conv(const graph::Node& node) {
    if (!all_in_dnnl(node)) return false;
    const int x = node.input(0), w = node.input(1), bias = node.input(2);
    const graph::ConvParams p = constant_conv_params(node, /*transposed=*/false);
    const graph::WindowParams& win = p.window;
    Dims w_dims = dims_of(w);
    if (p.group > 1) {
      w_dims[0] /= p.group;
      w_dims.insert(w_dims.begin(), p.group);
    }
    Dims dilations;
    for (int64_t d : win.dilations) dilations.push_back(d - 1);  // oneDNN counts the gaps
    const Dims dst_dims = to_dims(p.output_shape());
    const memory::desc bias_md = bias >= 0 ? plain_md({p.out_channels}) : memory::desc();
    const dnnl::convolution_forward::desc desc(
        dnnl::prop_kind::forward_inference, algorithm::convolution_direct, any_md(dims_of(x)),
        any_md(w_dims), bias_md, any_md(dst_dims), Dims(win.strides.begin(), win.strides.end()),
        dilations, Dims(win.pads_begin.begin(), win.pads_begin.end()),
        Dims(win.pads_end.begin(), win.pads_end.end()));
    auto make_pd = [&](const PostOps& post) {
      dnnl::primitive_attr attr;
      attr.set_post_ops(post.ops);
      return dnnl::convolution_forward::primitive_desc(desc, attr, engine_);
    };
    PostOps post = make_post_ops(node, 0, dst_dims);
    dnnl::convolution_forward::primitive_desc pd = make_pd(post);
    // The JIT convolutions of oneDNN 2.6 take a `sum` only as the first post-op (ResNet's
    // [Add, Relu] is fine, [Relu, Add] is not) and a full-size binary operand only in the
    // destination's layout; otherwise they fall to the reference or GEMM-based implementation.
    // Then residuals come in as binary_add post-ops in the layout that the convolution without
    // them picks.
    auto is_slow = [](const dnnl::primitive_desc_base& candidate) {
      const std::string impl = candidate.impl_info_str();
      return impl.starts_with("ref") || impl.find("gemm") != std::string::npos;
    };
    if ((post.sum_operand >= 0 || !post.binary.empty()) && is_slow(pd)) {
      const memory::desc preferred = make_pd(PostOps{}).dst_desc();
      PostOps binary = make_post_ops(node, 0, dst_dims, preferred);
      dnnl::convolution_forward::primitive_desc binary_pd = make_pd(binary);
      if (!is_slow(binary_pd)) {
        post = std::move(binary);
        pd = std::move(binary_pd);
      }
    }
    push_conv_step(node, dnnl::convolution_forward(pd), pd, plain_md(w_dims), bias_md, post);
    return true;
  }

  // ConvTranspose as oneDNN's deconvolution. Its weight, ONNX's [C, M / group, kernel...], is
  // oneDNN's (g)iohw: the same memory read with the output channels first.
  bool map_conv_transpose(const graph::Node& node) {
    if (!all_in_dnnl(node)) return false;
    const int x = node.input(0), bias = node.input(2);
    const graph::ConvParams p = constant_conv_params(node, /*transposed=*/true);
    const graph::WindowParams& win = p.window;
    if (win.rank() != 2) throw Unmapped{"not a 2-D transposed convolution"};
    const int64_t in_c = p.in_channels / p.group, out_c = p.out_channels / p.group;
    const Dims kernel(win.kernel.begin(), win.kernel.end());
    Dims w_dims = {out_c, in_c, kernel[0], kernel[1]};
    memory::format_tag w_tag = memory::format_tag::iohw;
    if (p.group > 1) {
      w_dims.insert(w_dims.begin(), p.group);
      w_tag = memory::format_tag::giohw;
    }
    Dims dilations, pads_end;
    for (int i = 0; i < 2; ++i) {
      dilations.push_back(win.dilations[i] - 1);  // oneDNN counts the gaps
      // The end padding that gives the output's size; output_padding makes it smaller.
      pads_end.push_back((win.in_size[i] - 1) * win.strides[i] +
                         (win.kernel[i] - 1) * win.dilations[i] + 1 - win.pads_begin[i] -
                         win.out_size[i]);
    }
    const Dims dst_dims = to_dims(p.output_shape());
    const memory::desc bias_md = bias >= 0 ? plain_md({p.out_channels}) : memory::desc();
    const dnnl::deconvolution_forward::desc desc(
        dnnl::prop_kind::forward_inference, algorithm::deconvolution_direct, any_md(dims_of(x)),
        any_md(w_dims), bias_md, any_md(dst_dims), Dims(win.strides.begin(), win.strides.end()),
        dilations, Dims(win.pads_begin.begin(), win.pads_begin.end()), pads_end);
    dnnl::primitive_attr attr;
    const PostOps post = make_post_ops(node, 0, dst_dims);
    attr.set_post_ops(post.ops);
    const dnnl::deconvolution_forward::primitive_desc pd(desc, attr, engine_);
    push_conv_step(node, dnnl::deconvolution_forward(pd), pd,
                   memory::desc(w_dims, memory::data_type::f32, w_tag), bias_md, post);
    return true;
  }

  // MatMul (numpy batching) and Gemm as oneDNN matmul. A constant right operand is reordered
  // once into the layout matmul prefers; with 2-D constant weights the batch dimensions of A
  // fold into M, so BERT's linear layers run as one [tokens, K] x [K, N] product.
  bool map_matmul(const graph::Node& node) {
    if (!all_in_dnnl(node)) return false;
    const int a = node.input(0), b = node.input(1);
    const bool gemm = node.op_type == "Gemm";
    Dims a_dims, a_strides, b_dims, b_strides, dst_dims;
    float alpha = 1.0f;
    std::optional<Tensor> bias;  // plain, dims bias_dims
    Dims bias_dims;
    std::size_t first_epilogue = 0;
    if (gemm) {
      const int c = node.input(2);
      std::optional<std::vector<int64_t>> c_shape;
      if (c >= 0) c_shape = slot(c).shape;
      const graph::GemmParams p =
          graph::parse_gemm(graph_, node, slot(a).shape, slot(b).shape, c_shape);
      a_dims = {p.m, p.k};
      a_strides = p.trans_a ? Dims{1, p.m} : Dims{p.k, 1};
      b_dims = {p.k, p.n};
      b_strides = p.trans_b ? Dims{1, p.k} : Dims{p.n, 1};
      dst_dims = {p.m, p.n};
      alpha = p.alpha;
      if (c >= 0 && p.beta != 0.0f) {
        if (!is_constant(c)) throw Unmapped{"Gemm's C is not constant"};
        bias_dims = pad_rank(dims_of(c), 2);
        bias = value(c).constant->clone();
        for (int64_t i = 0; i < bias->numel(); ++i) bias->data<float>()[i] *= p.beta;
      }
    } else {
      const graph::MatMulParams p = graph::parse_matmul(graph_, node, slot(a).shape, slot(b).shape);
      bool b_batched = false;
      for (int64_t d : p.b_batch) b_batched = b_batched || d != 1;
      if (is_constant(b) && !b_batched) {
        a_dims = {product(Dims(p.a_batch.begin(), p.a_batch.end())) * p.m, p.k};
        dst_dims = {a_dims[0], p.n};
        b_dims = {p.k, p.n};
      } else {
        a_dims = Dims(p.a_batch.begin(), p.a_batch.end());
        a_dims.insert(a_dims.end(), {p.m, p.k});
        b_dims = Dims(p.b_batch.begin(), p.b_batch.end());
        b_dims.insert(b_dims.end(), {p.k, p.n});
        dst_dims = Dims(p.batch.begin(), p.batch.end());
        dst_dims.insert(dst_dims.end(), {p.m, p.n});
      }
      a_strides = plain_strides(a_dims);
      b_strides = plain_strides(b_dims);
      // The bias Add of a Linear layer becomes matmul's bias.
      if (!node.epilogue.empty() && node.epilogue[0].kind == graph::EpilogueOp::Kind::kAdd) {
        const int operand = node.inputs.at(static_cast<std::size_t>(node.epilogue[0].input));
        if (is_constant(operand) && slot(operand).in_dnnl && slot(operand).shape.size() == 1 &&
            slot(operand).shape[0] == p.n) {
          bias = *value(operand).constant;
          bias_dims = pad_rank({p.n}, dst_dims.size());
          first_epilogue = 1;
        }
      }
    }
    if (alpha != 1.0f && !is_constant(b)) throw Unmapped{"alpha != 1 with a non-constant B"};
    const PostOps post = make_post_ops(node, first_epilogue, dst_dims);
    dnnl::primitive_attr attr;
    attr.set_post_ops(post.ops);
    const memory::desc a_md(a_dims, memory::data_type::f32, a_strides);
    const memory::desc b_md(b_dims, memory::data_type::f32, b_strides);
    const memory::desc bias_md = bias ? plain_md(bias_dims) : memory::desc();
    const memory::desc b_want = is_constant(b) ? any_md(b_dims) : b_md;
    dnnl::matmul::desc desc(a_md, b_want, bias_md, plain_md(dst_dims));
    dnnl::matmul::primitive_desc pd(desc, attr, engine_);
    Step step;
    step.primitive = dnnl::matmul(pd);
    step.args[DNNL_ARG_SRC] = make_memory(in_plain_layout(a), a_md);
    if (is_constant(b)) {
      Tensor weights = *value(b).constant;
      if (alpha != 1.0f) {  // alpha folds into the constant weights
        weights = weights.clone();
        for (int64_t i = 0; i < weights.numel(); ++i) weights.data<float>()[i] *= alpha;
      }
      const int wb = constant_in_layout(weights, b_md, pd.weights_desc());
      step.args[DNNL_ARG_WEIGHTS] = make_memory(wb, pd.weights_desc());
    } else {
      step.args[DNNL_ARG_WEIGHTS] = make_memory(in_plain_layout(b), b_md);
    }
    if (bias) {
      const int bb = constant_in_layout(*bias, bias_md, bias_md);
      step.args[DNNL_ARG_BIAS] = make_memory(bb, bias_md);
    }
    // matmul's destination is plain; the value's own dims (maybe unflattened) share its bytes.
    bind_post_ops_and_output(node, post, plain_md(dst_dims), step);
    const int out = node.outputs[0];
    slot(out).md = plain_md(dims_of(out));
    return push(std::move(step));
  }

  // An Einsum of two operands as one batched matmul, [batch, M, K] x [batch, K, N] ->
  // [batch, M, N] (graph::einsum_product): an operand whose labels are not in that order is
  // gathered into it by a reorder first, and a product whose labels are not in the output's order
  // is reordered into the output.
  bool map_einsum(const graph::Node& node) {
    if (!all_in_dnnl(node) || !node.epilogue.empty()) return false;
    if (node.inputs.size() != 2) throw Unmapped{"not two operands (no product for matmul)"};
    const int out = node.outputs[0];
    for (int v : {node.input(0), node.input(1), out}) {
      if (slot(v).shape.empty()) throw Unmapped{"a scalar operand or output"};
    }
    const graph::EinsumProduct p = graph::einsum_product(
        graph::resolve_einsum(graph::InferContext(graph_, node), node.attr_string("equation", ""),
                              {slot(node.input(0)).shape, slot(node.input(1)).shape}));
    if (p.batch * p.m * p.n == 0) throw Unmapped{"empty tensor"};
    // The buffer holding operand `v` as a dense [shape] block.
    auto gathered = [&](int v, const std::vector<int64_t>& shape,
                        const std::vector<int64_t>& strides) {
      const memory::desc md = strided_md(shape, strides);
      const memory::desc dense = plain_md(md.dims());
      if (md == dense) return in_plain_layout(v);
      const int b = new_buffer(dense.get_size(), -1);
      add_reorder(in_plain_layout(v), md, b, dense);
      return b;
    };
    const int a = gathered(node.input(0), p.a_shape, p.a_strides);
    const int b = gathered(node.input(1), p.b_shape, p.b_strides);
    const memory::desc c_md = strided_md(p.c_shape, p.c_strides);
    const memory::desc c_dense = plain_md(c_md.dims());
    define(out, plain_md(dims_of(out)));
    const int c = c_md == c_dense ? slot(out).buffer : new_buffer(c_dense.get_size(), -1);
    const memory::desc a_md = plain_md({p.batch, p.m, p.k}), b_md = plain_md({p.batch, p.k, p.n}),
                       product_md = plain_md({p.batch, p.m, p.n});
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a_md, b_md, product_md), engine_);
    Step step;
    step.primitive = dnnl::matmul(pd);
    step.args[DNNL_ARG_SRC] = make_memory(a, a_md);
    step.args[DNNL_ARG_WEIGHTS] = make_memory(b, b_md);
    step.args[DNNL_ARG_DST] = make_memory(c, product_md);
    push(std::move(step));
    if (c != slot(out).buffer) add_reorder(c, c_dense, slot(out).buffer, c_md);
    return true;
  }

  // `shape` read through element `strides`, its size-1 dimensions left out (their strides do not
  // matter, and oneDNN checks them).
  static memory::desc strided_md(const std::vector<int64_t>& shape,
                                 const std::vector<int64_t>& strides) {
    Dims dims, steps;
    for (std::size_t i = 0; i < shape.size(); ++i) {
      if (shape[i] == 1) continue;
      // An operand repeated along a label only the other one has and the product sums over.
      if (strides[i] == 0) throw Unmapped{"a label summed in one operand only (a stride-0 read)"};
      dims.push_back(shape[i]);
      steps.push_back(strides[i]);
    }
    if (dims.size() > DNNL_MAX_NDIMS) throw Unmapped{"more labels than oneDNN's dimensions"};
    if (dims.empty()) return plain_md({1});
    return memory::desc(dims, memory::data_type::f32, steps);
  }

  bool push(Step step) {
    steps_.push_back(std::move(step));
    return true;
  }

  bool map_pool(const graph::Node& node) {
    if (!all_in_dnnl(node) || node.outputs.size() != 1) return false;
    const int x = node.input(0);
    const Dims x_dims = dims_of(x);
    if (x_dims.size() < 3 || x_dims.size() > 5) return false;
    const bool global = node.op_type.starts_with("Global");
    const bool max = node.op_type.find("Max") != std::string::npos;
    Dims kernel, strides, dilations, pads_begin, pads_end, dst_dims{x_dims[0], x_dims[1]};
    algorithm alg = max ? algorithm::pooling_max : algorithm::pooling_avg_exclude_padding;
    if (global) {
      kernel.assign(x_dims.begin() + 2, x_dims.end());
      strides.assign(kernel.size(), 1);
      dilations.assign(kernel.size(), 0);
      pads_begin.assign(kernel.size(), 0);
      pads_end.assign(kernel.size(), 0);
      dst_dims.resize(x_dims.size(), 1);
    } else {
      const graph::PoolParams p = graph::parse_pool(graph_, node, slot(x).shape);
      const graph::WindowParams& win = p.window;
      if (!max && p.count_include_pad) alg = algorithm::pooling_avg_include_padding;
      for (int i = 0; i < win.rank(); ++i) {
        const auto d = static_cast<std::size_t>(i);
        const int64_t extent = (win.kernel[d] - 1) * win.dilations[d] + 1;
        int64_t end = win.pads_end[d];
        // ceil_mode: oneDNN wants the padding that makes its floor formula give the output
        // size; the extra cells are outside every ONNX window except for include-pad averages.
        if ((win.in_size[d] + win.pads_begin[d] + end - extent) / win.strides[d] + 1 !=
            win.out_size[d]) {
          end =
              (win.out_size[d] - 1) * win.strides[d] + extent - win.in_size[d] - win.pads_begin[d];
          if (alg == algorithm::pooling_avg_include_padding) {
            throw Unmapped{"ceil_mode with count_include_pad"};
          }
        }
        kernel.push_back(win.kernel[d]);
        strides.push_back(win.strides[d]);
        dilations.push_back(win.dilations[d] - 1);
        pads_begin.push_back(win.pads_begin[d]);
        pads_end.push_back(end);
        dst_dims.push_back(win.out_size[d]);
      }
    }
    dnnl::pooling_v2_forward::desc desc(dnnl::prop_kind::forward_inference, alg, slot(x).md,
                                        any_md(dst_dims), strides, kernel, dilations, pads_begin,
                                        pads_end);
    dnnl::pooling_v2_forward::primitive_desc pd(desc, engine_);
    Step step;
    step.primitive = dnnl::pooling_v2_forward(pd);
    step.args[DNNL_ARG_SRC] = make_memory(slot(x).buffer, slot(x).md);
    define(node.outputs[0], pd.dst_desc());
    step.args[DNNL_ARG_DST] = make_memory(slot(node.outputs[0]).buffer, pd.dst_desc());
    return push(std::move(step));
  }

  bool map_softmax(const graph::Node& node) {
    if (!all_in_dnnl(node)) return false;
    const int x = node.input(0), out = node.outputs[0];
    const graph::SoftmaxParams p = graph::parse_softmax(graph_, node, slot(x).shape);
    const memory::desc md = plain_md({p.outer, p.axis_size, p.inner});
    Step step;
    if (node.op_type == "Softmax") {
      dnnl::softmax_forward::primitive_desc pd({dnnl::prop_kind::forward_inference, md, 1},
                                               engine_);
      step.primitive = dnnl::softmax_forward(pd);
    } else {
      dnnl::logsoftmax_forward::primitive_desc pd({dnnl::prop_kind::forward_inference, md, 1},
                                                  engine_);
      step.primitive = dnnl::logsoftmax_forward(pd);
    }
    step.args[DNNL_ARG_SRC] = make_memory(in_plain_layout(x), md);
    define(out, plain_md(dims_of(out)));
    step.args[DNNL_ARG_DST] = make_memory(slot(out).buffer, md);
    return push(std::move(step));
  }

  // ---- recurrent layers ----

  // RNN, GRU and LSTM as oneDNN's vanilla_rnn, gru / lbr_gru and lstm primitives (one layer,
  // ONNX's direction). What those primitives cannot express goes to the reference op:
  // sequence_lens shorter than the sequence (they run every sequence to the end), clip,
  // input_forget, computed peepholes, layout 1 (batch first), and activation functions other
  // than ONNX's defaults (a vanilla RNN may take Tanh, Relu or Sigmoid, the same for both
  // directions).
  bool map_recurrent(const graph::Node& node) {
    namespace ref = kernels::reference;
    std::vector<std::optional<std::vector<int64_t>>> shapes;
    for (int v : node.inputs) {
      shapes.push_back(v >= 0 ? std::optional(slot(v).shape) : std::nullopt);
    }
    const ref::RecurrentShape shape = bind_recurrent(graph_, node, shapes).shape;
    const int x = node.input(0), w = node.input(1), r = node.input(2), b = node.input(3);
    const int initial_h = node.input(5), initial_c = node.input(6), peepholes = node.input(7);
    if (node.input(4) >= 0 && !full_lengths(node.input(4), shape.seq_length)) {
      throw Unmapped{"sequence_lens shorter than the sequence (oneDNN runs every sequence whole)"};
    }
    if (peepholes >= 0 && !is_constant(peepholes)) throw Unmapped{"peepholes are not constant"};
    if (shape.clip > 0.0f || shape.input_forget) throw Unmapped{"clip or input_forget"};
    if (shape.batch_major) throw Unmapped{"layout 1 (batch first)"};
    if (!is_constant(w) || !is_constant(r) || (b >= 0 && !is_constant(b))) {
      throw Unmapped{"weights or bias are not constant"};
    }
    for (int v : {x, initial_h, initial_c}) {
      if (v >= 0 && !slot(v).in_dnnl) return false;
    }
    for (int v : node.outputs) {
      if (v >= 0 && !slot(v).in_dnnl) return false;
    }
    const algorithm rnn_activation = recurrent_activation(shape);

    const int64_t steps = shape.seq_length, batch = shape.batch, input = shape.input_size,
                  hidden = shape.hidden_size, dirs = shape.directions;
    const int64_t gates = ref::gate_count(shape.cell);
    const bool lstm = shape.cell == ref::RecurrentCell::kLstm;
    const bool lbr = shape.cell == ref::RecurrentCell::kGru && shape.linear_before_reset;
    // oneDNN's gate g is ONNX's gate onnx_gate[g]: LSTM i, f, c, o against ONNX's i, o, f, c;
    // GRU's u, r, o are ONNX's z, r, h.
    std::vector<int64_t> onnx_gate(static_cast<std::size_t>(gates));
    std::iota(onnx_gate.begin(), onnx_gate.end(), 0);
    if (lstm) onnx_gate = {0, 2, 3, 1};
    // (GRU's and RNN's are already in order: their constants are used as they are.)
    const Tensor& w_onnx = *value(w).constant;
    const Tensor& r_onnx = *value(r).constant;
    const Tensor w_gates = lstm ? permute_gates(w_onnx, onnx_gate, dirs, hidden) : w_onnx;
    const Tensor r_gates = lstm ? permute_gates(r_onnx, onnx_gate, dirs, hidden) : r_onnx;
    const Tensor bias = recurrent_bias(b >= 0 ? value(b).constant->data<float>() : nullptr,
                                       onnx_gate, dirs, gates, hidden, lbr);
    // LSTM's peepholes [D, 3*H]: ONNX's i, o, f as oneDNN's i, f, o ([1, D, 3, H], ldgo).
    const memory::desc peephole_md =
        peepholes >= 0 ? plain_md({1, dirs, 3, hidden}) : memory::desc();
    const Tensor peephole_gates =
        peepholes >= 0 ? permute_gates(value(peepholes).constant->reshaped({dirs, 3 * hidden, 1}),
                                       {0, 2, 1}, dirs, hidden)
                             .reshaped({1, dirs, 3, hidden})
                       : Tensor();

    // ONNX's W [D, G*H, I] and R [D, G*H, H] are oneDNN's ldgoi (logical dims l, d, i, g, o).
    auto ldgoi = [&](int64_t rows) {
      return memory::desc(
          {1, dirs, rows, gates, hidden}, memory::data_type::f32,
          Dims{dirs * gates * hidden * rows, gates * hidden * rows, 1, hidden * rows, rows});
    };
    const Dims state_dims{1, dirs, batch, hidden};  // ONNX's [D, N, H] states are ldnc
    const memory::desc state_md = plain_md(state_dims);
    auto state_if = [&](bool present) { return present ? state_md : memory::desc(); };
    const int y = output(node, 0), y_h = output(node, 1), y_c = lstm ? output(node, 2) : -1;
    const memory::desc src_layer = plain_md({steps, batch, input});
    const memory::desc dst_layer = plain_md({steps, batch, dirs * hidden});
    const memory::desc bias_md = plain_md(bias.shape());
    const memory::desc w_any = any_md({1, dirs, input, gates, hidden});
    const memory::desc r_any = any_md({1, dirs, hidden, gates, hidden});
    const auto prop = dnnl::prop_kind::forward_inference;
    const auto direction = dirs == 2       ? dnnl::rnn_direction::bidirectional_concat
                           : shape.reverse ? dnnl::rnn_direction::unidirectional_right2left
                                           : dnnl::rnn_direction::unidirectional_left2right;
    Step step;
    memory::desc w_md, r_md;
    auto take = [&](auto pd, auto primitive) {
      w_md = pd.weights_layer_desc();
      r_md = pd.weights_iter_desc();
      step.primitive = std::move(primitive);
    };
    // oneDNN's LSTM takes both states or neither, in and out: a missing initial state is zeros,
    // a missing output state goes to a buffer of its own.
    const bool src_states = initial_h >= 0 || initial_c >= 0, dst_states = y_h >= 0 || y_c >= 0;
    if (lstm) {
      const dnnl::lstm_forward::desc desc(prop, direction, src_layer, state_if(src_states),
                                          state_if(src_states), w_any, r_any, peephole_md, bias_md,
                                          dst_layer, state_if(dst_states), state_if(dst_states));
      const dnnl::lstm_forward::primitive_desc pd(desc, engine_);
      take(pd, dnnl::lstm_forward(pd));
    } else if (lbr) {
      const dnnl::lbr_gru_forward::desc desc(prop, direction, src_layer, state_if(initial_h >= 0),
                                             w_any, r_any, bias_md, dst_layer, state_if(y_h >= 0));
      const dnnl::lbr_gru_forward::primitive_desc pd(desc, engine_);
      take(pd, dnnl::lbr_gru_forward(pd));
    } else if (shape.cell == ref::RecurrentCell::kGru) {
      const dnnl::gru_forward::desc desc(prop, direction, src_layer, state_if(initial_h >= 0),
                                         w_any, r_any, bias_md, dst_layer, state_if(y_h >= 0));
      const dnnl::gru_forward::primitive_desc pd(desc, engine_);
      take(pd, dnnl::gru_forward(pd));
    } else {
      const dnnl::vanilla_rnn_forward::desc desc(prop, rnn_activation, direction, src_layer,
                                                 state_if(initial_h >= 0), w_any, r_any, bias_md,
                                                 dst_layer, state_if(y_h >= 0));
      const dnnl::vanilla_rnn_forward::primitive_desc pd(desc, engine_);
      take(pd, dnnl::vanilla_rnn_forward(pd));
    }
    step.args[DNNL_ARG_WEIGHTS_LAYER] =
        make_memory(constant_in_layout(w_gates, ldgoi(input), w_md), w_md);
    step.args[DNNL_ARG_WEIGHTS_ITER] =
        make_memory(constant_in_layout(r_gates, ldgoi(hidden), r_md), r_md);
    step.args[DNNL_ARG_BIAS] = make_memory(constant_in_layout(bias, bias_md, bias_md), bias_md);
    if (peepholes >= 0) {
      step.args[DNNL_ARG_WEIGHTS_PEEPHOLE] =
          make_memory(constant_in_layout(peephole_gates, peephole_md, peephole_md), peephole_md);
    }
    step.args[DNNL_ARG_SRC_LAYER] = make_memory(in_plain_layout(x), src_layer);
    for (const auto& [v, arg] :
         {std::pair{initial_h, DNNL_ARG_SRC_ITER}, {initial_c, DNNL_ARG_SRC_ITER_C}}) {
      if (v >= 0) {
        step.args[arg] = make_memory(in_plain_layout(v), state_md);
      } else if (lstm && src_states) {
        const Tensor zeros = Tensor::zeros(DType::kFloat32, state_dims);
        step.args[arg] = make_memory(constant_in_layout(zeros, state_md, state_md), state_md);
      }
    }
    for (const auto& [v, arg] : {std::pair{y_h, DNNL_ARG_DST_ITER}, {y_c, DNNL_ARG_DST_ITER_C}}) {
      if (v >= 0) {
        define(v, plain_md(dims_of(v)));
        step.args[arg] = make_memory(slot(v).buffer, state_md);
      } else if (lstm && dst_states) {
        step.args[arg] = make_memory(new_buffer(state_md.get_size(), -1), state_md);
      }
    }
    // Y [T, D, N, H] is the primitive's [T, N, D*H] when D = 1; with two directions, the
    // primitive writes [T, N, D, H] to a buffer of its own, reordered into Y after it.
    int concat = -1;
    if (y >= 0) define(y, plain_md(dims_of(y)));
    if (y >= 0 && dirs == 1) {
      step.args[DNNL_ARG_DST_LAYER] = make_memory(slot(y).buffer, dst_layer);
    } else {
      concat = new_buffer(dst_layer.get_size(), -1);
      step.args[DNNL_ARG_DST_LAYER] = make_memory(concat, dst_layer);
    }
    steps_.push_back(std::move(step));
    if (y >= 0 && dirs == 2) {
      const memory::desc as_y({steps, dirs, batch, hidden}, memory::data_type::f32,
                              Dims{batch * dirs * hidden, hidden, dirs * hidden, 1});
      add_reorder(concat, as_y, slot(y).buffer, slot(y).md);
    }
    return true;
  }

  // Whether sequence_lens `id` is a constant of every sequence at its full length `steps` (as
  // exporters write it for a padded batch): the same as no sequence_lens.
  bool full_lengths(int id, int64_t steps) const {
    if (!is_constant(id) || value(id).constant->dtype() != DType::kInt32) return false;
    const Tensor& lens = *value(id).constant;
    return std::all_of(lens.data<int32_t>(), lens.data<int32_t>() + lens.numel(),
                       [&](int32_t n) { return n == steps; });
  }

  // Output `i` of the node, or -1 when it is absent.
  static int output(const graph::Node& node, std::size_t i) {
    return i < node.outputs.size() ? node.outputs[i] : -1;
  }

  // The vanilla RNN's activation (ONNX's defaults are the only ones the others take).
  static algorithm recurrent_activation(const kernels::reference::RecurrentShape& shape) {
    using Kind = kernels::reference::RnnActivation::Kind;
    using kernels::reference::RecurrentCell;
    std::vector<Kind> defaults;
    if (shape.cell == RecurrentCell::kGru) defaults = {Kind::kSigmoid, Kind::kTanh};
    if (shape.cell == RecurrentCell::kLstm) defaults = {Kind::kSigmoid, Kind::kTanh, Kind::kTanh};
    if (shape.cell == RecurrentCell::kRnn) defaults = {shape.activations.front().kind};
    for (std::size_t i = 0; i < shape.activations.size(); ++i) {
      if (shape.activations[i].kind != defaults[i % defaults.size()]) {
        throw Unmapped{"activation functions oneDNN's cell does not take"};
      }
    }
    switch (defaults.front()) {
      case Kind::kTanh:
        return algorithm::eltwise_tanh;
      case Kind::kRelu:
        return algorithm::eltwise_relu;
      case Kind::kSigmoid:
        return algorithm::eltwise_logistic;
      default:
        throw Unmapped{"an RNN activation oneDNN's vanilla RNN does not take"};
    }
  }

  // W or R ([D, G*H, K]) with its G gate blocks in oneDNN's order.
  static Tensor permute_gates(const Tensor& weights, const std::vector<int64_t>& onnx_gate,
                              int64_t dirs, int64_t hidden) {
    Tensor permuted = Tensor::zeros(DType::kFloat32, weights.shape());
    const int64_t gates = static_cast<int64_t>(onnx_gate.size());
    const int64_t block = hidden * weights.shape().back();  // one gate's rows
    for (int64_t d = 0; d < dirs; ++d) {
      for (int64_t g = 0; g < gates; ++g) {
        std::memcpy(permuted.data<float>() + (d * gates + g) * block,
                    weights.data<float>() + (d * gates + onnx_gate[g]) * block,
                    static_cast<std::size_t>(block) * sizeof(float));
      }
    }
    return permuted;
  }

  // oneDNN's bias [1, D, G, H] (ldgo) from ONNX's B [D, 2*G*H] (W's biases, then R's; nullptr:
  // zeros): their sum per gate, except lbr_gru's, which has a fourth gate for Rb_h (added
  // inside the reset gate's product) and Wb_h alone in the third.
  static Tensor recurrent_bias(const float* b, const std::vector<int64_t>& onnx_gate, int64_t dirs,
                               int64_t gates, int64_t hidden, bool lbr) {
    const int64_t out_gates = lbr ? gates + 1 : gates;
    Tensor bias = Tensor::zeros(DType::kFloat32, {1, dirs, out_gates, hidden});
    if (b == nullptr) return bias;
    float* out = bias.data<float>();
    for (int64_t d = 0; d < dirs; ++d) {
      const float* wb = b + d * 2 * gates * hidden;
      const float* rb = wb + gates * hidden;
      for (int64_t g = 0; g < gates; ++g) {
        const int64_t from = onnx_gate[static_cast<std::size_t>(g)] * hidden;
        const bool rb_apart = lbr && g == 2;
        for (int64_t h = 0; h < hidden; ++h) {
          out[(d * out_gates + g) * hidden + h] = wb[from + h] + (rb_apart ? 0.0f : rb[from + h]);
        }
      }
      if (lbr)
        std::memcpy(out + (d * out_gates + gates) * hidden, rb + 2 * hidden,
                    static_cast<std::size_t>(hidden) * sizeof(float));
    }
    return bias;
  }

  bool map_layer_norm(const graph::Node& node) {
    if (!all_in_dnnl(node) || !extra_outputs_unused(node)) return false;
    const int x = node.input(0), scale = node.input(1), shift = node.input(2),
              out = node.outputs[0];
    std::optional<std::vector<int64_t>> shift_shape;
    if (shift >= 0) shift_shape = slot(shift).shape;
    const graph::LayerNormParams p =
        graph::parse_layer_norm(graph_, node, slot(x).shape, slot(scale).shape, shift_shape);
    for (int v : {scale, shift}) {
      if (v >= 0 && (!is_constant(v) || product(dims_of(v)) != p.inner)) {
        throw Unmapped{"scale or bias is not a constant of the normalized size"};
      }
    }
    auto flags = dnnl::normalization_flags::use_scale;
    if (shift >= 0) flags |= dnnl::normalization_flags::use_shift;
    const memory::desc md = plain_md({p.outer, p.inner});
    dnnl::layer_normalization_forward::primitive_desc pd(
        {dnnl::prop_kind::forward_inference, md, p.epsilon, flags}, engine_);
    Step step;
    step.primitive = dnnl::layer_normalization_forward(pd);
    step.args[DNNL_ARG_SRC] = make_memory(in_plain_layout(x), md);
    const memory::desc param_md = plain_md({p.inner});
    step.args[DNNL_ARG_SCALE] = make_memory(slot(scale).buffer, param_md);
    if (shift >= 0) step.args[DNNL_ARG_SHIFT] = make_memory(slot(shift).buffer, param_md);
    for (int arg : {DNNL_ARG_MEAN, DNNL_ARG_VARIANCE}) {
      const memory::desc stat_md = pd.query_md(dnnl::query::exec_arg_md, arg);
      if (stat_md.get_size() > 0) {
        step.args[arg] = make_memory(new_buffer(stat_md.get_size(), -1), stat_md);
      }
    }
    define(out, plain_md(dims_of(out)));
    step.args[DNNL_ARG_DST] = make_memory(slot(out).buffer, md);
    return push(std::move(step));
  }

  bool map_binary(const graph::Node& node) {
    if (!all_in_dnnl(node) || node.own_input_count() != 2 || !node.epilogue.empty()) return false;
    int a = node.input(0), b = node.input(1);
    const int out = node.outputs[0];
    const Dims out_dims = dims_of(out);
    const bool commutative = node.op_type == "Add" || node.op_type == "Mul" ||
                             node.op_type == "Max" || node.op_type == "Min";
    // oneDNN broadcasts the second source only.
    if (dims_of(a) != out_dims || slot(a).shape.size() != slot(out).shape.size()) {
      if (!commutative || dims_of(b) != out_dims) throw Unmapped{"first operand broadcasts"};
      std::swap(a, b);
    }
    static const std::map<std::string, algorithm> kAlgorithms = {
        {"Add", algorithm::binary_add}, {"Sub", algorithm::binary_sub},
        {"Mul", algorithm::binary_mul}, {"Div", algorithm::binary_div},
        {"Max", algorithm::binary_max}, {"Min", algorithm::binary_min}};
    const memory::desc a_md = slot(a).md;
    // A full-size second operand is read in the first one's layout, a broadcast one plain.
    const memory::desc b_md =
        dims_of(b) == out_dims ? a_md : plain_md(pad_rank(dims_of(b), out_dims.size()));
    const int b_buffer = dims_of(b) == out_dims ? in_layout(b, a_md) : in_plain_layout(b);
    dnnl::binary::primitive_desc pd({kAlgorithms.at(node.op_type), a_md, b_md, a_md}, engine_);
    Step step;
    step.primitive = dnnl::binary(pd);
    step.args[DNNL_ARG_SRC_0] = make_memory(slot(a).buffer, a_md);
    step.args[DNNL_ARG_SRC_1] = make_memory(b_buffer, b_md);
    define(out, a_md);
    step.args[DNNL_ARG_DST] = make_memory(slot(out).buffer, a_md);
    return push(std::move(step));
  }

  // Shape-only ops: the output is the plain input seen with new dims, no copy.
  bool map_reshape(const graph::Node& node) {
    if (!extra_outputs_unused(node) || !node.epilogue.empty()) return false;
    const int x = node.input(0), out = node.outputs[0];
    if (slot(x).dtype != slot(out).dtype) return false;
    const int b = in_plain_layout(x);
    alias(out, b, slot(out).in_dnnl ? plain_md(dims_of(out)) : memory::desc());
    return true;
  }

  // A reorder from the input seen through permuted strides into a plain output.
  bool map_transpose(const graph::Node& node) {
    if (!all_in_dnnl(node)) return false;
    const int x = node.input(0), out = node.outputs[0];
    const std::size_t rank = slot(x).shape.size();
    std::vector<int64_t> perm = node.attr_ints("perm");
    if (perm.empty()) {
      for (std::size_t i = 0; i < rank; ++i) perm.push_back(static_cast<int64_t>(rank - 1 - i));
    }
    if (perm.size() != rank || rank == 0) return false;
    const Dims in_strides = plain_strides(dims_of(x));
    Dims strides;
    for (int64_t axis : perm) strides.push_back(in_strides.at(static_cast<std::size_t>(axis)));
    const memory::desc src_md(dims_of(out), memory::data_type::f32, strides);
    define(out, plain_md(dims_of(out)));
    add_reorder(in_plain_layout(x), src_md, slot(out).buffer, slot(out).md);
    return true;
  }

  bool map_concat(const graph::Node& node) {
    if (!all_in_dnnl(node) || !node.epilogue.empty()) return false;
    const int out = node.outputs[0];
    const int rank = static_cast<int>(slot(out).shape.size());
    int64_t axis = node.attr_int("axis", 0);
    if (axis < 0) axis += rank;
    if (axis < 0 || axis >= rank) return false;
    std::vector<memory::desc> mds;
    std::vector<int> srcs;
    for (int v : node.inputs) {
      if (v < 0) return false;
      mds.push_back(plain_md(dims_of(v)));
      srcs.push_back(in_plain_layout(v));
    }
    define(out, plain_md(dims_of(out)));
    dnnl::concat::primitive_desc pd(slot(out).md, static_cast<int>(axis), mds, engine_);
    Step step;
    step.primitive = dnnl::concat(pd);
    for (std::size_t i = 0; i < srcs.size(); ++i) {
      step.args[DNNL_ARG_MULTIPLE_SRC + static_cast<int>(i)] = make_memory(srcs[i], mds[i]);
    }
    step.args[DNNL_ARG_DST] = make_memory(slot(out).buffer, slot(out).md);
    return push(std::move(step));
  }

  // The scalar value of constant input `i`, if it has one.
  std::optional<float> scalar_input(const graph::Node& node, std::size_t i) const {
    const int v = node.input(i);
    if (!is_constant(v) || value(v).dtype != DType::kFloat32 || value(v).constant->numel() != 1) {
      return std::nullopt;
    }
    return value(v).constant->data<float>()[0];
  }

  // Unary element-wise ops, in whatever layout the input is.
  bool map_eltwise(const graph::Node& node) {
    if (!all_in_dnnl(node) || node.outputs.size() != 1 || !node.epilogue.empty()) return false;
    const std::string& op = node.op_type;
    algorithm alg;
    float alpha = 0.0f, beta = 0.0f;
    if (op == "Relu") {
      alg = algorithm::eltwise_relu;
    } else if (op == "LeakyRelu") {
      alg = algorithm::eltwise_relu;
      alpha = node.attr_float("alpha", 0.01f);
    } else if (op == "Elu") {
      alg = algorithm::eltwise_elu;
      alpha = node.attr_float("alpha", 1.0f);
    } else if (op == "Sigmoid") {
      alg = algorithm::eltwise_logistic;
    } else if (op == "Tanh") {
      alg = algorithm::eltwise_tanh;
    } else if (op == "Exp") {
      alg = algorithm::eltwise_exp;
    } else if (op == "Log") {
      alg = algorithm::eltwise_log;
    } else if (op == "Sqrt") {
      alg = algorithm::eltwise_sqrt;
    } else if (op == "Abs") {
      alg = algorithm::eltwise_abs;
    } else if (op == "Neg") {
      alg = algorithm::eltwise_linear;
      alpha = -1.0f;
    } else if (op == "Pow") {
      const std::optional<float> exponent = scalar_input(node, 1);
      if (!exponent) return false;
      alg = algorithm::eltwise_pow;
      alpha = 1.0f;
      beta = *exponent;
    } else if (op == "Clip") {
      alg = algorithm::eltwise_clip_v2;  // min <= x <= max, like ONNX
      alpha = -std::numeric_limits<float>::infinity();
      beta = std::numeric_limits<float>::infinity();
      if (graph_.opset < 11) {
        alpha = node.attr_float("min", alpha);
        beta = node.attr_float("max", beta);
      } else {
        for (std::size_t i : {1u, 2u}) {
          if (node.input(i) < 0) continue;
          const std::optional<float> bound = scalar_input(node, i);
          if (!bound) return false;
          (i == 1 ? alpha : beta) = *bound;
        }
      }
    } else {
      return false;
    }
    const int x = node.input(0), out = node.outputs[0];
    dnnl::eltwise_forward::primitive_desc pd(
        {dnnl::prop_kind::forward_inference, alg, slot(x).md, alpha, beta}, engine_);
    Step step;
    step.primitive = dnnl::eltwise_forward(pd);
    step.args[DNNL_ARG_SRC] = make_memory(slot(x).buffer, slot(x).md);
    define(out, slot(x).md);
    step.args[DNNL_ARG_DST] = make_memory(slot(out).buffer, slot(out).md);
    return push(std::move(step));
  }

  // The node's reference op over plain buffers, then its epilogue.
  void add_fallback(const graph::Node& node) {
    falls_back_[static_cast<std::size_t>(node_index_)] = true;
    const RefOp* op = find_reference_op(node.op_type);
    if (op == nullptr) {
      graph::fail(graph_, node, ErrorCode::kUnsupported, "no oneDNN mapping and no reference op");
    }
    std::vector<int> in_buffers;
    for (int v : node.inputs) in_buffers.push_back(v >= 0 ? in_plain_layout(v) : -1);
    std::vector<int> out_buffers;
    for (int v : node.outputs) {
      Slot& s = slot(v);
      s.buffer =
          new_buffer(static_cast<std::size_t>(checked_numel(s.shape)) * dtype_size(s.dtype), v);
      if (s.in_dnnl) s.md = plain_md(to_dims(s.shape));
      out_buffers.push_back(s.buffer);
    }
    Step step;
    for (int b : in_buffers) {
      if (b >= 0) step.fallback_buffers.push_back(b);
    }
    step.fallback_buffers.insert(step.fallback_buffers.end(), out_buffers.begin(),
                                 out_buffers.end());
    step.fallback = [this, &node, op, in_buffers, out_buffers](const std::vector<void*>& data) {
      std::vector<Tensor> inputs(node.inputs.size()), outputs(node.outputs.size());
      std::vector<const Tensor*> input_ptrs;
      for (std::size_t i = 0; i < node.inputs.size(); ++i) {
        const int v = node.inputs[i];
        if (v < 0) {
          input_ptrs.push_back(nullptr);
          continue;
        }
        inputs[i] = Tensor::view(data[static_cast<std::size_t>(in_buffers[i])], slot(v).dtype,
                                 slot(v).shape);
        input_ptrs.push_back(&inputs[i]);
      }
      RefOpContext ctx{graph_, node, {}, {}};
      ctx.inputs.assign(input_ptrs.begin(),
                        input_ptrs.begin() + static_cast<std::ptrdiff_t>(node.own_input_count()));
      for (std::size_t i = 0; i < node.outputs.size(); ++i) {
        const int v = node.outputs[i];
        outputs[i] = Tensor::view(data[static_cast<std::size_t>(out_buffers[i])], slot(v).dtype,
                                  slot(v).shape);
        ctx.outputs.push_back(&outputs[i]);
      }
      op->run(ctx);
      if (!node.epilogue.empty()) apply_epilogue(graph_, node, input_ptrs, outputs.at(0));
    };
    steps_.push_back(std::move(step));
  }

  static constexpr int kGraphOutput = 1 << 30;

  graph::Graph graph_;
  int threads_;
  dnnl::engine engine_;
  dnnl::stream stream_;
  std::vector<Slot> slots_;
  std::vector<Buffer> buffers_;
  std::vector<Step> steps_;
  std::vector<std::pair<memory, int>> input_memories_;  // memories over caller inputs
  std::vector<std::pair<memory, int>> arena_memories_;  // memories over arena buffers
  std::vector<Tensor> arena_;                           // the blocks arena buffers live in
  std::vector<int> last_reader_;                        // value id -> last reading node
  int node_index_ = -1;                                 // the node being built
  std::vector<bool> falls_back_;  // per node: runs its reference op (add_fallback)
};

}  // namespace

std::unique_ptr<Executor> make_onednn_executor(graph::Graph graph, int threads) {
  if (threads < 1) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("onednn schedule: threads must be >= 1, got {}", threads));
  }
  return std::make_unique<OneDnnExecutor>(std::move(graph), threads);
}

}  // namespace sparsecol::runtime
