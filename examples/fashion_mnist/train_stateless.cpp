// fashion_mnist — the instantiations for recovery::stateless (see trainer.hpp).
#include "trainer.hpp"

int fashion::train_stateless(const config& c) {
  return train<asyncps::recovery::stateless, asyncps::optimizer::sgd>(c);
}
