// asyncps — the definitions compiled once under separate compilation: include this file in
// exactly one .cpp of the program, compiled with ASYNCPS_SEPARATE_COMPILATION defined (as every
// other translation unit that includes asyncps), or link the CMake target
// asyncps::asyncps_compiled, which does both (docs/build_time.md, "Separate compilation").
// It compiles `tcp_transport` (listen, accept, connect, the handshakes, send, receive), the error
// categories (error.hpp), `make_tls_context` (tls.hpp), reading and wiping a shared secret
// (secret.hpp), the seeded initial values (layout.hpp), the optimizers' `apply` and
// `stays_finite` (optimizer/optimizers.hpp), the two servers server.hpp declares
// `extern template` in this mode, `server<consistency::bsp>` and `server<consistency::ssp<>>`
// (TCP, no recovery, plain SGD), and the two worker shells worker.hpp declares: those of
// `worker<M, consistency::bsp>` and `worker<M, consistency::ssp<>>` for any model `M` with
// dense reads and gradients and a plain `compute_gradient`.
#pragma once

#include "asyncps/detail/config.hpp"

#if !defined(ASYNCPS_SEPARATE_COMPILATION)
#error "define ASYNCPS_SEPARATE_COMPILATION to compile asyncps/src.hpp (see its comment)"
#endif

// The declarations first (with the macro defined they do not include their definitions), then
// the definitions, which do not include their headers back.
#include "asyncps/detail/worker/protocol.hpp"
#include "asyncps/error.hpp"
#include "asyncps/layout.hpp"
#include "asyncps/optimizer/optimizers.hpp"
#include "asyncps/secret.hpp"
#include "asyncps/tls.hpp"
#include "asyncps/transport/tcp.hpp"

#include "asyncps/detail/worker/protocol.ipp"
#include "asyncps/impl/error.ipp"
#include "asyncps/impl/layout.ipp"
#include "asyncps/impl/secret.ipp"
#include "asyncps/impl/tls.ipp"
#include "asyncps/optimizer/impl/optimizers.ipp"
#include "asyncps/transport/impl/tcp.ipp"

#include "asyncps/consistency/policies.hpp"
#include "asyncps/server.hpp"
#include "asyncps/worker.hpp"

namespace asyncps {
template class basic_server<tcp_transport, consistency::bsp>;
template class basic_server<tcp_transport, consistency::ssp<>>;
}  // namespace asyncps

namespace asyncps::detail {
template class worker_shell<model_ref<false, false, false>, tcp_transport, consistency::bsp,
                            recovery::none>;
template class worker_shell<model_ref<false, false, false>, tcp_transport, consistency::ssp<>,
                            recovery::none>;
}  // namespace asyncps::detail
