// fashion_mnist — the instantiations for recovery::chain_replication, relaxed (see trainer.hpp).
#include "trainer.hpp"

int fashion::train_chain_relaxed(const config& c) {
  return train<asyncps::recovery::chain_replication<asyncps::recovery::chain_mode::relaxed>,
               asyncps::optimizer::sgd>(c);
}
