// fashion_mnist — the instantiations for recovery::none with momentum, AdaGrad and Adam (see
// trainer.hpp), apart from SGD's so a 2-core build compiles them in parallel.
#include "trainer.hpp"

int fashion::train_none_optimizers(const config& c) {
  namespace opt = asyncps::optimizer;
  return train<asyncps::recovery::none, opt::momentum, opt::adagrad, opt::adam>(c);
}
