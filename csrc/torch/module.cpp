// The Python extension `lightning_mccl._C`: exposes ProcessGroupMCCL to Python, and gives the c10d
// operators kernels for the MPS dispatch key.
//
// torch registers c10d kernels for CPU and CUDA only, so a collective on an MPS tensor fails in the
// dispatcher before any backend sees it. For each c10d op we register one boxed MPS kernel that
// re-dispatches the same call to the op's CPU kernel; that kernel only looks up the process group's
// backend and calls it, and ProcessGroupMCCL handles MPS tensors itself (in place or staged: staging.hpp).
// Being boxed, it does not depend on the operators' schemas, which change between torch releases.
#include <torch/csrc/utils/pybind.h>  // pybind11 with torch's casters; not torch/extension.h (the whole C++ API)
#include <torch/library.h>
#include <pybind11/chrono.h>
#include <pybind11/stl.h>

#include "clock.h"
#include "codec.h"
#include "config.h"
#include "netif.h"
#include "reduce.h"
#include "errors.hpp"
#include "host_buffers.hpp"
#include "host_memory.hpp"
#include "int8_blocks.h"
#include "int8_codec.hpp"
#include "metal_reference.hpp"
#include "mps_memory.hpp"
#include "process_group_mccl.hpp"

namespace {

void redispatch_to_cpu(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
  op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);
}

const char* const kC10dOps[] = {
    "allreduce_", "allreduce_coalesced_", "broadcast_", "reduce_", "allgather_", "_allgather_base_",
    "allgather_coalesced_", "allgather_into_tensor_coalesced_", "reduce_scatter_", "_reduce_scatter_base_",
    "reduce_scatter_tensor_coalesced_", "alltoall_", "alltoall_base_", "gather_", "scatter_", "barrier",
    "monitored_barrier_", "send", "recv_", "recv_any_source_",
};

// ProcessGroupMCCL.stats(): {"kinds": {"allreduce": {"calls", "bytes_sent", ...}, ...}, "last_issued_ns", ...}
pybind11::dict stats_dict(const lightning_mccl::ProcessGroupMCCL& pg) {
  const mccl::CommStats::Snapshot s = pg.stats();
  pybind11::dict kinds;
  for (const auto& k : s.kinds) {
    pybind11::dict row;
    row["calls"] = k.calls;
    row["bytes_sent"] = k.bytes_sent;
    row["bytes_received"] = k.bytes_received;
    row["busy_ns"] = k.busy_ns;
    row["wait_ns"] = k.wait_ns;
    kinds[pybind11::str(k.kind)] = row;
  }
  pybind11::dict out;
  out["kinds"] = kinds;
  out["last_issued_ns"] = s.last_issued_ns;
  out["last_done_ns"] = s.last_done_ns;
  return out;
}

// ProcessGroupMCCL.timeline(): [{"seq", "kind", "bytes", "wire_bytes", "issued_ns", "started_ns", "ready_ns",
// "done_ns"}, ...], oldest first; the times are the engine's steady clock (_C.clock_ns()).
pybind11::list timeline_list(const lightning_mccl::ProcessGroupMCCL& pg) {
  std::vector<mccl::TimelineEntry> entries;
  {
    // The copy takes the timeline's mutex, which the progress thread takes once per collective: never
    // wait for it holding the GIL.
    pybind11::gil_scoped_release nogil;
    entries = pg.timeline();
  }
  pybind11::list out;
  for (const mccl::TimelineEntry& e : entries) {
    pybind11::dict row;
    row["seq"] = e.seq;
    row["kind"] = mccl::collective_name(static_cast<mccl::CollectiveKind>(e.kind));
    row["bytes"] = e.bytes;
    row["wire_bytes"] = e.wire_bytes;
    row["issued_ns"] = e.issued;
    row["started_ns"] = e.started;
    row["ready_ns"] = e.ready;
    row["done_ns"] = e.done;
    out.append(row);
  }
  return out;
}

// The 8-bit format's two encoders and decoders, for tests/torch/test_int8_codec.py and benchmarks/int8_paths.py:
// the engine's (CPU tensors; its codec, with error feedback as the 8-bit allreduce uses it) or torch ops on the
// tensor's device (int8_codec.hpp). The wire form is a uint8 tensor of int8_wire_bytes(count) bytes.
at::Tensor int8_encode(const at::Tensor& values, const std::optional<at::Tensor>& residual, bool engine) {
  TORCH_CHECK(values.scalar_type() == at::kFloat && values.is_contiguous() &&
                  (!residual || (residual->scalar_type() == at::kFloat && residual->is_contiguous() &&
                                 residual->numel() == values.numel() && residual->device() == values.device())),
              "int8_encode: contiguous float32 values, and a residual like them");
  const at::Tensor kept = residual.value_or(at::Tensor());
  if (!engine) return lightning_mccl::int8_wire_view(lightning_mccl::int8_encode_blocks(values, kept), values.numel());
  TORCH_CHECK(values.device().is_cpu(), "int8_encode: the engine encodes CPU tensors");
  const size_t count = static_cast<size_t>(values.numel());
  at::Tensor wire = at::empty({static_cast<int64_t>(mccl::int8_wire_bytes(count))}, values.options().dtype(at::kByte));
  pybind11::gil_scoped_release release;
  mccl::Codec::make(mccl::WireType::kInt8Blocks, mccl::DataType::kFloat32, mccl::ReduceOp::kSum, 1, 1)
      ->encode(reinterpret_cast<char*>(wire.data_ptr()), values.data_ptr(), count,
               kept.defined() ? kept.data_ptr<float>() : nullptr);
  return wire;
}

at::Tensor int8_decode(const at::Tensor& wire, int64_t count, bool engine) {
  TORCH_CHECK(wire.scalar_type() == at::kByte && wire.is_contiguous() &&
                  wire.numel() == static_cast<int64_t>(mccl::int8_wire_bytes(static_cast<size_t>(count))),
              "int8_decode: ", mccl::int8_wire_bytes(static_cast<size_t>(count)), " contiguous uint8 for ", count,
              " values");
  at::Tensor out = at::empty({count}, wire.options().dtype(at::kFloat));
  if (!engine) {
    const int64_t rows = (count + mccl::kInt8Block - 1) / mccl::kInt8Block;
    at::Tensor blocks = at::empty({rows, 4 + static_cast<int64_t>(mccl::kInt8Block)}, wire.options());  // padding: unread
    blocks.view(-1).narrow(0, 0, wire.numel()).copy_(wire);
    lightning_mccl::int8_decode_blocks(blocks, out);
    return out;
  }
  TORCH_CHECK(wire.device().is_cpu(), "int8_decode: the engine decodes CPU tensors");
  pybind11::gil_scoped_release release;
  mccl::int8_decode(out.data_ptr<float>(), reinterpret_cast<const char*>(wire.data_ptr()), static_cast<size_t>(count), 1);
  return out;
}

// ProcessGroupMCCL.allreduce_int8_encoded: `decode`, a Python callable, runs on the completion pool, with the GIL
// taken there (and dropped with it held); its exception fails the Work.
c10::intrusive_ptr<c10d::Work> allreduce_int8_encoded(lightning_mccl::ProcessGroupMCCL& pg, at::Tensor& tensor,
                                                      const at::Tensor& blocks, const std::optional<at::Tensor>& residual,
                                                      const c10d::ReduceOp& op, pybind11::function decode) {
  std::shared_ptr<pybind11::function> held(new pybind11::function(std::move(decode)), [](pybind11::function* f) {
    if (!Py_IsInitialized()) return;  // the interpreter is gone: nothing left to release
    pybind11::gil_scoped_acquire gil;
    delete f;
  });
  std::function<void()> run = [held] {
    pybind11::gil_scoped_acquire gil;
    try {
      (*held)();
    } catch (pybind11::error_already_set& e) {
      throw std::runtime_error(std::string("allreduce_int8_encoded: decode() raised ") + e.what());
    }
  };
  pybind11::gil_scoped_release nogil;
  return pg.allreduce_int8_encoded(tensor, blocks, residual.value_or(at::Tensor()), op, std::move(run));
}

}  // namespace

TORCH_LIBRARY_IMPL(c10d, MPS, m) {
  for (const char* name : kC10dOps) {
    m.impl(name, torch::CppFunction::makeFromBoxedFunction<&redispatch_to_cpu>());
  }
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "MCCL: collectives over TCP for torch.distributed (backend name 'mccl')";
  pybind11::module_::import("torch.distributed");
  pybind11::class_<lightning_mccl::ProcessGroupMCCL, c10d::Backend,
                   c10::intrusive_ptr<lightning_mccl::ProcessGroupMCCL>>(m, "ProcessGroupMCCL")
      .def(pybind11::init<const c10::intrusive_ptr<c10d::Store>&, int, int, std::chrono::milliseconds,
                          const std::string&, const mccl::Settings&>(),
           pybind11::arg("store"), pybind11::arg("rank"), pybind11::arg("size"), pybind11::arg("timeout"),
           pybind11::arg("route_to") = "", pybind11::arg("settings") = mccl::Settings{},
           pybind11::call_guard<pybind11::gil_scoped_release>())
      .def_property_readonly("listen_address", &lightning_mccl::ProcessGroupMCCL::listenAddress)
      .def_property_readonly(
          "wire_dtype",
          [](const lightning_mccl::ProcessGroupMCCL& pg) { return mccl::wire_type_name(pg.config().wire_dtype); },
          "the MCCL_WIRE_DTYPE this group read when it was made, by its usual name (\"off\", \"bf16\", ...)")
      .def(
          "allreduce_int8",
          [](lightning_mccl::ProcessGroupMCCL& pg, at::Tensor& tensor, const std::optional<at::Tensor>& residual,
             const c10d::ReduceOp& op, bool on_device) {
            return pg.allreduce_int8(tensor, residual.value_or(at::Tensor()), op, on_device);
          },
          pybind11::arg("tensor"), pybind11::arg("residual"), pybind11::arg("op"), pybind11::arg("on_device"),
          pybind11::call_guard<pybind11::gil_scoped_release>(),
          "the 8-bit allreduce with error feedback (lightning_mccl.int8): a Work whose future holds [tensor]; "
          "on_device: the per-value work in torch ops on the tensor's device, else in the engine")
      .def("allreduce_int8_encoded", &allreduce_int8_encoded, pybind11::arg("tensor"), pybind11::arg("blocks"),
           pybind11::arg("residual"), pybind11::arg("op"), pybind11::arg("decode"),
           "the 8-bit allreduce of values encoded on their device (lightning_mccl.metal): the engine exchanges "
           "`blocks` and leaves the reduced blocks there, then decode() runs, before the Work's future (of [tensor]) "
           "completes")
      .def_property(
          "device_kernels", &lightning_mccl::ProcessGroupMCCL::device_kernels,
          &lightning_mccl::ProcessGroupMCCL::set_device_kernels,
          "where this group runs the per-value work of accelerator tensors: \"metal\", or why torch ops do "
          "(lightning_mccl.metal sets it when the group is made)")
      .def("stats", &stats_dict, "this group's traffic counters (engine stats.h), as a dict")
      .def("timeline", &timeline_list,
           "this group's latest collectives with their issue, start, ready and done times (engine timeline.h), "
           "oldest first, as a list of dicts");
  m.def(
      "wire_type",
      [](const std::string& value) {
        return lightning_mccl::translated([&] { return std::string(mccl::wire_type_name(mccl::parse_wire_type(value))); });
      },
      pybind11::arg("value"),
      "an MCCL_WIRE_DTYPE value (\"bfloat16\", \"half\", \"\", ...) as the engine reads it, by its usual name "
      "(\"bf16\", \"fp16\", \"off\"); ValueError naming the variable for a value it does not take");
  m.def(
      "variables",
      [] {
        std::vector<std::map<std::string, std::string>> rows;
        for (const mccl::Variable& v : mccl::variables())
          rows.push_back({{"name", v.name}, {"default", v.fallback}, {"doc", v.doc},
                          {"scope", v.scope == mccl::Variable::Scope::kGroup ? "group" : "process"}});
        return rows;
      },
      "every MCCL_* variable the engine and the binding read (config.cc's table): name, default (\"\": unset), "
      "scope (\"group\": read when a process group is made; \"process\": once per process) and doc");
  m.def("clock_ns", &mccl::steady_now_ns, "now in the engine's steady clock, the clock of timeline() and stats()");
  m.def("interfaces", &mccl::list_interfaces,
        "(interface name, address) pairs of this machine, from getifaddrs()");
  m.def("int8_encode", &int8_encode, pybind11::arg("values"), pybind11::arg("residual") = std::nullopt,
        pybind11::arg("engine") = false,
        "the 8-bit wire form of float32 values (uint8), by the engine (CPU) or torch ops on their device; with a "
        "residual, error feedback: values + residual are encoded and the residual left holding the error");
  m.def("int8_decode", &int8_decode, pybind11::arg("wire"), pybind11::arg("count"), pybind11::arg("engine") = false,
        "the float32 values of an 8-bit wire form, by the engine (CPU) or torch ops on its device");
  auto reference = m.def_submodule(
      "metal_reference", "the Metal kernels on CPU tensors, through their arithmetic's C++ build (arithmetic.h): "
                         "what lightning_mccl.metal's self-test compares Metal with; each takes its kernel's arguments");
  namespace ref = lightning_mccl::metal_reference;
  reference.def("int8_encode", &ref::int8_encode, pybind11::arg("values"), pybind11::arg("residual"),
                pybind11::arg("blocks"), pybind11::arg("count"), pybind11::arg("feedback"));
  reference.def("int8_decode", &ref::int8_decode, pybind11::arg("blocks"), pybind11::arg("out"), pybind11::arg("add"));
  reference.def("pseudo_gradient", &ref::pseudo_gradient, pybind11::arg("anchor"), pybind11::arg("flat"),
                pybind11::arg("own"));
  reference.def("outer_step", &ref::outer_step, pybind11::arg("mean"), pybind11::arg("momentum"),
                pybind11::arg("anchor"), pybind11::arg("own"), pybind11::arg("lr"), pybind11::arg("mu"));
  m.def("reduce_vector_path", &mccl::reduce_vector_path,
        "the vector instructions the engine's CPU reducer uses in this process (for mccl doctor)");
  m.def(
      "device_memory_path",
      [](const at::Tensor& t) {
        if (t.device().is_cpu())
          return t.is_contiguous() ? std::make_pair(true, std::string("CPU memory"))
                                   : std::make_pair(false, std::string("not contiguous"));
        const lightning_mccl::HostAccess access = lightning_mccl::host_access(t);
        return std::make_pair(access.data != nullptr, access.reason);
      },
      pybind11::arg("tensor"),
      "(in place, why): whether collectives read and write this tensor's memory in place or stage it "
      "through host buffers (host_memory.hpp)");
  m.def("device_path_counts", [] {
    const auto c = lightning_mccl::path_counts();
    return std::map<std::string, uint64_t>{{"in_place", c.in_place}, {"staged", c.staged}};
  }, "accelerator tensors this process's collectives took in place and staged");
  m.def("host_buffer_counts", [] {
    const auto c = lightning_mccl::host_buffer_counts();
    return std::map<std::string, uint64_t>{{"fresh", c.fresh}, {"reused", c.reused}, {"cached_bytes", c.cached_bytes}};
  }, "staging's reused host buffers (host_buffers.hpp): allocated, taken again, bytes kept free");
  m.def("mps_mapping_built", &lightning_mccl::mps_mapping_built,
        "whether this build asks torch's MPS allocator for CPU mappings (macOS builds)");
  m.def("mps_kernels_registered", [] {
    return c10::Dispatcher::singleton()
        .findSchemaOrThrow("c10d::allreduce_", "")
        .hasKernelForDispatchKey(c10::DispatchKey::MPS);
  });
}
