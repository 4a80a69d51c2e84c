// The CPUs this process may run on, which sizes its engine threads (the sender thread, the reduction pool) and
// how many of them may spin (spin.h): not the machine's core count (std::thread::hardware_concurrency()), but
// the CPUs in its affinity mask (sched_getaffinity: taskset, cpusets, a container's --cpuset-cpus), capped by
// its cgroup's CPU quota (cgroup v2 cpu.max, v1 cpu.cfs_quota_us / cpu.cfs_period_us: a container's --cpus),
// rounded up. macOS has neither: there it is the performance cores (hw.perflevel0.logicalcpu; efficiency
// cores run a thread at a fraction of their speed, and the reduction pool's parts are equal), else
// hardware_concurrency(). benchmarks/record/performance.md#many-ranks-and-spinning.
#pragma once

#include <functional>
#include <string>

namespace mccl {

struct CpuCount {
  unsigned cpus = 1;      // what the engine plans with: combine_cpus(affinity, quota)
  unsigned affinity = 1;  // CPUs in the affinity mask (macOS: performance cores)
  double quota = 0;       // the cgroup's CPU quota in CPUs; 0: none
  std::string describe() const;  // "2 CPUs (affinity mask 2, cgroup quota none)"
};
// Read now (a few small files on Linux): a mask or quota changed later counts from the next call.
CpuCount process_cpus();

// The parts, apart for tests.
// cgroup v2's cpu.max ("max 100000", "150000 100000"): the quota in CPUs; 0 for none or unreadable text.
double parse_cpu_max(const std::string& text);
// cgroup v1's cpu.cfs_quota_us and cpu.cfs_period_us ("-1": none): the quota in CPUs; 0 for none.
double parse_cfs_quota(const std::string& quota_us, const std::string& period_us);
// The rule: the affinity count, capped by the quota rounded up (1.5 CPUs: 2); at least 1.
unsigned combine_cpus(unsigned affinity, double quota);
// The tightest quota (in CPUs; 0: none) of the cgroups from this process's own up to its hierarchy's root,
// cgroup v2 and v1 alike, given the text of /proc/self/cgroup and /proc/self/mountinfo and a reader of
// files that returns "" for a file that cannot be read.
double cgroup_cpu_quota(const std::string& proc_self_cgroup, const std::string& mountinfo,
                        const std::function<std::string(const std::string& path)>& read);

}  // namespace mccl
