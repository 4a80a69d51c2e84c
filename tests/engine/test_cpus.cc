// The CPUs a process may use (cpus.h): cgroup quota texts, the combination rule, the cgroup hierarchy walked in
// a made-up file system, and the affinity mask of this process. CMakeLists.txt runs this binary a second time
// under `taskset -c 0` with MCCL_TEST_AFFINITY=1.
#include <cstdlib>
#include <map>
#include <string>
#include <thread>

#include "check.h"
#include "cpus.h"

using namespace mccl;

namespace {

// A reader over made-up files; "" for the others, as for a file that cannot be read.
struct Files {
  std::map<std::string, std::string> files;
  std::string operator()(const std::string& path) const {
    auto it = files.find(path);
    return it == files.end() ? std::string() : it->second;
  }
};

const char* kV2Mounts =
    "22 1 0:21 / /sys rw,nosuid - sysfs sysfs rw\n"
    "30 22 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate\n";
const char* kV1Mounts =
    "25 22 0:22 / /sys/fs/cgroup rw - tmpfs tmpfs rw,mode=755\n"
    "31 25 0:27 / /sys/fs/cgroup/cpu,cpuacct rw,relatime shared:9 - cgroup cgroup rw,cpu,cpuacct\n"
    "32 25 0:28 / /sys/fs/cgroup/cpuset rw,relatime shared:10 - cgroup cgroup rw,cpuset\n";

}  // namespace

TEST(cpu_max_text) {
  CHECK(parse_cpu_max("max 100000\n") == 0);
  CHECK(parse_cpu_max("200000 100000\n") == 2.0);
  CHECK(parse_cpu_max("150000 100000") == 1.5);
  CHECK(parse_cpu_max("50000 100000") == 0.5);
  for (const char* bad : {"", "\n", "100000", "abc 100000", "-1 100000", "100000 0", "1 2 3", "1.5 2"})
    CHECK_MSG(parse_cpu_max(bad) == 0, "'%s'", bad);
}

TEST(cfs_quota_text) {
  CHECK(parse_cfs_quota("-1\n", "100000\n") == 0);
  CHECK(parse_cfs_quota("400000\n", "100000\n") == 4.0);
  CHECK(parse_cfs_quota("25000", "100000") == 0.25);
  CHECK(parse_cfs_quota("", "") == 0 && parse_cfs_quota("100000", "0") == 0 && parse_cfs_quota("x", "1") == 0);
}

TEST(affinity_capped_by_the_quota_rounded_up) {
  CHECK(combine_cpus(16, 0) == 16);   // no quota
  CHECK(combine_cpus(16, 4) == 4);    // docker --cpus=4
  CHECK(combine_cpus(16, 1.5) == 2);  // part of a CPU counts as one
  CHECK(combine_cpus(16, 0.25) == 1);
  CHECK(combine_cpus(2, 8) == 2);     // a quota above the mask
  CHECK(combine_cpus(0, 0) == 1);     // never 0
}

TEST(cgroup_v2_the_tightest_quota_up_to_the_root) {
  Files fs;
  fs.files["/sys/fs/cgroup/job/rank0/cpu.max"] = "max 100000\n";
  fs.files["/sys/fs/cgroup/job/cpu.max"] = "300000 100000\n";
  fs.files["/sys/fs/cgroup/cpu.max"] = "800000 100000\n";  // not there on a real root; read all the same
  CHECK(cgroup_cpu_quota("0::/job/rank0\n", kV2Mounts, fs) == 3.0);
  fs.files["/sys/fs/cgroup/job/rank0/cpu.max"] = "150000 100000\n";
  CHECK(cgroup_cpu_quota("0::/job/rank0\n", kV2Mounts, fs) == 1.5);
  // A cgroup namespace (containers): the process sees its cgroup as "/", the mount's root.
  Files ns;
  ns.files["/sys/fs/cgroup/cpu.max"] = "200000 100000\n";
  CHECK(cgroup_cpu_quota("0::/\n", kV2Mounts, ns) == 2.0);
  // No quota anywhere, or no cgroup2 mount: none.
  CHECK(cgroup_cpu_quota("0::/job/rank0\n", kV2Mounts, Files{}) == 0);
  CHECK(cgroup_cpu_quota("0::/job/rank0\n", kV1Mounts, fs) == 0);
}

TEST(cgroup_v1_cpu_controller) {
  Files fs;
  fs.files["/sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.cfs_quota_us"] = "250000\n";
  fs.files["/sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.cfs_period_us"] = "100000\n";
  fs.files["/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us"] = "-1\n";
  fs.files["/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us"] = "100000\n";
  const std::string cgroup = "12:cpuset:/docker/abc\n4:cpu,cpuacct:/docker/abc\n1:name=systemd:/docker/abc\n0::/\n";
  CHECK(cgroup_cpu_quota(cgroup, kV1Mounts, fs) == 2.5);
  // The mount's root is the container's own cgroup (no cgroup namespace, the host's path in /proc/self/cgroup).
  const std::string mounted_at_root =
      "31 25 0:27 /docker/abc /sys/fs/cgroup/cpu,cpuacct ro - cgroup cgroup rw,cpu,cpuacct\n";
  Files inside;
  inside.files["/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us"] = "50000\n";
  inside.files["/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us"] = "100000\n";
  CHECK(cgroup_cpu_quota(cgroup, mounted_at_root, inside) == 0.5);
  // A cpuacct-only or cpuset mount is not the cpu controller.
  CHECK(cgroup_cpu_quota("3:cpuset:/docker/abc\n", kV1Mounts, fs) == 0);
}

TEST(this_process_affinity) {
  const CpuCount c = process_cpus();
  const unsigned hardware = std::thread::hardware_concurrency();
  CHECK_MSG(c.affinity >= 1 && (hardware == 0 || c.affinity <= hardware), "affinity %u of %u", c.affinity, hardware);
  CHECK(c.cpus == combine_cpus(c.affinity, c.quota));
  if (const char* expected = std::getenv("MCCL_TEST_AFFINITY")) {  // under taskset -c 0
    CHECK_MSG(c.affinity == static_cast<unsigned>(std::atoi(expected)) && c.cpus == c.affinity, "%s",
              c.describe().c_str());
  }
  std::fprintf(stderr, "  this process may use %s\n", c.describe().c_str());
}

MCCL_TEST_MAIN
