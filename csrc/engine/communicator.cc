#include "communicator.h"

#include <optional>

#include "algorithms/algorithms.h"
#include "bootstrap.h"
#include "cpus.h"
#include "error.h"
#include "log.h"
#include "netif.h"
#include "reduce.h"
#include "thread_name.h"

namespace mccl {
Communicator::Communicator(Store& store, int rank, int size, std::chrono::milliseconds timeout,
                           const std::string& route_to, const Config& config)
    : config_(config), rank_(rank), size_(size), timeout_ms_(timeout.count()), timeline_(config_.timeline_entries),
      idle_spin_(config_.spin_auto, std::chrono::microseconds(config_.spin_us), SpinPolicy::Site::kProgress),
      caller_spin_(std::make_shared<SpinPolicy>(config_.spin_auto, std::chrono::microseconds(config_.spin_us),
                                                SpinPolicy::Site::kHelper)) {
  MCCL_CHECK_ARG(size >= 1 && rank >= 0 && rank < size, "rank ", rank, " is not in a world of size ", size);
  std::string host = choose_listen_host(config_.socket_ifname, route_to);
  Mesh mesh = connect_mesh(store, rank, size, host, Clock::now() + timeout, config_);
  listen_address_ = mesh.listen_address;
  for (Socket& sock : mesh.peers) {
    if (sock.valid()) sock.configure_for_data(config_.socket_buffer_bytes);
  }
  transport_ = std::make_unique<Transport>(rank, size, mesh.comm_id, std::move(mesh.peers),
                                           std::move(mesh.peer_addresses), config_.max_message_bytes, mesh.nsocks);
  transport_->set_stats(&stats_);
  transport_->set_heartbeat(config_.heartbeat_interval, config_.heartbeat_timeout);
  transport_->set_spin(config_.spin_auto, std::chrono::microseconds(config_.spin_us));
  const int local_ranks = ranks_on_this_host();
  const CpuCount cpus = process_cpus();
  const size_t send_thread_bytes = config_.send_thread_bytes_for(local_ranks, cpus.cpus);
  transport_->set_send_thread(send_thread_bytes);
  reduce_threads_ = config_.reduce_threads_for(local_ranks, cpus.cpus);
  limit_spinning_threads(cpus.cpus / static_cast<unsigned>(local_ranks));
  log(LogLevel::kInfo, "rank ", rank, ": sender thread ",
      send_thread_bytes ? "for frames of " + std::to_string(send_thread_bytes) + " bytes or more" : std::string("off"),
      ", ", reduce_threads_, " reduce thread(s), ",
      config_.spin_auto ? "adaptive spin on " + std::to_string(spinning_threads_limit()) + " thread(s) at most"
                        : "spin " + std::to_string(config_.spin_us) + " us",
      " (", local_ranks, " ranks on this host; this process may use ", cpus.describe(), ")");
  transport_->set_on_wakeup([this] { drain_commands(); });
  order_ = std::make_shared<IssueOrder>([this] {
    transport_->wake();
    cv_.notify_all();
  });
  thread_ = std::thread([this] {
    set_thread_name("mccl-progress");
    run();
  });
}

// Ranks whose address has this rank's host part (this one included): the ranks sharing its CPUs.
int Communicator::ranks_on_this_host() const {
  auto host_of = [](const std::string& address) { return address.substr(0, address.rfind(':')); };
  const std::string mine = host_of(listen_address_);
  int count = 0;
  for (int r = 0; r < size_; ++r) count += r == rank_ || host_of(transport_->address_of(r)) == mine;
  return count;
}

Communicator::~Communicator() {
  // Nobody can wait on work that is still queued at destruction: do not make them wait for peers.
  if (order_->queued() == 0) shutdown();
  else abort();
  order_->detach();
}

uint64_t Communicator::collectives_issued() const {
  std::lock_guard<std::mutex> lock(mu_);
  return issued_;
}

// ---- argument checks (caller's thread) -----------------------------------------------------------

void Communicator::check_usable() const {
  std::lock_guard<std::mutex> lock(mu_);
  throw_if_unusable();
}

void Communicator::throw_if_unusable() const {
  if (error_) std::rethrow_exception(error_);
  if (stopping_) fail(Error::Kind::kAborted, "rank ", rank_, ": the communicator was shut down");
}

void Communicator::check_reduction(DataType dtype, ReduceOp op, const char* what) const {
  MCCL_CHECK_ARG(op_supported(dtype, op), "rank ", rank_, ": ", what, " does not support reduce op ", op_name(op),
                 " on ", dtype_name(dtype), " tensors");
}

void Communicator::check_rank(int rank, const char* role, const char* what) const {
  MCCL_CHECK_ARG(rank >= 0 && rank < size_, "rank ", rank_, ": ", what, " got ", role, " rank ", rank,
                 ", outside the group of size ", size_);
}

// ---- the public operations ----------------------------------------------------------------------

// Only reductions (gradients) travel compressed: broadcast, gather and the like move data that must arrive
// exact (DDP's broadcast of the initial weights, for one).
Communicator::Wire Communicator::wire_of_setting(CollectiveKind kind, DataType dtype) const {
  const bool reduction = kind == CollectiveKind::kAllreduce || kind == CollectiveKind::kReduce ||
                         kind == CollectiveKind::kReduceScatter;
  return {dtype == DataType::kFloat32 && reduction ? wire_type_of_setting(config_.wire_dtype) : WireType::kExact};
}

WorkPtr Communicator::enqueue(CollectiveKind kind, DataType dtype, ReduceOp op, int root, uint64_t count, Wire wire,
                              std::function<void(Collective&)> body, Callback done, StartAfter start_after) {
  auto work = std::make_shared<Work>(std::move(done));
  work->count_waits_in(&stats_.of(static_cast<uint8_t>(kind)).wait_ns);
  work->spin_with(caller_spin_);
  bool wake;
  {
    std::lock_guard<std::mutex> lock(mu_);
    throw_if_unusable();
    FrameHeader id;
    id.channel = static_cast<uint8_t>(Channel::kCollective);
    id.kind = static_cast<uint8_t>(kind);
    ++issued_;
    id.dtype = static_cast<uint8_t>(dtype);
    id.reduce_op = static_cast<uint8_t>(op);
    id.root = static_cast<uint16_t>(root);
    id.count = count;
    id.wire_dtype = static_cast<uint8_t>(wire.type);
    order_->add(PendingCollective{id, std::move(body), work, std::move(start_after), Clock::now()}, order_);
    wake = !spinning_;
  }
  if (wake) transport_->wake();
  return work;
}

WorkPtr Communicator::allreduce(void* buf, size_t count, DataType dtype, ReduceOp op, Callback done,
                                StartAfter start_after) {
  check_usable();
  check_reduction(dtype, op, "allreduce");
  return enqueue(CollectiveKind::kAllreduce, dtype, op, 0, count, wire_of_setting(CollectiveKind::kAllreduce, dtype),
                 [=](Collective& c) { mccl::allreduce(c, buf, count); }, std::move(done), std::move(start_after));
}

WorkPtr Communicator::broadcast(void* buf, size_t count, DataType dtype, int root, Callback done,
                                StartAfter start_after) {
  check_usable();
  dtype_size(dtype);
  check_rank(root, "root", "broadcast");
  return enqueue(CollectiveKind::kBroadcast, dtype, ReduceOp::kSum, root, count, Wire{},
                 [=](Collective& c) { mccl::broadcast(c, buf, count, root); }, std::move(done), std::move(start_after));
}

WorkPtr Communicator::reduce(void* buf, size_t count, DataType dtype, ReduceOp op, int root, Callback done,
                             StartAfter start_after) {
  check_usable();
  check_reduction(dtype, op, "reduce");
  check_rank(root, "root", "reduce");
  return enqueue(CollectiveKind::kReduce, dtype, op, root, count, wire_of_setting(CollectiveKind::kReduce, dtype),
                 [=](Collective& c) { mccl::reduce(c, buf, count, root); }, std::move(done), std::move(start_after));
}

WorkPtr Communicator::allgather(const void* in, size_t count, DataType dtype, std::vector<char*> outs,
                                Callback done, StartAfter start_after) {
  check_usable();
  dtype_size(dtype);
  MCCL_CHECK_ARG(static_cast<int>(outs.size()) == size_, "rank ", rank_, ": allgather needs ", size_,
                 " output buffers (one per rank), got ", outs.size());
  return enqueue(CollectiveKind::kAllgather, dtype, ReduceOp::kSum, 0, count, Wire{},
                 [=](Collective& c) { mccl::allgather(c, in, count, outs); }, std::move(done), std::move(start_after));
}

WorkPtr Communicator::reduce_scatter(const void* in, size_t count, DataType dtype, ReduceOp op, void* out,
                                     Callback done, StartAfter start_after) {
  check_usable();
  check_reduction(dtype, op, "reduce_scatter");
  return enqueue(CollectiveKind::kReduceScatter, dtype, op, 0, count,
                 wire_of_setting(CollectiveKind::kReduceScatter, dtype),
                 [=](Collective& c) { mccl::reduce_scatter(c, in, count, out); },
                 std::move(done), std::move(start_after));
}

WorkPtr Communicator::gather(const void* in, size_t count, DataType dtype, std::vector<char*> outs, int root,
                             Callback done, StartAfter start_after) {
  check_usable();
  check_rank(root, "root", "gather");
  MCCL_CHECK_ARG(rank_ != root || static_cast<int>(outs.size()) == size_, "rank ", rank_, ": gather root needs ",
                 size_, " output buffers, got ", outs.size());
  const size_t bytes = count * dtype_size(dtype);
  return enqueue(CollectiveKind::kGather, dtype, ReduceOp::kSum, root, count, Wire{},
                 [=](Collective& c) { mccl::gather(c, in, bytes, outs, root); },
                 std::move(done), std::move(start_after));
}

WorkPtr Communicator::scatter(std::vector<const char*> ins, void* out, size_t count, DataType dtype, int root,
                              Callback done, StartAfter start_after) {
  check_usable();
  check_rank(root, "root", "scatter");
  MCCL_CHECK_ARG(rank_ != root || static_cast<int>(ins.size()) == size_, "rank ", rank_, ": scatter root needs ",
                 size_, " input buffers, got ", ins.size());
  const size_t bytes = count * dtype_size(dtype);
  return enqueue(CollectiveKind::kScatter, dtype, ReduceOp::kSum, root, count, Wire{},
                 [=](Collective& c) { mccl::scatter(c, ins, out, bytes, root); },
                 std::move(done), std::move(start_after));
}

WorkPtr Communicator::alltoall(const void* in, std::vector<size_t> send_counts, void* out,
                               std::vector<size_t> recv_counts, DataType dtype, Callback done, StartAfter start_after) {
  check_usable();
  dtype_size(dtype);
  MCCL_CHECK_ARG(static_cast<int>(send_counts.size()) == size_ && static_cast<int>(recv_counts.size()) == size_,
                 "rank ", rank_, ": alltoall needs ", size_, " send and receive counts, got ", send_counts.size(),
                 " and ", recv_counts.size());
  MCCL_CHECK_ARG(send_counts[rank_] == recv_counts[rank_], "rank ", rank_, ": alltoall sends ",
                 send_counts[rank_], " elements to itself but expects to receive ", recv_counts[rank_]);
  uint64_t total = 0;
  for (size_t c : send_counts) total += c;
  return enqueue(CollectiveKind::kAlltoall, dtype, ReduceOp::kSum, 0, total, Wire{},
                 [=](Collective& c) { mccl::alltoall(c, in, send_counts, out, recv_counts); },
                 std::move(done), std::move(start_after));
}

void Communicator::check_int8(ReduceOp op) const {
  check_usable();
  MCCL_CHECK_ARG(op == ReduceOp::kSum || op == ReduceOp::kAvg, "rank ", rank_, ": the 8-bit allreduce sums or "
                 "averages, it does not support reduce op ", op_name(op));
}

WorkPtr Communicator::allreduce_int8(float* buf, size_t count, ReduceOp op, float* residual, Callback done,
                                     StartAfter start_after) {
  check_int8(op);
  return enqueue(CollectiveKind::kAllreduce, DataType::kFloat32, op, 0, count, Wire{WireType::kInt8Blocks},
                 [=](Collective& c) { allreduce_int8_values(c, buf, count, residual); }, std::move(done),
                 std::move(start_after));
}

WorkPtr Communicator::allreduce_int8_blocks(char* blocks, size_t count, ReduceOp op, float* owned_error,
                                            Callback done, StartAfter start_after) {
  check_int8(op);
  return enqueue(CollectiveKind::kAllreduce, DataType::kFloat32, op, 0, count, Wire{WireType::kInt8Blocks},
                 [=](Collective& c) { mccl::allreduce_int8_blocks(c, blocks, count, owned_error); },
                 std::move(done), std::move(start_after));
}

WorkPtr Communicator::barrier(Callback done, StartAfter start_after) {
  check_usable();
  return enqueue(CollectiveKind::kBarrier, DataType::kUInt8, ReduceOp::kSum, 0, 0, Wire{},
                 [](Collective& c) { mccl::barrier(c); }, std::move(done), std::move(start_after));
}

// ---- the progress thread ------------------------------------------------------------------------

void Communicator::drain_commands() {
  std::deque<std::function<void()>> batch;
  bool aborting;
  {
    std::lock_guard<std::mutex> lock(mu_);
    batch.swap(commands_);
    aborting = abort_requested_;
  }
  for (auto& command : batch) command();
  if (aborting) fail(Error::Kind::kAborted, "rank ", rank_, ": the communicator was aborted");
}

void Communicator::run() {
  std::optional<SpinPolicy::Wait> idle;  // from the end of a collective to the start of the next
  while (true) {
    IssueOrder::Next next;
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (transport_->fatal_error()) {
        if (!error_) error_ = transport_->fatal_error();  // from here on enqueue() refuses (see cv_)
        cv_.wait(lock, [this] { return stopping_ || order_->queued() > 0 || !commands_.empty(); });
      }
      next = order_->next(next_seq_, /*ignore_gates=*/transport_->fatal_error() != nullptr);
      if (!next.run && stopping_ && order_->queued() == 0) break;
      // Decided under the lock that enqueue() takes: an op queued while this says "spinning" is seen at
      // the next round without a wake, one queued after it stops spinning gets the wake.
      spinning_ = !next.run && idle && idle->spinning();
    }
    if (next.run) {
      idle.reset();
      ++next_seq_;
      run_op(next.op);
      order_->finished();
      idle.emplace(&idle_spin_);
      continue;
    }
    if (transport_->fatal_error()) {
      drain_commands_after_failure();
      continue;
    }
    try {
      if (spinning_) {
        transport_->progress(0);
        idle->pause();
        continue;
      }
      transport_->progress(poll_timeout_ms(next));
      check_p2p_deadlines();
      check_gate_deadline(next);
    } catch (...) {
      transport_->fail(std::current_exception());
      std::lock_guard<std::mutex> lock(mu_);
      if (!error_) error_ = transport_->fatal_error();
    }
  }
  // Whatever is still posted (receives nobody sent) fails now rather than never. A clean shutdown:
  // the peers see the connections close, no abort.
  transport_->fail(std::make_exception_ptr(Error(
                       Error::Kind::kAborted, "MCCL aborted: rank " + std::to_string(rank_) + "'s communicator was shut down")),
                   /*notify_peers=*/false);
  // So do the sends and receives queued but not yet posted: the loop can stop before it has run them, and
  // none comes after it stopped (post_p2p queues only while stopping_ is unset, under mu_).
  drain_commands_after_failure();
}

// A gate's completion runs user callbacks; one that never returns (it waits on a collective issued
// after the gate, which the gate holds back) would hang every later collective. It gets the timeout.
int Communicator::poll_timeout_ms(const IssueOrder::Next& next) {
  int ms = p2p_poll_timeout_ms();
  if (!next.held) return ms;
  int gate_ms = std::max(1, ms_until(next.gate_finished + timeout(), 60 * 1000));
  return ms < 0 ? gate_ms : std::min(ms, gate_ms);
}

void Communicator::check_gate_deadline(const IssueOrder::Next& next) {
  if (!next.held || Clock::now() < next.gate_finished + timeout()) return;
  fail(Error::Kind::kTimeout, "rank ", rank_, " timed out after ", timeout().count(), " ms waiting for the completion of ",
       describe(next.gate), " (the callbacks on its future) to return; the collectives issued after it wait for "
       "that. A callback that waits on a collective issued after the future was requested never returns");
}

void Communicator::drain_commands_after_failure() {
  try {
    drain_commands();
  } catch (...) {
  }
}

void Communicator::run_op(PendingCollective& op) {
  const auto started = Clock::now();
  auto ready = started;
  std::exception_ptr error = transport_->fatal_error();
  if (!error) {
    transport_->set_context(op.identity);
    if (log_enabled(LogLevel::kTrace)) log(LogLevel::kTrace, "rank ", rank_, " starts ", describe(op.identity));
    try {
      if (op.ready) {
        try {
          op.ready();
        } catch (...) {
          ready = Clock::now();  // the wait until it threw was staging too
          throw;
        }
        ready = Clock::now();
      }
      Collective c(*transport_, config_, reduce_threads_, scratch_, &wire_buffers_, op.identity,
                   Clock::now() + timeout());
      op.body(c);
      transport_->check_no_stray_frames(op.identity.seq);
    } catch (...) {
      error = std::current_exception();
      transport_->fail(error);
    }
    wire_buffers_.release_all();
    transport_->set_idle();
  }
  if (error) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!error_) error_ = transport_->fatal_error();
  }
  const auto done = Clock::now();
  stats_.collective_done(op.identity.kind, op.issued, started, done);
  timeline_.record(op.identity, op.issued, started, ready, done);
  op.work->finish(error);
}

void Communicator::abort() { stop(true); }

void Communicator::shutdown() { stop(false); }

void Communicator::stop(bool abort) {
  std::lock_guard<std::mutex> stopping(stop_mu_);
  if (!thread_.joinable()) return;
  std::vector<PendingCollective> dropped;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    if (abort) {
      abort_requested_ = true;
      dropped = order_->drop_queued();
    }
  }
  auto aborted = std::make_exception_ptr(
      Error(Error::Kind::kAborted, "MCCL aborted: rank " + std::to_string(rank_) + "'s communicator was aborted"));
  for (auto& op : dropped) op.work->finish(aborted);
  transport_->wake();
  cv_.notify_all();
  thread_.join();
  std::lock_guard<std::mutex> lock(mu_);
  if (abort && !error_) error_ = aborted;
}

}  // namespace mccl
