// fashion_mnist — the instantiations for recovery::replica_log, SWIFT-style (see trainer.hpp).
#include "trainer.hpp"

int fashion::train_replica_log(const config& c) {
  return train<asyncps::recovery::replica_log, asyncps::optimizer::sgd>(c);
}
