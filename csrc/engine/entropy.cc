#include "entropy.h"

#include <fcntl.h>
#include <unistd.h>
#if defined(__APPLE__) || defined(__linux__)
#include <sys/random.h>
#endif

#include <cerrno>
#include <cstring>

#include "error.h"

namespace mccl {
namespace {

bool from_getentropy(unsigned char* out, size_t size) {
#if defined(__APPLE__) || defined(__linux__)
  while (size > 0) {
    size_t take = size < 256 ? size : 256;  // getentropy() serves at most 256 bytes per call
    if (::getentropy(out, take) != 0) return false;
    out += take;
    size -= take;
  }
  return true;
#else
  (void)out;
  (void)size;
  return false;
#endif
}

void from_urandom(unsigned char* out, size_t size) {
  int fd = ::open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(Error::Kind::kInternal, "cannot open /dev/urandom for random bytes: ", std::strerror(errno));
  while (size > 0) {
    ssize_t n = ::read(fd, out, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      int err = errno;
      ::close(fd);
      fail(Error::Kind::kInternal, "cannot read /dev/urandom: ", n == 0 ? "end of file" : std::strerror(err));
    }
    out += n;
    size -= static_cast<size_t>(n);
  }
  ::close(fd);
}

}  // namespace

void random_bytes(void* out, size_t size) {
  auto* p = static_cast<unsigned char*>(out);
  if (!from_getentropy(p, size)) from_urandom(p, size);
}

}  // namespace mccl
