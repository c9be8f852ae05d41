// fashion_mnist — the instantiations for recovery::checkpoint (see trainer.hpp).
#include "trainer.hpp"

int fashion::train_checkpoint(const config& c) {
  return train<asyncps::recovery::checkpoint, asyncps::optimizer::sgd>(c);
}
