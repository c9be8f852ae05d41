// fashion_mnist — the instantiations for recovery::chain_replication, strict (see trainer.hpp).
#include "trainer.hpp"

int fashion::train_chain(const config& c) {
  return train<asyncps::recovery::chain_replication<asyncps::recovery::chain_mode::strict>>(c);
}
