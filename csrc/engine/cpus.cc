#ifndef _GNU_SOURCE
#define _GNU_SOURCE  // sched_getaffinity, CPU_COUNT
#endif
#include "cpus.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

#if defined(__linux__)
#include <sched.h>
#elif defined(__APPLE__)
#include <sys/sysctl.h>
#endif

namespace mccl {
namespace {

// A whole positive number, the whole text (surrounding blanks aside); 0 otherwise.
long long positive(const std::string& text) {
  std::istringstream in(text);
  long long n = 0;
  std::string rest;
  if (!(in >> n) || (in >> rest) || n <= 0) return 0;
  return n;
}

std::vector<std::string> split(const std::string& text, char sep) {
  std::vector<std::string> parts;
  std::string part;
  std::istringstream in(text);
  while (std::getline(in, part, sep)) parts.push_back(part);
  return parts;
}

// A cgroup hierarchy's mount: where it is mounted, and which cgroup is its root there.
struct Mount {
  std::string root, point;
  bool found() const { return !point.empty(); }
};

// The folder of cgroup `path` (as /proc/self/cgroup names it) under the mount; the mount point itself when the
// path lies outside the mount's root (a cgroup namespace shows the process its own cgroup as the root).
std::string folder_of(const Mount& m, const std::string& path) {
  std::string rel;
  if (m.root == "/") rel = path;
  else if (path.compare(0, m.root.size(), m.root) == 0 && (path.size() == m.root.size() || path[m.root.size()] == '/'))
    rel = path.substr(m.root.size());
  while (!rel.empty() && rel.back() == '/') rel.pop_back();
  return m.point + rel;
}

// The smallest quota that `quota_at(folder)` gives from `folder` up to the mount point (0: none).
double tightest(const Mount& m, std::string folder, const std::function<double(const std::string&)>& quota_at) {
  double best = 0;
  for (;;) {
    const double q = quota_at(folder);
    if (q > 0 && (best == 0 || q < best)) best = q;
    const size_t slash = folder.rfind('/');
    if (folder.size() <= m.point.size() || slash == std::string::npos || slash < m.point.size()) return best;
    folder.resize(slash);
  }
}

unsigned affinity_cpus() {
  const unsigned hardware = std::max(1u, std::thread::hardware_concurrency());
#if defined(__linux__)
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return hardware;  // more CPUs than a cpu_set_t holds (1024): the machine's count
#elif defined(__APPLE__)
  int performance = 0;
  size_t size = sizeof(performance);
  if (sysctlbyname("hw.perflevel0.logicalcpu", &performance, &size, nullptr, 0) == 0 && performance > 0)
    return std::min(hardware, static_cast<unsigned>(performance));
  return hardware;  // Intel Macs and macOS before 12 have no performance levels
#else
  return hardware;
#endif
}

#if defined(__linux__)
std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream text;
  text << in.rdbuf();
  return in ? text.str() : std::string();
}
#endif

}  // namespace

double parse_cpu_max(const std::string& text) {
  std::istringstream in(text);
  std::string quota, period, rest;
  if (!(in >> quota >> period) || (in >> rest)) return 0;
  const long long q = positive(quota), p = positive(period);
  return q > 0 && p > 0 ? static_cast<double>(q) / static_cast<double>(p) : 0;  // "max": no quota
}

double parse_cfs_quota(const std::string& quota_us, const std::string& period_us) {
  const long long q = positive(quota_us), p = positive(period_us);  // a quota of -1: none
  return q > 0 && p > 0 ? static_cast<double>(q) / static_cast<double>(p) : 0;
}

unsigned combine_cpus(unsigned affinity, double quota) {
  unsigned cpus = std::max(1u, affinity);
  if (quota > 0) cpus = std::min(cpus, static_cast<unsigned>(std::max(1.0, std::ceil(quota - 1e-9))));
  return cpus;
}

double cgroup_cpu_quota(const std::string& proc_self_cgroup, const std::string& mountinfo,
                        const std::function<std::string(const std::string& path)>& read) {
  std::string v2_path, v1_path;
  bool in_v2 = false, in_v1 = false;
  for (const std::string& line : split(proc_self_cgroup, '\n')) {  // "ID:CONTROLLERS:PATH"
    const size_t a = line.find(':'), b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos) continue;
    const std::string id = line.substr(0, a), controllers = line.substr(a + 1, b - a - 1);
    if (id == "0" && controllers.empty()) v2_path = line.substr(b + 1), in_v2 = true;
    for (const std::string& c : split(controllers, ','))
      if (c == "cpu") v1_path = line.substr(b + 1), in_v1 = true;
  }
  Mount v2, v1;
  for (const std::string& line : split(mountinfo, '\n')) {
    // "ID PARENT MAJ:MIN ROOT MOUNT_POINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPER_OPTIONS"
    std::vector<std::string> f;
    std::istringstream in(line);
    for (std::string field; in >> field;) f.push_back(field);
    const auto dash = std::find(f.begin(), f.end(), "-");
    if (f.size() < 5 || dash == f.end() || f.end() - dash < 4) continue;
    const std::string& fstype = dash[1];
    if (fstype == "cgroup2" && !v2.found()) v2 = {f[3], f[4]};
    if (fstype == "cgroup" && !v1.found()) {
      for (const std::string& option : split(dash[3], ','))
        if (option == "cpu") v1 = {f[3], f[4]};
    }
  }
  double quota = 0;
  auto tighter = [&](double q) {
    if (q > 0 && (quota == 0 || q < quota)) quota = q;
  };
  if (in_v2 && v2.found())
    tighter(tightest(v2, folder_of(v2, v2_path),
                     [&](const std::string& d) { return parse_cpu_max(read(d + "/cpu.max")); }));
  if (in_v1 && v1.found())
    tighter(tightest(v1, folder_of(v1, v1_path), [&](const std::string& d) {
      return parse_cfs_quota(read(d + "/cpu.cfs_quota_us"), read(d + "/cpu.cfs_period_us"));
    }));
  return quota;
}

CpuCount process_cpus() {
  CpuCount c;
  c.affinity = affinity_cpus();
#if defined(__linux__)
  c.quota = cgroup_cpu_quota(read_file("/proc/self/cgroup"), read_file("/proc/self/mountinfo"), read_file);
#endif
  c.cpus = combine_cpus(c.affinity, c.quota);
  return c;
}

std::string CpuCount::describe() const {
  std::ostringstream text;
#if defined(__APPLE__)
  const char* counted = " (performance cores ";
#else
  const char* counted = " (affinity mask ";
#endif
  text << cpus << (cpus == 1 ? " CPU" : " CPUs") << counted << affinity << ", cgroup quota ";
  if (quota > 0) text << quota;
  else text << "none";
  text << ")";
  return text.str();
}

}  // namespace mccl
