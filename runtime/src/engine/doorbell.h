// The engine's doorbell: an eventfd that a submission rings to wake the engine thread from its
// sleep in poll().
//
// Doorbells come from a process-wide pool and are never closed. A stopped engine may still be
// rung by a call on another thread (the C API never destroys a runtime; see c_api.cc), and a
// closed descriptor's number could by then belong to another file. A stopped engine puts its
// doorbell back for the next one, so a program that joins again and again holds as many
// doorbells as it ever ran engines at once, not one per ringrun_init. A late ring on a reused
// doorbell wakes the engine that holds it now, which finds nothing queued and sleeps again. A
// child made by fork() inherits the pool but not its engines: sharing a parent's eventfd, one
// process's drain could swallow the other's ring, so the child closes its copies and makes its
// own. Thread-safe.
#pragma once

#include <unistd.h>

#include <cstdint>

namespace ringrun::runtime::engine {

// A doorbell with no ring pending, or -errno when no eventfd could be made (the process's
// descriptor limit).
int TakeDoorbell();
// Puts fd back in the pool (fd < 0: nothing). It stays open: late rings are harmless.
void ReturnDoorbell(int fd);

// Wakes whoever polls fd.
inline void RingDoorbell(int fd) {
  const uint64_t one = 1;
  (void)!::write(fd, &one, sizeof(one));
}
// Takes the rings pending on fd (non-blocking).
inline void DrainDoorbell(int fd) {
  uint64_t rings;
  (void)!::read(fd, &rings, sizeof(rings));
}

}  // namespace ringrun::runtime::engine
