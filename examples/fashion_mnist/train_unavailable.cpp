// fashion_mnist — the quick start's build (CMake option FASHION_MNIST_ALL_POLICIES=OFF, preset
// `quickstart`) compiles only the default configuration: recovery none with SGD (train_none.cpp),
// every consistency model but VAP. The other entry points of config.hpp are defined here, each
// refusing with a line that says how to build the trainer that has them.
#include <cstdio>

#include "config.hpp"

namespace {

int not_built(const char* what) {
  std::fprintf(stderr,
               "fashion_mnist: %s is not in this build: it was configured with "
               "-DFASHION_MNIST_ALL_POLICIES=OFF (the quick start's build of the default "
               "configuration only). Build the full trainer with: cmake --preset release && "
               "cmake --build --preset release --target fashion_mnist\n",
               what);
  return 2;
}

}  // namespace

int fashion::train_none_optimizers(const config&) {
  return not_built("--optimizer momentum|adagrad|adam");
}
int fashion::train_vap(const config&) { return not_built("--consistency vap"); }
int fashion::train_groups(const config&) { return not_built("--groups"); }
int fashion::train_checkpoint(const config&) { return not_built("--recovery checkpoint"); }
int fashion::train_stateless(const config&) { return not_built("--recovery stateless"); }
int fashion::train_chain(const config&) { return not_built("--recovery chain"); }
int fashion::train_chain_relaxed(const config&) { return not_built("--recovery chain-relaxed"); }
int fashion::train_replica_log(const config&) { return not_built("--recovery replica-log"); }
int fashion::run_master(const config&) { return not_built("--role master"); }
