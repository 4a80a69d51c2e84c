// The order in which a communicator starts its collectives: the same on every rank, whatever the
// timing of completion callbacks (docs/completion-order.md explains why).
//
// Collectives form a tree. One issued on an ordinary thread is a child of the root. One issued while
// the completion of a "gate" G runs on this thread (inside Work::CompletionScope: the callbacks on G's
// torch future) is a child of G. A collective becomes a gate when someone asks to hear of its
// completion (Work::hold_successors(): a future was requested) before the next collective beside it
// was issued. The progress thread starts collectives in pre-order: a collective, then its children
// in issue order (recursively), then its next sibling. It does not go past a gate whose completion
// has not returned, so what was issued after G waits for G's completion and for what it issued.
//
// Thread-safe (one mutex): the progress thread calls next() / finished(), callers add(), completion
// threads reach hold() / release() through their Work.
#pragma once

#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "collective.h"
#include "wire.h"
#include "work.h"

namespace mccl {

// One queued collective: who it is and what runs it.
struct PendingCollective {
  FrameHeader identity;  // seq is set when it starts, in execution order
  std::function<void(Collective&)> body;
  WorkPtr work;
  std::function<void()> ready;  // runs on the progress thread right before it starts (may be empty)
  std::chrono::steady_clock::time_point issued;  // for the traffic counters' time in flight (stats.h)
};

class IssueOrder;

struct OrderNode {
  IssueOrder* owner = nullptr;       // compared only: which communicator's tree
  std::weak_ptr<IssueOrder> order;   // for Work's calls, which may outlive the communicator
  OrderNode* parent = nullptr;
  std::deque<std::shared_ptr<OrderNode>> children;  // in issue order; the front is the next to visit
  PendingCollective op;              // moved out when it starts
  FrameHeader identity;
  bool started = false;
  bool gate = false;      // successors wait for its completion to return
  bool decided = false;   // whether it is a gate is final
  bool returned = false;  // its completion has returned
  Clock::time_point finished_at{};
};

class IssueOrder {
 public:
  // `wake` interrupts the progress thread's wait; it is called under this object's lock, so it must
  // not take the communicator's.
  explicit IssueOrder(std::function<void()> wake) : root_(std::make_shared<OrderNode>()), wake_(std::move(wake)) {}
  void detach();  // no more wakes: the communicator is going away

  // Queues `op` in this thread's context (see above) and links op.work to its node.
  void add(PendingCollective op, const std::shared_ptr<IssueOrder>& self);

  struct Next {
    bool run = false;               // op is the next collective, now started
    PendingCollective op;
    bool held = false;              // nothing to start: an unreturned gate holds the next one back
    FrameHeader gate;               // that gate
    Clock::time_point gate_finished{};
  };
  // seq: the sequence number the next collective gets. ignore_gates: after a fatal error the order no
  // longer matters; everything queued drains.
  Next next(uint64_t seq, bool ignore_gates);
  void finished();  // the collective started last has finished (its gate timer starts)

  size_t queued() const;
  std::vector<PendingCollective> drop_queued();  // every collective not started yet, in order (abort)

  // Through Work (work.h).
  void hold(OrderNode& node);
  void release(OrderNode& node);

 private:
  mutable std::mutex mu_;
  std::shared_ptr<OrderNode> root_;
  std::shared_ptr<OrderNode> running_;
  std::function<void()> wake_;
  size_t queued_ = 0;
};

}  // namespace mccl
