#include "issue_order.h"

namespace mccl {
namespace {
// The gate whose completion this thread is running (Work::CompletionScope), if any. A thread-local rather
// than an argument: the collectives issued inside a future's callbacks reach the engine through torch's API
// (a comm hook's dist.all_reduce), which has no way to carry it.
thread_local const OrderNode* t_scope = nullptr;
}  // namespace

const OrderNode* completion_scope_enter(const OrderNode* node) {
  const OrderNode* previous = t_scope;
  t_scope = node;
  return previous;
}

void completion_scope_leave(const OrderNode* previous) { t_scope = previous; }

void IssueOrder::detach() {
  std::lock_guard<std::mutex> lock(mu_);
  wake_ = nullptr;
}

void IssueOrder::add(PendingCollective op, const std::shared_ptr<IssueOrder>& self) {
  std::lock_guard<std::mutex> lock(mu_);
  // A child of the gate whose completion runs here; anything else (no scope, another communicator's
  // gate, a completion that is not a gate) is issued at the root, in this thread's program order.
  OrderNode* parent = root_.get();
  if (t_scope && t_scope->owner == this && t_scope->gate && !t_scope->returned)
    parent = const_cast<OrderNode*>(t_scope);
  if (!parent->children.empty()) parent->children.back()->decided = true;  // a sibling follows it now
  auto node = std::make_shared<OrderNode>();
  node->owner = this;
  node->order = self;
  node->parent = parent;
  node->identity = op.identity;
  node->op = std::move(op);
  node->op.work->order_node_ = node;  // a cycle until the op starts and is moved out
  parent->children.push_back(std::move(node));
  ++queued_;
}

// Pre-order from the root each time (the tree is as deep as callbacks nest, and as wide as what is
// queued). A finished node is left at the front of its parent's children while its own children run
// and while it is "open": a gate not yet returned, or a node that may still become one.
IssueOrder::Next IssueOrder::next(uint64_t seq, bool ignore_gates) {
  std::lock_guard<std::mutex> lock(mu_);
  Next out;
  OrderNode* n = root_.get();
  while (true) {
    if (!n->children.empty()) {
      OrderNode* c = n->children.front().get();
      if (c->started) {
        n = c;
        continue;
      }
      c->started = true;
      c->identity.seq = seq;
      out.op = std::move(c->op);
      out.op.identity = c->identity;
      out.run = true;
      running_ = n->children.front();
      --queued_;
      return out;
    }
    if (n == root_.get()) return out;
    const bool open = n->gate ? !n->returned : !n->decided;
    if (open && !ignore_gates) {
      out.held = n->gate;
      out.gate = n->identity;
      out.gate_finished = n->finished_at;
      return out;
    }
    OrderNode* parent = n->parent;
    parent->children.pop_front();
    n = parent;
  }
}

void IssueOrder::finished() {
  std::lock_guard<std::mutex> lock(mu_);
  if (running_) running_->finished_at = Clock::now();
  running_.reset();
}

size_t IssueOrder::queued() const {
  std::lock_guard<std::mutex> lock(mu_);
  return queued_;
}

std::vector<PendingCollective> IssueOrder::drop_queued() {
  std::vector<PendingCollective> dropped;
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<OrderNode*> stack{root_.get()};
  while (!stack.empty()) {
    OrderNode* n = stack.back();
    stack.pop_back();
    if (n != root_.get() && !n->started) dropped.push_back(std::move(n->op));
    for (auto it = n->children.rbegin(); it != n->children.rend(); ++it) stack.push_back(it->get());
  }
  root_->children.clear();
  queued_ = 0;
  return dropped;
}

void IssueOrder::hold(OrderNode& node) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!node.decided && !node.returned) node.gate = true;
  node.decided = true;
}

void IssueOrder::release(OrderNode& node) {
  std::lock_guard<std::mutex> lock(mu_);
  node.returned = true;
  // Its context has ended: its last child can no longer become a gate.
  if (!node.children.empty()) node.children.back()->decided = true;
  if (wake_) wake_();
}

}  // namespace mccl
