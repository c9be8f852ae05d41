// asyncps — every recovery policy's own messages at once, for code that reaches them through
// asyncps/protocol.hpp (which includes this header): chain replication's chain_hello and
// chain_config (recovery/chain/messages.hpp), the replica log's order
// (recovery/replica_log/messages.hpp), and the prefix of a stateless backlog push
// (recovery/stateless/messages.hpp). Each policy owns and includes its own; this header defines
// nothing. Declared in namespace asyncps::protocol.
#pragma once

#include "asyncps/recovery/chain/messages.hpp"
#include "asyncps/recovery/replica_log/messages.hpp"
#include "asyncps/recovery/stateless/messages.hpp"
