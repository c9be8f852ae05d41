// asyncps — recovery::none, server part: nothing to do (the default hooks apply).
#pragma once

namespace asyncps::recovery {

/// recovery::none, server part: keeps no state and implements no hook.
struct none_server_part {};

}  // namespace asyncps::recovery
