// The in-process transport: ranks are threads of one process sharing a Fabric of mailboxes. Sends copy the
// message into the receiver's mailbox at once (eager); receives wait on a condition variable, so a waiting rank
// sleeps instead of spinning. Used by tests to run N ranks as threads, and by anything that wants several
// ranks in one process.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "comm/transport/transport.h"

namespace h2 {

class InprocFabric;

// One transport per rank, all joined by one fabric. Each rank has a shared window of `window_bytes` (none when 0).
std::vector<std::shared_ptr<Transport>> make_inproc_transports(int size, size_t window_bytes = size_t{1} << 20);

}  // namespace h2
