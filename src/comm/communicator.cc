// Communicator: groups, tags, blocking steps with timeouts, and split().
#include "comm/communicator.h"

#include <algorithm>
#include <cstring>

#include "core/hash.h"

namespace h2 {

// Transport tags have 48 bits (transport.h): the group (10 bits), the collective's sequence number (22 bits,
// wrapping: matching is in order, so only 4M collectives in flight at once would collide) and the step within it
// (16 bits). User point-to-point tags take the sequence field's place with step 0xffff, which no collective uses.
uint64_t Communicator::tag(uint64_t sequence, int step) const {
  return (group_id_ << 38) | ((sequence & 0x3fffff) << 16) | (static_cast<uint64_t>(step) & 0xffff);
}

uint64_t Communicator::user_tag(uint32_t tag, const char* op) const {
  if (tag >= kMaxUserTag) {
    throw Error(ErrorCode::kInvalidArgument, cat(op, ": tag ", tag, " is not below ", kMaxUserTag));
  }
  return (group_id_ << 38) | (uint64_t{tag} << 16) | 0xffff;
}

Communicator::Communicator(std::shared_ptr<Transport> transport, CommOptions options)
    : transport_(std::move(transport)), options_(options) {
  for (int r = 0; r < transport_->size(); ++r) members_.push_back(r);
  rank_ = transport_->rank();
}

Communicator::Communicator(std::shared_ptr<Transport> transport, std::vector<int> members, uint64_t group_id,
                           CommOptions options)
    : transport_(std::move(transport)), members_(std::move(members)), group_id_(group_id), options_(options) {
  rank_ = static_cast<int>(std::find(members_.begin(), members_.end(), transport_->rank()) - members_.begin());
}

void Communicator::wait(Request& request, const char* op, int peer, int step) {
  try {
    request.wait(options_.timeout);
  } catch (const CommError& e) {
    // In a sub-group, also say which job rank that is: the transport's part of the message uses job ranks.
    const bool world = members_.size() == static_cast<size_t>(transport_->size());
    const std::string who = world || peer < 0 || peer >= size()
                                ? cat("rank ", peer)
                                : cat("group rank ", peer, " (job rank ", job_rank(peer), ")");
    throw CommError(cat(op, " (rank ", rank_, " of ", size(), ", step ", step, ") waiting for ", who, ": ", e.what()));
  }
}

void Communicator::send(const void* data, size_t bytes, int peer, const char* op, int step) {
  auto r = isend_step(data, bytes, peer, step);
  wait(*r, op, peer, step);
}

void Communicator::recv(void* data, size_t bytes, int peer, const char* op, int step) {
  auto r = irecv_step(data, bytes, peer, step);
  wait(*r, op, peer, step);
}

void Communicator::send_recv(const void* send_data, size_t send_bytes, int to, void* recv_data, size_t recv_bytes,
                             int from, const char* op, int step) {
  // The receive first: a message that arrives before its receive is posted is buffered and copied once more.
  auto r = irecv_step(recv_data, recv_bytes, from, step);
  auto s = isend_step(send_data, send_bytes, to, step);
  wait(*r, op, from, step);
  wait(*s, op, to, step);
}

void Communicator::send_recv_chunked(const void* send_data, size_t send_bytes, int to, void* recv_data,
                                     size_t recv_bytes, int from, size_t chunk, const char* op, int step,
                                     const std::function<void(size_t, size_t)>& arrived) {
  // One tag for all chunks: messages from one sender with one tag are matched in the order they were sent.
  // Blocks of a few chunks go whole: there the per-message cost outweighs the cache.
  if (std::max(send_bytes, recv_bytes) < 4 * chunk) chunk = std::max<size_t>(1, std::max(send_bytes, recv_bytes));
  std::vector<std::unique_ptr<Request>> receives, sends;
  for (size_t at = 0; at < recv_bytes || (at == 0 && recv_bytes == 0); at += chunk) {
    receives.push_back(irecv_step(static_cast<char*>(recv_data) + at, std::min(chunk, recv_bytes - at), from, step));
    if (recv_bytes == 0) break;
  }
  for (size_t at = 0; at < send_bytes || (at == 0 && send_bytes == 0); at += chunk) {
    sends.push_back(isend_step(static_cast<const char*>(send_data) + at, std::min(chunk, send_bytes - at), to, step));
    if (send_bytes == 0) break;
  }
  for (size_t i = 0; i < receives.size(); ++i) {
    wait(*receives[i], op, from, step);
    const size_t at = i * chunk;
    if (at < recv_bytes) arrived(at, std::min(chunk, recv_bytes - at));
  }
  for (auto& s : sends) wait(*s, op, to, step);
}

std::unique_ptr<Request> Communicator::isend_step(const void* data, size_t bytes, int peer, int step) {
  return transport_->isend(job_rank(peer), tag(sequence_, step), data, bytes);
}

std::unique_ptr<Request> Communicator::irecv_step(void* data, size_t bytes, int peer, int step) {
  return transport_->irecv(job_rank(peer), tag(sequence_, step), data, bytes);
}

SharedWindow* Communicator::shared_window() {
  if (window_use_ == WindowUse::kUndecided) {
    // Each member makes its own window first (so that the peers' lookups below find it), then tries to map every
    // other member's; the group uses the windows only if every member could.
    SharedWindow* w = transport_->window();
    bool mapped = w != nullptr && w->local() != nullptr;
    for (int peer = 0; mapped && peer < size(); ++peer) mapped = w->peer(job_rank(peer)) != nullptr;
    float unmapped = mapped ? 0.0f : 1.0f;
    all_reduce(&unmapped, 1, DType::kF32, ReduceOp::kMax);
    window_use_ = unmapped == 0.0f ? WindowUse::kYes : WindowUse::kNo;
  }
  return window_use_ == WindowUse::kYes ? transport_->window() : nullptr;
}

std::unique_ptr<Request> Communicator::isend(const void* data, size_t bytes, int peer, uint32_t tag) {
  if (peer < 0 || peer >= size())
    throw Error(ErrorCode::kInvalidArgument, cat("send: peer ", peer, " is not in the group of ", size()));
  return transport_->isend(job_rank(peer), user_tag(tag, "send"), data, bytes);
}

std::unique_ptr<Request> Communicator::irecv(void* data, size_t bytes, int peer, uint32_t tag) {
  if (peer < 0 || peer >= size())
    throw Error(ErrorCode::kInvalidArgument, cat("recv: peer ", peer, " is not in the group of ", size()));
  return transport_->irecv(job_rank(peer), user_tag(tag, "recv"), data, bytes);
}

float* Communicator::scratch(int which, size_t count) {
  std::vector<float>& b = scratch_[which];
  if (b.size() < count) {
    b.resize(count);
    ++buffer_growths_;
  }
  return b.data();
}

void Communicator::set_hosts(const std::string& host) {
  // Colour = 31 bits of a hash of the host id; ranks of one host form `local`, ranks with the same local rank
  // across hosts form `cross`.
  auto local = std::make_unique<Communicator>(split(static_cast<int>(fnv1a(host) & 0x7fffffff), rank_));
  auto cross = std::make_unique<Communicator>(split(local->rank(), rank_));
  // Hierarchy applies when there is more than one host and every host has the same number of ranks.
  float shape[2] = {static_cast<float>(local->size()), -static_cast<float>(local->size())};
  all_reduce(shape, 2, DType::kF32, ReduceOp::kMax);
  const bool uniform = shape[0] == -shape[1];
  local_.reset();
  cross_.reset();
  if (uniform && cross->size() > 1 && local->size() > 1) {
    local_ = std::move(local);
    cross_ = std::move(cross);
  }
}

// Every rank learns every rank's (colour, key) with an all-gather, then builds its group alone; all members of
// a group compute the same member list and the same group id.
Communicator Communicator::split(int color, int key) {
  std::vector<int32_t> mine = {color, key}, all(static_cast<size_t>(2 * size()));
  all[static_cast<size_t>(2 * rank_)] = color;
  all[static_cast<size_t>(2 * rank_ + 1)] = key;
  next_sequence();
  // Everyone sends its pair to everyone: split is rare and its messages are 8 bytes.
  std::vector<std::pair<int, std::unique_ptr<Request>>> sends;
  for (int peer = 0; peer < size(); ++peer) {
    if (peer != rank_) sends.push_back({peer, isend_step(mine.data(), 8, peer, 0)});
  }
  for (int peer = 0; peer < size(); ++peer) {
    if (peer != rank_) recv(all.data() + 2 * peer, 8, peer, "split", 0);
  }
  for (auto& [peer, request] : sends) wait(*request, "split", peer, 0);
  std::vector<std::pair<int, int>> group;  // (key, rank) of my colour
  for (int r = 0; r < size(); ++r) {
    if (all[static_cast<size_t>(2 * r)] == color) group.push_back({all[static_cast<size_t>(2 * r + 1)], r});
  }
  std::sort(group.begin(), group.end());
  std::vector<int> members;
  for (const auto& [k, r] : group) members.push_back(job_rank(r));
  // The group id: a hash of the parent's id, the split's sequence number and the colour, in 10 bits.
  uint64_t id = group_id_ * 1000003u + sequence_ * 7919u + static_cast<uint64_t>(static_cast<uint32_t>(color)) + 1;
  id = (id ^ (id >> 10) ^ (id >> 20) ^ (id >> 40)) & 0x3ff;
  return Communicator(transport_, members, id, options_);
}

}  // namespace h2
