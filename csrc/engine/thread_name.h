// Names the calling thread, so `top -H`, debuggers and profilers show what each MCCL thread is.
#pragma once

#include <pthread.h>

namespace mccl {

inline void set_thread_name(const char* name) {  // at most 15 characters on Linux
#if defined(__APPLE__)
  pthread_setname_np(name);
#elif defined(__linux__)
  pthread_setname_np(pthread_self(), name);
#else
  (void)name;
#endif
}

}  // namespace mccl
