// fashion_mnist — the instantiations for recovery::none with SGD, the quick start's default
// (see trainer.hpp); the other optimizers are in train_none_optimizers.cpp.
#include "trainer.hpp"

int fashion::train_none(const config& c) {
  return train<asyncps::recovery::none, asyncps::optimizer::sgd>(c);
}
