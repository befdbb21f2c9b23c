// The UCX transport: context, worker, lazily made endpoints, and requests that wait by sleeping on the worker's
// event descriptor. UCX API: https://openucx.readthedocs.io (ucp_tag_send_nbx, ucp_tag_recv_nbx,
// ucp_worker_arm, ucp_worker_get_efd).
#include "comm/transport/ucx/transport.h"

#include <poll.h>
#include <sched.h>
#include <ucp/api/ucp.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

namespace h2 {
namespace {

constexpr uint64_t kFullMask = ~uint64_t{0};

void check(ucs_status_t status, const std::string& what) {
  if (status != UCS_OK) throw CommError(cat("UCX: ", what, " failed: ", ucs_status_string(status)));
}

std::string address_key(int rank) { return cat("h2/ucx/address/", rank); }

class UcxTransport;

class UcxRequest final : public Request {
 public:
  UcxRequest(UcxTransport* transport, void* request, bool is_recv, int peer, uint64_t tag, size_t bytes)
      : transport_(transport), request_(request), is_recv_(is_recv), peer_(peer), tag_(tag), bytes_(bytes) {}
  ~UcxRequest() override;
  void wait(std::chrono::milliseconds timeout) override;
  bool test() override;

 private:
  // UCS_INPROGRESS while in flight; otherwise the final status, checked (throws on errors).
  ucs_status_t poll_status();
  std::string describe() const;

  UcxTransport* transport_;
  void* request_;  // nullptr once complete
  bool is_recv_;
  int peer_;
  uint64_t tag_;
  size_t bytes_;
};

class UcxTransport final : public Transport {
 public:
  UcxTransport(int rank, int size, std::shared_ptr<StoreClient> store, UcxOptions options)
      : rank_(rank), size_(size), store_(std::move(store)), options_(options) {
    if (size > (1 << (64 - kTagBits))) {
      throw CommError(cat("UCX transport: ", size, " ranks do not fit the tag's ", 64 - kTagBits, " source bits"));
    }
    ucp_config_t* config = nullptr;
    check(ucp_config_read(nullptr, nullptr, &config), "reading the UCX configuration (UCX_* variables)");
    // Endpoints ask for peer error handling (below), which UCX grants only over transports that report a peer's
    // failure: without this, shared memory is left out and every message between ranks of one host goes over
    // TCP loopback (4x slower all-reduces, measured). UCX_MM_ERROR_HANDLING set by the user still wins.
    if (std::getenv("UCX_MM_ERROR_HANDLING") == nullptr) {
      check(ucp_config_modify(config, "MM_ERROR_HANDLING", "y"), "enabling UCX shared memory with error handling");
    }
    if (options_.loopback_only && std::getenv("UCX_NET_DEVICES") == nullptr) {
      check(ucp_config_modify(config, "NET_DEVICES", "lo"), "restricting UCX to the loopback device");
    }
    ucp_params_t params{};
    params.field_mask = UCP_PARAM_FIELD_FEATURES;
    params.features = UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP;
    const ucs_status_t init = ucp_init(&params, config, &context_);
    ucp_config_release(config);
    check(init, "ucp_init");
    ucp_worker_params_t wp{};
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_SINGLE;
    check(ucp_worker_create(context_, &wp, &worker_), "ucp_worker_create");
    check(ucp_worker_get_efd(worker_, &efd_), "ucp_worker_get_efd");
    ucp_address_t* address = nullptr;
    size_t length = 0;
    check(ucp_worker_get_address(worker_, &address, &length), "ucp_worker_get_address");
    store_->set(address_key(rank_), std::string(reinterpret_cast<const char*>(address), length));
    ucp_worker_release_address(worker_, address);
    store_->register_rank(rank_);
  }

  ~UcxTransport() override {
    window_.reset();  // its peers' keys go before the endpoints they were unpacked with
    // Flush so that every message this rank sent has reached its peer before the endpoints go.
    ucp_request_param_t p{};
    void* flush = ucp_worker_flush_nbx(worker_, &p);
    if (UCS_PTR_IS_PTR(flush)) {
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      while (ucp_request_check_status(flush) == UCS_INPROGRESS && std::chrono::steady_clock::now() < deadline) {
        ucp_worker_progress(worker_);
      }
      ucp_request_free(flush);
    }
    for (auto& [peer, ep] : endpoints_) {
      ucp_request_param_t cp{};
      cp.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
      cp.flags = UCP_EP_CLOSE_FLAG_FORCE;
      void* close = ucp_ep_close_nbx(ep, &cp);
      if (UCS_PTR_IS_PTR(close)) {
        while (ucp_request_check_status(close) == UCS_INPROGRESS) ucp_worker_progress(worker_);
        ucp_request_free(close);
      }
    }
    ucp_worker_destroy(worker_);
    ucp_cleanup(context_);
    try {
      store_->leave();
    } catch (const Error&) {
      // The store (rank 0) may already be gone at the end of a job; nothing is lost.
    }
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* name() const override { return "ucx"; }

  std::unique_ptr<Request> isend(int peer, uint64_t tag, const void* data, size_t bytes) override {
    check_args(peer, tag);
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_DATATYPE;
    p.datatype = ucp_dt_make_contig(1);
    void* r = ucp_tag_send_nbx(endpoint(peer), bytes > 0 ? data : &dummy_, bytes, wire_tag(rank_, tag), &p);
    if (UCS_PTR_IS_ERR(r)) {
      throw CommError(cat("rank ", rank_, ": send of ", bytes, " bytes to rank ", peer,
                          " failed: ", ucs_status_string(UCS_PTR_STATUS(r))));
    }
    return std::make_unique<UcxRequest>(this, r, false, peer, tag, bytes);
  }

  std::unique_ptr<Request> irecv(int peer, uint64_t tag, void* data, size_t bytes) override {
    check_args(peer, tag);
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_DATATYPE;
    p.datatype = ucp_dt_make_contig(1);
    void* r = ucp_tag_recv_nbx(worker_, bytes > 0 ? data : &dummy_, bytes, wire_tag(peer, tag), kFullMask, &p);
    if (UCS_PTR_IS_ERR(r)) {
      throw CommError(
          cat("rank ", rank_, ": receive from rank ", peer, " failed: ", ucs_status_string(UCS_PTR_STATUS(r))));
    }
    return std::make_unique<UcxRequest>(this, r, true, peer, tag, bytes);
  }

  ucp_worker_h worker() const { return worker_; }

  void progress() override { ucp_worker_progress(worker_); }

  SharedWindow* window() override {
    if (options_.window_bytes == 0) return nullptr;
    if (!window_) window_ = std::make_unique<Window>(*this);
    return window_.get();
  }

  // Progresses the worker; when nothing has happened for options.spin (since the wait began or anything last
  // progressed), arms it and sleeps on its event descriptor for at most `most`, never more than a millisecond.
  // Spinning as long as things move matters: not every reason to progress raises an event (a sender whose large
  // eager message waits for room in the receiver's shared-memory FIFO gets none), and sleeping whenever one
  // progress call found nothing ran 16 MiB all-reduces on 4 ranks at a tenth of 2 ranks' bandwidth. While
  // spinning, the thread yields between progress calls, so ranks that outnumber the cores share them instead of
  // burning each other's time slices; a wait on which nothing moves still sleeps after options.spin.
  void progress_or_sleep(std::chrono::steady_clock::time_point idle_since, std::chrono::milliseconds most) {
    const auto now = std::chrono::steady_clock::now();
    if (ucp_worker_progress(worker_) != 0) {
      last_progress_ = now;
      return;
    }
    if (now - std::max(idle_since, last_progress_) < options_.spin) {
      sched_yield();
      return;
    }
    const ucs_status_t armed = ucp_worker_arm(worker_);
    if (armed == UCS_ERR_BUSY) return;  // events arrived meanwhile: progress again
    check(armed, "ucp_worker_arm");
    pollfd p{efd_, POLLIN, 0};
    ::poll(&p, 1, static_cast<int>(std::clamp<int64_t>(most.count(), 0, 1)));
  }

  // Which ranks the store has seen die; asked at most every liveness_interval.
  std::string dead_peers_note() {
    const auto now = std::chrono::steady_clock::now();
    if (now < next_liveness_check_) return "";
    next_liveness_check_ = now + options_.liveness_interval;
    std::vector<int> dead;
    try {
      dead = store_->dead_ranks();
    } catch (const Error&) {
      return "rank 0 is gone (the rendezvous store it runs no longer answers)";
    }
    if (dead.empty()) return "";
    std::string list;
    for (int r : dead) list += (list.empty() ? "" : ", ") + std::to_string(r);
    return cat("rank", dead.size() > 1 ? "s " : " ", list, " died (its process ended without leaving the job)");
  }

  std::chrono::milliseconds liveness_interval() const { return options_.liveness_interval; }
  void force_liveness_check() { next_liveness_check_ = {}; }

 private:
  static uint64_t wire_tag(int source, uint64_t tag) { return (static_cast<uint64_t>(source) << kTagBits) | tag; }

  void check_args(int peer, uint64_t tag) const {
    if (peer < 0 || peer >= size_) {
      throw Error(ErrorCode::kInvalidArgument, cat("rank ", rank_, ": peer ", peer, " is outside [0, ", size_, ")"));
    }
    if (tag >> kTagBits != 0) {
      throw Error(ErrorCode::kInvalidArgument,
                  cat("rank ", rank_, ": tag ", tag, " has more than ", kTagBits, " bits"));
    }
  }

  ucp_ep_h endpoint(int peer) {
    auto it = endpoints_.find(peer);
    if (it != endpoints_.end()) return it->second;
    const std::string address = store_->get(address_key(peer));
    ucp_ep_params_t ep{};
    // Peer error handling: a peer that dies fails the operations with it (and UCX's shared-memory copies from a
    // dead process) instead of UCX aborting this process.
    ep.field_mask =
        UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
    ep.address = reinterpret_cast<const ucp_address_t*>(address.data());
    ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    ep.err_handler.cb = [](void*, ucp_ep_h, ucs_status_t) {};  // the failed requests carry the error
    ep.err_handler.arg = nullptr;
    ucp_ep_h handle = nullptr;
    const ucs_status_t status = ucp_ep_create(worker_, &ep, &handle);
    if (status != UCS_OK) {
      throw CommError(cat("UCX: connecting rank ", rank_, " to rank ", peer, " failed: ", ucs_status_string(status),
                          " (no transport reaches it: check UCX_TLS and UCX_NET_DEVICES, and that the hosts can ",
                          "reach each other over TCP)"));
    }
    endpoints_[peer] = handle;
    return handle;
  }

  // The shared window: memory UCX allocates where peers can map it (ucp_mem_map with UCP_MEM_MAP_ALLOCATE; on
  // one host a System V segment), its packed key published in the store; a peer's window is the pointer
  // ucp_rkey_ptr gives for the key unpacked on the endpoint to it, which exists only where the two share memory.
  class Window final : public SharedWindow {
   public:
    explicit Window(UcxTransport& t) : t_(t) {
      ucp_mem_map_params_t mp{};
      mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH | UCP_MEM_MAP_PARAM_FIELD_FLAGS;
      mp.address = nullptr;
      mp.length = t.options_.window_bytes;
      mp.flags = UCP_MEM_MAP_ALLOCATE;
      // Without a window (UCX could not allocate one) the entry stays empty: the peers see none and their
      // collectives take the message-based algorithms.
      std::string entry;
      ucp_mem_attr_t attr{};
      attr.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS;
      void* packed = nullptr;
      size_t length = 0;
      if (ucp_mem_map(t.context_, &mp, &memh_) == UCS_OK && ucp_mem_query(memh_, &attr) == UCS_OK &&
          ucp_rkey_pack(t.context_, memh_, &packed, &length) == UCS_OK) {
        base_ = static_cast<char*>(attr.address);
        entry.assign(reinterpret_cast<const char*>(&base_), sizeof base_);
        entry.append(static_cast<const char*>(packed), length);
        ucp_rkey_buffer_release(packed);
      }
      t.store_->set(window_key(t.rank_), entry);
    }
    ~Window() override {
      for (auto& [peer, key] : keys_) ucp_rkey_destroy(key);
      if (memh_ != nullptr) ucp_mem_unmap(t_.context_, memh_);
    }
    size_t bytes() const override { return t_.options_.window_bytes; }
    char* local() override { return base_; }
    const char* peer(int peer) override {
      if (peer == t_.rank_) return base_;
      auto it = mapped_.find(peer);
      if (it != mapped_.end()) return it->second;
      const std::string entry = t_.store_->get(window_key(peer));
      if (entry.size() <= sizeof(char*)) return mapped_[peer] = nullptr;
      char* remote = nullptr;
      std::memcpy(&remote, entry.data(), sizeof remote);
      ucp_rkey_h key = nullptr;
      void* local = nullptr;
      if (ucp_ep_rkey_unpack(t_.endpoint(peer), entry.data() + sizeof remote, &key) == UCS_OK) {
        keys_[peer] = key;
        if (ucp_rkey_ptr(key, reinterpret_cast<uint64_t>(remote), &local) != UCS_OK) local = nullptr;
      }
      return mapped_[peer] = static_cast<const char*>(local);
    }

   private:
    static std::string window_key(int rank) { return cat("h2/ucx/window/", rank); }
    UcxTransport& t_;
    ucp_mem_h memh_ = nullptr;
    char* base_ = nullptr;
    std::map<int, ucp_rkey_h> keys_;
    std::map<int, const char*> mapped_;
  };

  int rank_, size_;
  std::shared_ptr<StoreClient> store_;
  UcxOptions options_;
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  int efd_ = -1;
  std::map<int, ucp_ep_h> endpoints_;
  char dummy_ = 0;  // the buffer of zero-byte messages
  std::unique_ptr<Window> window_;
  std::chrono::steady_clock::time_point next_liveness_check_{};
  std::chrono::steady_clock::time_point last_progress_{};
};

UcxRequest::~UcxRequest() {
  if (request_ == nullptr || !UCS_PTR_IS_PTR(request_)) return;
  if (ucp_request_check_status(request_) == UCS_INPROGRESS) {
    // Abandoned (an error elsewhere): a receive must not write into a buffer its owner is about to free.
    if (is_recv_) {
      ucp_request_cancel(transport_->worker(), request_);
      while (ucp_request_check_status(request_) == UCS_INPROGRESS) ucp_worker_progress(transport_->worker());
    }
  }
  ucp_request_free(request_);
}

std::string UcxRequest::describe() const {
  return cat(is_recv_ ? "receive of " : "send of ", bytes_, " bytes ", is_recv_ ? "from" : "to", " rank ", peer_,
             " (tag ", tag_, ")");
}

ucs_status_t UcxRequest::poll_status() {
  if (request_ == nullptr) return UCS_OK;
  ucs_status_t status;
  ucp_tag_recv_info_t info{};
  status = is_recv_ ? ucp_tag_recv_request_test(request_, &info) : ucp_request_check_status(request_);
  if (status == UCS_INPROGRESS) return status;
  ucp_request_free(request_);
  request_ = nullptr;
  if (status == UCS_ERR_MESSAGE_TRUNCATED) {
    throw CommError(cat("rank ", transport_->rank(), ": ", describe(),
                        ": the sender sent more; the ranks disagree on the operation's size"));
  }
  if (status != UCS_OK) {
    // A peer failure (UCX's endpoint timeout or reset): the peer of this request, unless the store knows better.
    transport_->force_liveness_check();
    const std::string dead = transport_->dead_peers_note();
    throw CommError(cat("rank ", transport_->rank(), ": ", describe(), ": ", ucs_status_string(status), "; ",
                        dead.empty() ? cat("rank ", peer_, " died or cannot be reached") : dead));
  }
  if (is_recv_ && info.length != bytes_) {
    throw CommError(cat("rank ", transport_->rank(), ": ", describe(), ": rank ", peer_, " sent ", info.length,
                        " bytes; the ranks disagree on the operation's size"));
  }
  return status;
}

bool UcxRequest::test() {
  ucp_worker_progress(transport_->worker());
  return poll_status() != UCS_INPROGRESS;
}

void UcxRequest::wait(std::chrono::milliseconds timeout) {
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + timeout;
  while (poll_status() == UCS_INPROGRESS) {
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) {
      throw CommError(cat("rank ", transport_->rank(), ": ", describe(), " timed out after ", timeout.count(),
                          " ms; is rank ", peer_, " alive and in the same operation?"));
    }
    if (now - start >= transport_->liveness_interval()) {
      const std::string dead = transport_->dead_peers_note();
      if (!dead.empty()) throw CommError(cat("rank ", transport_->rank(), ": ", describe(), " abandoned: ", dead));
    }
    transport_->progress_or_sleep(start,
                                  std::min(transport_->liveness_interval(),
                                           std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now)));
  }
}

}  // namespace

std::shared_ptr<Transport> make_ucx_transport(int rank, int size, std::shared_ptr<StoreClient> store,
                                              UcxOptions options) {
  return std::make_shared<UcxTransport>(rank, size, std::move(store), options);
}

}  // namespace h2
