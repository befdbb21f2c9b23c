// The UCX transport (docs/architecture.md, "comm"): one UCP worker per rank, tagged messages through UCX's tag-matching
// API, which picks shared memory between ranks of one host and TCP (or verbs, where the hardware exists) across
// hosts. Worker addresses are exchanged through the rendezvous store; endpoints are created on first send.
//
// UCX matches a receive by tag only, so the sender puts its rank in the tag's top 16 bits (transport tags have
// kTagBits = 48 bits). Waiting does not busy-spin: it polls for at most options.spin, yielding the core between
// polls, then arms the worker and sleeps on UCX's event descriptor (UCP_FEATURE_WAKEUP). While it waits, it asks the
// store every `liveness_interval` which ranks have died, so a receive from a dead rank fails at once with its name
// instead of at the timeout.
//
// One thread per transport (UCS_THREAD_MODE_SINGLE): a rank drives its own communication.
#pragma once

#include <chrono>
#include <memory>

#include "comm/store.h"
#include "comm/transport/transport.h"

namespace h2 {

struct UcxOptions {
  std::chrono::milliseconds liveness_interval{500};
  // How long a wait polls (yielding the core between polls) before it sleeps on the event descriptor: long
  // enough to catch the next step of a collective without a wake-up, short enough to leave an idle rank asleep.
  std::chrono::microseconds spin{500};
  // The shared window's size (transport.h, SharedWindow): large all-reduces, reduce-scatters and all-gathers
  // between ranks of one host go through it in pieces of half of it.
  size_t window_bytes = size_t{2} << 20;
  // Every rank is on this host (the store is reached over loopback): UCX's network transports use the loopback
  // device only, so the job listens on no outside interface (UCX_NET_DEVICES set by the user still wins).
  bool loopback_only = false;
};

// Collective over all `size` ranks: publishes this rank's worker address in `store`, registers this rank's
// lifeline with it, and returns once the transport can send (endpoints are made lazily). Throws CommError when
// UCX cannot start (the message includes UCX's status text).
std::shared_ptr<Transport> make_ucx_transport(int rank, int size, std::shared_ptr<StoreClient> store,
                                              UcxOptions options = {});

}  // namespace h2
