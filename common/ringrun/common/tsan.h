// Happens-before edges that ThreadSanitizer cannot see because they are made inside an
// uninstrumented library: Debian's gRPC hands a callback reactor from the thread that made or
// finished it to the thread that calls its OnCancel/OnDone. The thread that hands an object on
// calls RINGRUN_HAPPENS_BEFORE(obj); the thread that receives it, RINGRUN_HAPPENS_AFTER(obj)
// before touching it. Nothing in builds without -fsanitize=thread.
#pragma once

#if defined(__SANITIZE_THREAD__)
#define RINGRUN_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define RINGRUN_TSAN 1
#endif
#endif

#if defined(RINGRUN_TSAN)
extern "C" void __tsan_acquire(void* addr);
extern "C" void __tsan_release(void* addr);
#define RINGRUN_HAPPENS_BEFORE(addr) __tsan_release(static_cast<void*>(addr))
#define RINGRUN_HAPPENS_AFTER(addr) __tsan_acquire(static_cast<void*>(addr))
#else
#define RINGRUN_HAPPENS_BEFORE(addr) static_cast<void>(addr)
#define RINGRUN_HAPPENS_AFTER(addr) static_cast<void>(addr)
#endif
