#include "wire.h"

#include <sstream>

#include "codec.h"

namespace mccl {

const char* collective_name(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::kAllreduce: return "allreduce";
    case CollectiveKind::kBroadcast: return "broadcast";
    case CollectiveKind::kReduce: return "reduce";
    case CollectiveKind::kAllgather: return "allgather";
    case CollectiveKind::kReduceScatter: return "reduce_scatter";
    case CollectiveKind::kGather: return "gather";
    case CollectiveKind::kScatter: return "scatter";
    case CollectiveKind::kAlltoall: return "alltoall";
    case CollectiveKind::kBarrier: return "barrier";
    case CollectiveKind::kSend: return "send/recv";
  }
  return "unknown-collective";
}

namespace {
std::string kind_text(uint8_t kind) {
  if (kind >= 1 && kind <= 10) return collective_name(static_cast<CollectiveKind>(kind));
  return "kind(" + std::to_string(kind) + ")";
}
std::string dtype_text(uint8_t dtype) {
  return is_valid_dtype(dtype) ? dtype_name(static_cast<DataType>(dtype)) : "dtype(" + std::to_string(dtype) + ")";
}
std::string op_text(uint8_t op) {
  return is_valid_op(op) ? op_name(static_cast<ReduceOp>(op)) : "op(" + std::to_string(op) + ")";
}
bool has_reduce(uint8_t kind) {
  auto k = static_cast<CollectiveKind>(kind);
  return k == CollectiveKind::kAllreduce || k == CollectiveKind::kReduce || k == CollectiveKind::kReduceScatter;
}
bool has_root(uint8_t kind) {
  auto k = static_cast<CollectiveKind>(kind);
  return k == CollectiveKind::kBroadcast || k == CollectiveKind::kReduce || k == CollectiveKind::kGather ||
         k == CollectiveKind::kScatter;
}
}  // namespace

std::string describe(const FrameHeader& h) {
  std::ostringstream out;
  if (h.channel == static_cast<uint8_t>(Channel::kPointToPoint)) {
    out << "send/recv (tag " << h.seq << ") of " << h.count << " " << dtype_text(h.dtype);
    return out.str();
  }
  out << kind_text(h.kind) << " #" << h.seq << " of " << h.count << " " << dtype_text(h.dtype);
  if (has_reduce(h.kind)) out << " (" << op_text(h.reduce_op) << ")";
  if (has_root(h.kind)) out << " with root " << h.root;
  return out.str();
}

std::string check_preamble(uint32_t magic, uint16_t version) {
  if (magic != kMagic) {
    std::ostringstream out;
    out << "bad magic 0x" << std::hex << magic << " (expected 0x" << kMagic
        << "): the peer is not an MCCL process of this job, or the stream is out of sync";
    return out.str();
  }
  if (version != kProtocolVersion) {
    return "peer speaks MCCL protocol version " + std::to_string(version) + ", this rank speaks " +
           std::to_string(kProtocolVersion) + ": install the same lightning-mccl version on every machine";
  }
  return "";
}

std::string check_frame_header(const FrameHeader& h, uint64_t comm_id, int sender, uint64_t max_payload) {
  std::string bad = check_preamble(h.magic, h.version);
  if (!bad.empty()) return bad;
  if (h.comm_id != comm_id) return "frame for another communicator";
  if (static_cast<int64_t>(h.src_rank) != sender) return "frame claims to come from rank " + std::to_string(h.src_rank);
  switch (static_cast<Channel>(h.channel)) {
    case Channel::kCollective:
    case Channel::kPointToPoint:
      if (!is_wire_type(h.wire_dtype)) return "unknown wire type " + std::to_string(h.wire_dtype);
      if (h.length > max_payload)
        return "frame of " + std::to_string(h.length) + " bytes exceeds MCCL_MAX_MESSAGE_BYTES=" + std::to_string(max_payload);
      return "";
    case Channel::kControl:
      if (h.kind == static_cast<uint8_t>(ControlKind::kAbort)) {
        if (h.length > kMaxControlPayload) return "control frame of " + std::to_string(h.length) + " bytes";
        return "";
      }
      if (h.kind == static_cast<uint8_t>(ControlKind::kHeartbeat)) {
        if (h.length != 0) return "heartbeat with a payload of " + std::to_string(h.length) + " bytes";
        return "";
      }
      return "unknown control frame kind " + std::to_string(h.kind);
  }
  return "unknown channel " + std::to_string(h.channel);
}

std::string compare_headers(const FrameHeader& expected, const FrameHeader& got, int my_rank) {
  std::ostringstream out;
  if (expected.wire_dtype != got.wire_dtype && expected.dtype == got.dtype) {
    auto wire = [](uint8_t w) { return std::string(wire_format_name(static_cast<WireType>(w))); };
    const auto int8 = static_cast<uint8_t>(WireType::kInt8Blocks);
    out << "rank " << got.src_rank << " sends " << describe(got) << " as " << wire(got.wire_dtype) << ", but rank "
        << my_rank << " expects " << wire(expected.wire_dtype) << " payloads: "
        << (got.wire_dtype == int8 || expected.wire_dtype == int8
                ? "call the 8-bit allreduce (lightning_mccl.int8) on every rank or on none"
                : "set MCCL_WIRE_DTYPE to the same value on every rank");
    return out.str();
  }
  const bool same_call = expected.channel == got.channel && expected.kind == got.kind && expected.seq == got.seq &&
                         expected.dtype == got.dtype && expected.count == got.count &&
                         (!has_reduce(got.kind) || expected.reduce_op == got.reduce_op) &&
                         (!has_root(got.kind) || expected.root == got.root);
  if (!same_call) {
    out << "rank " << got.src_rank << " called " << describe(got) << ", but rank " << my_rank << " called "
        << describe(expected);
    if (expected.count != got.count && expected.kind == got.kind) out << " (element counts differ)";
    return out.str();
  }
  if (expected.offset != got.offset || expected.length != got.length || expected.step != got.step) {
    out << "rank " << got.src_rank << " sent bytes [" << got.offset << ", " << got.offset + got.length << ") at step "
        << got.step << " of " << describe(got) << ", but rank " << my_rank << " expected [" << expected.offset << ", "
        << expected.offset + expected.length << ") at step " << expected.step
        << " (the ranks split the data differently: different sizes or MCCL_* settings per rank?)";
    return out.str();
  }
  return "";
}

}  // namespace mccl
