// fashion_mnist — the instantiations for recovery::none (see trainer.hpp).
#include "trainer.hpp"

int fashion::train_none(const config& c) { return train<asyncps::recovery::none>(c); }
