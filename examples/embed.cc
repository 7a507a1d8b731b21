// Embedding sparsecol in a C++ program: load a model, score one input file, print every output's
// shape. The lines between the [readme] markers are the README's "Embedding" example, word for
// word (ctest checks it: example_embed_matches_readme); ctest also builds and runs this program
// on the small exported model (example_embed).
//
//   embed MODEL.onnx INPUT.npy
#include <iostream>

#include <sparsecol/io.h>
#include <sparsecol/sparsecol.h>

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: " << argv[0] << " MODEL.onnx INPUT.npy\n";
    return 1;
  }
  try {
    // [readme]
    sparsecol::Engine engine = sparsecol::Engine::load(argv[1]);  // throws sparsecol::Error
    sparsecol::Session session = engine.session();                // one per calling thread
    sparsecol::Tensor input = sparsecol::read_npy(argv[2]);       // or Tensor::view(ptr, shape)
    auto outputs = session.run({{engine.inputs()[0].name, input}});
    for (const auto& [name, tensor] : outputs)
      std::cout << name << " " << sparsecol::shape_string(tensor.shape()) << "\n";
    // [readme]
  } catch (const sparsecol::Error& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 2;
  }
}
