// fashion_mnist — the instantiations for --consistency vap, recovery::none only (see
// trainer.hpp): one worker type and one server type per optimizer, compiled apart from the
// other policies so a 2-core build runs them in parallel.
#include "trainer.hpp"

int fashion::train_vap(const config& c) {
  namespace opt = asyncps::optimizer;
  return with_optimizer<asyncps::consistency::vap, asyncps::recovery::none, opt::sgd, opt::momentum,
                        opt::adagrad, opt::adam>(c);
}
