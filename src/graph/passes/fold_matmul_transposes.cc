// Folds the Transposes around a MatMul of two activations into an Einsum of the untransposed
// operands (passes.h). BERT's attention, per layer:
//
//   q = Transpose(Reshape(query), perm [0, 2, 1, 3])    [b, s, h, d] -> [b, h, s, d]
//   k = Transpose(Reshape(key),   perm [0, 2, 3, 1])    [b, s, h, d] -> [b, h, d, s]
//   scores = MatMul(q, k)                               -> Einsum "axby,azby->abxz"
//   v = Transpose(Reshape(value), perm [0, 2, 1, 3])
//   context = Transpose(MatMul(probs, v), perm [0, 2, 1, 3])   -> Einsum "abxy,aybz->axbz"
//
// MatMul's labels: batch letters from 'a', then x (rows), y (the summed depth), z (columns). A
// folded input Transpose with perm p puts the product's axis i at its input's axis p[i]; a folded
// output Transpose puts the product's axis p[i] at its output's axis i.
#include <algorithm>
#include <string>
#include <vector>

#include "graph/ops_tensor.h"
#include "graph/passes.h"
#include "graph/passes/pattern_pass.h"

namespace sparsecol::graph {

namespace {

constexpr char kRowLabel = 'x', kDepthLabel = 'y', kColumnLabel = 'z';
constexpr std::size_t kMaxBatchLabels = kRowLabel - 'a';

class MatMulTransposeFolder : PatternPass {
 public:
  explicit MatMulTransposeFolder(Graph& graph) : PatternPass(graph) {}

  void run() {
    bool changed = false;
    for (std::size_t n = 0; n < graph_.nodes.size(); ++n) {
      const Node& mm = graph_.nodes[n];
      if (!removed_[n] && mm.op_type == "MatMul" && mm.domain.empty()) changed |= try_fold(n);
    }
    if (changed) compact();
  }

 private:
  // The concrete dims of a float32 activation (not a constant), or empty.
  std::vector<int64_t> activation_dims(int id) const {
    const Value& v = value(id);
    if (v.constant || !v.dtype_known || v.dtype != DType::kFloat32 || !v.shape) return {};
    return concrete(*v.shape).value_or(std::vector<int64_t>{});
  }

  // The permutation of a default-domain Transpose `n` of rank `rank` with nothing fused (its
  // default, reversed, where it has none), or empty.
  std::vector<int64_t> perm_of(int n, std::size_t rank) const {
    const Node& t = node(n);
    if (t.op_type != "Transpose" || !t.domain.empty() || !t.epilogue.empty() ||
        t.inputs.size() != 1 || t.outputs.size() != 1) {
      return {};
    }
    // Valid: the MatMul's shapes are concrete, so shape inference has checked it.
    return resolve_perm(InferContext(graph_, t), static_cast<int64_t>(rank));
  }

  // The Transpose writing `id` for the MatMul alone, as (node, perm); node -1 if none.
  std::pair<int, std::vector<int64_t>> folded_input(int id, std::size_t rank) const {
    const int producer = value(id).producer;
    if (producer < 0 || sole_reader(id) < 0) return {-1, {}};
    std::vector<int64_t> perm = perm_of(producer, rank);
    return {perm.empty() ? -1 : producer, perm};
  }

  bool try_fold(std::size_t n) {
    Node& mm = graph_.nodes[n];
    if (!mm.epilogue.empty() || mm.inputs.size() != 2 || mm.outputs.size() != 1) return false;
    const std::vector<int64_t> a = activation_dims(mm.inputs[0]);
    const std::vector<int64_t> b = activation_dims(mm.inputs[1]);
    const std::size_t rank = a.size();
    // Equal batch dims: an Einsum letter has one size (no MatMul broadcasting).
    if (rank < 2 || rank - 2 > kMaxBatchLabels || b.size() != rank ||
        !std::equal(a.begin(), a.end() - 2, b.begin())) {
      return false;
    }
    std::string batch;
    for (std::size_t i = 0; i + 2 < rank; ++i) batch += static_cast<char>('a' + i);
    const std::string a_labels = batch + kRowLabel + kDepthLabel;
    const std::string b_labels = batch + kDepthLabel + kColumnLabel;
    const std::string y_labels = batch + kRowLabel + kColumnLabel;

    const auto [ta, perm_a] = folded_input(mm.inputs[0], rank);
    const auto [tb, perm_b] = folded_input(mm.inputs[1], rank);
    const int tc = sole_reader(mm.outputs[0]);
    const std::vector<int64_t> perm_c = tc >= 0 ? perm_of(tc, rank) : std::vector<int64_t>{};
    if (ta < 0 && tb < 0 && perm_c.empty()) return false;

    // The term of a folded input Transpose's input: its axis perm[i] is the product's axis i.
    auto input_term = [](const std::string& labels, const std::vector<int64_t>& perm) {
      if (perm.empty()) return labels;
      std::string term(labels.size(), ' ');
      for (std::size_t i = 0; i < perm.size(); ++i) {
        term[static_cast<std::size_t>(perm[i])] = labels[i];
      }
      return term;
    };
    std::string out_term = y_labels;
    for (std::size_t i = 0; i < perm_c.size(); ++i) {
      out_term[i] = y_labels[static_cast<std::size_t>(perm_c[i])];
    }
    const std::string equation =
        input_term(a_labels, perm_a) + "," + input_term(b_labels, perm_b) + "->" + out_term;

    if (ta >= 0) {
      mm.inputs[0] = node(ta).inputs[0];
      removed_[static_cast<std::size_t>(ta)] = true;
    }
    if (tb >= 0) {
      mm.inputs[1] = node(tb).inputs[0];
      removed_[static_cast<std::size_t>(tb)] = true;
    }
    if (!perm_c.empty()) {  // the Einsum writes the Transpose's output, read only after it
      mm.outputs[0] = node(tc).outputs[0];
      removed_[static_cast<std::size_t>(tc)] = true;
    }
    mm.op_type = "Einsum";
    mm.attrs = {{"equation", equation}};
    return true;
  }
};

}  // namespace

void fold_matmul_transposes(Graph& graph) { MatMulTransposeFolder(graph).run(); }

}  // namespace sparsecol::graph
