// Caps this process's address space a little above what it maps now, so that the next large
// mappings (thread stacks, big buffers) fail as they would on an exhausted machine. Only for a
// forked child: the cap cannot be raised again by an unprivileged process, and sanitizer
// runtimes (which reserve terabytes) cannot run under it.
#pragma once

#include <pthread.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstddef>
#include <fstream>

namespace xserv::test {

inline void limit_address_space(std::size_t headroom) {
  std::size_t pages = 0;
  std::ifstream("/proc/self/statm") >> pages;  // first field: total program size in pages
  const std::size_t now = pages * static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  struct rlimit limit {};
  limit.rlim_cur = limit.rlim_max = now + headroom;
  ::setrlimit(RLIMIT_AS, &limit);
}

// The stack size a new thread gets (glibc: RLIMIT_STACK at start-up, or 8 MiB / 2 MiB).
inline std::size_t default_thread_stack_bytes() {
  pthread_attr_t attr;
  std::size_t bytes = 0;
  ::pthread_attr_init(&attr);
  ::pthread_attr_getstacksize(&attr, &bytes);
  ::pthread_attr_destroy(&attr);
  return bytes;
}

}  // namespace xserv::test
