// The engine's own thread pool for its CPU kernels: work split in small chunks that whichever
// thread is running takes, the calling thread included, so a region never waits for a thread
// the OS has not scheduled. OpenMP's static split (at::parallel_for) gives each thread its half
// up front: beside another process, or on a VM whose host is busy, every one of a decode
// step's ~150 kernel regions waited for a descheduled partner. Here a partner that is not
// running costs the chunk it holds at most; the caller does the rest.
//
// Linux only (futex); elsewhere, and with one thread, `parallel_for` is ATen's.
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstdint>
#include <exception>
#include <mutex>
#include <new>
#include <thread>
#include <vector>

#if defined(__linux__)
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>
#define SERVEBENCH_POOL 1
#endif
#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#endif

namespace servebench_pool {

using Fn = void (*)(const void* ctx, int64_t begin, int64_t end);

inline void relax() {
#if defined(__x86_64__) || defined(_M_X64)
  _mm_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

#if defined(SERVEBENCH_POOL)
class Pool {
 public:
  static Pool& get() {
    static Pool pool;
    return pool;
  }

  Pool() { pthread_atfork(nullptr, nullptr, [] { get().forked(); }); }

  int threads() const { return threads_.load(std::memory_order_relaxed); }

  // n threads in all (the caller is one of them); 1 or less: no pool.
  void resize(int n, int64_t spin_us) {
    std::lock_guard<std::mutex> hold(busy_);
    stop();
    spin_us_ = spin_us;
    quit_.store(false);
    for (int i = 1; i < n; ++i) workers_.emplace_back([this] { work(); });
    threads_.store(std::max(1, n));
  }

  ~Pool() { stop(); }

  // In a forked child only the forking thread exists: forget the workers without joining them
  // (a join would wait forever at exit), and run on ATen's path from then on.
  void forked() {
    for (auto& t : workers_) new std::thread(std::move(t));  // leaked on purpose
    workers_.clear();
    threads_.store(1);
    sleepers_.store(0);
    new (&busy_) std::mutex();  // held by a thread that is not in this process, maybe
  }

  // fn over [begin, end) in `chunk`-sized pieces; false (nothing run) when the pool is busy
  // with another caller's job or called from inside one.
  bool run(Fn fn, const void* ctx, int64_t begin, int64_t end, int64_t chunk) {
    if (inside_ || !busy_.try_lock()) return false;
    std::lock_guard<std::mutex> hold(busy_, std::adopt_lock);
    const int64_t n = (end - begin + chunk - 1) / chunk;
    generation_ = (generation_ + 1) & 0xffffffffu;  // 32 bits of `next_`: wraps after days
    if (generation_ == 0) generation_ = 1;
    const uint64_t gen = generation_;
    fn_.store(fn, std::memory_order_relaxed);
    ctx_.store(ctx, std::memory_order_relaxed);
    begin_.store(begin, std::memory_order_relaxed);
    end_.store(end, std::memory_order_relaxed);
    chunk_.store(chunk, std::memory_order_relaxed);
    // The count carries its generation: a worker still holding the last job's `next_` (all
    // of its chunks taken) must not read this job's larger count as room for one more.
    chunks_.store(gen << 32 | static_cast<uint64_t>(n), std::memory_order_relaxed);
    done_.store(0, std::memory_order_relaxed);
    failed_ = nullptr;
    next_.store(gen << 32, std::memory_order_seq_cst);  // publish: workers may take from now
    if (sleepers_.load(std::memory_order_seq_cst) > 0) {
      wake_.fetch_add(1, std::memory_order_seq_cst);
      syscall(SYS_futex, &wake_, FUTEX_WAKE_PRIVATE, INT_MAX, nullptr, nullptr, 0);
    }
    inside_ = true;
    take(gen);
    inside_ = false;
    for (int spins = 0; done_.load(std::memory_order_acquire) < n; ++spins) {
      relax();  // a partner finishing its chunk; if it was descheduled, let it run
      if (spins >= 256) sched_yield();
    }
    if (failed_) std::rethrow_exception(failed_);  // once no chunk runs: as ATen's does
    return true;
  }

 private:
  // Claim and run chunks of generation `gen` until none is left.
  void take(uint64_t gen) {
    for (;;) {
      uint64_t v = next_.load(std::memory_order_acquire);
      if ((v >> 32) != gen) return;
      const uint64_t count = chunks_.load(std::memory_order_relaxed);
      if ((count >> 32) != gen || (v & 0xffffffffu) >= (count & 0xffffffffu)) return;
      const int64_t i = static_cast<int64_t>(v & 0xffffffffu);
      const Fn fn = fn_.load(std::memory_order_relaxed);
      const void* ctx = ctx_.load(std::memory_order_relaxed);
      const int64_t b0 = begin_.load(std::memory_order_relaxed);
      const int64_t e0 = end_.load(std::memory_order_relaxed);
      const int64_t c = chunk_.load(std::memory_order_relaxed);
      // Claimed only if nobody moved `next_` since it was read: the fields read belong to gen.
      if (!next_.compare_exchange_weak(v, v + 1, std::memory_order_acq_rel)) continue;
      try {
        fn(ctx, b0 + i * c, std::min(e0, b0 + (i + 1) * c));
      } catch (...) {  // kept for the caller; the other chunks still run and are counted
        std::lock_guard<std::mutex> hold(failing_);
        if (!failed_) failed_ = std::current_exception();
      }
      done_.fetch_add(1, std::memory_order_release);
    }
  }

  void work() {
    inside_ = true;
    uint64_t seen = next_.load(std::memory_order_acquire) >> 32;
    for (;;) {
      const auto start = std::chrono::steady_clock::now();
      uint64_t v;
      for (int spins = 0; ((v = next_.load(std::memory_order_acquire)) >> 32) == seen; ++spins) {
        if (quit_.load(std::memory_order_relaxed)) return;
        relax();
        if ((spins & 63) != 63) continue;
        sched_yield();  // whoever else wants this core gets it; alone, the core stays awake
        const auto waited = std::chrono::steady_clock::now() - start;
        if (waited > std::chrono::microseconds(spin_us_)) sleep(seen);
      }
      seen = v >> 32;
      take(seen);
    }
  }

  void sleep(uint64_t seen) {
    const uint32_t ticket = wake_.load(std::memory_order_seq_cst);
    sleepers_.fetch_add(1, std::memory_order_seq_cst);
    if ((next_.load(std::memory_order_seq_cst) >> 32) == seen && !quit_.load())
      syscall(SYS_futex, &wake_, FUTEX_WAIT_PRIVATE, ticket, nullptr, nullptr, 0);
    sleepers_.fetch_sub(1, std::memory_order_seq_cst);
  }

  void stop() {
    quit_.store(true);
    wake_.fetch_add(1, std::memory_order_seq_cst);
    syscall(SYS_futex, &wake_, FUTEX_WAKE_PRIVATE, INT_MAX, nullptr, nullptr, 0);
    for (auto& t : workers_) t.join();
    workers_.clear();
    threads_.store(1);
  }

  std::atomic<int> threads_{1};
  int64_t spin_us_ = 100;
  std::vector<std::thread> workers_;
  std::mutex busy_;
  static inline thread_local bool inside_ = false;
  uint64_t generation_ = 0;
  std::mutex failing_;
  std::exception_ptr failed_;
  alignas(64) std::atomic<uint64_t> next_{0};  // generation << 32 | next chunk to take
  alignas(64) std::atomic<int64_t> done_{0};
  alignas(64) std::atomic<uint32_t> wake_{0};
  std::atomic<int> sleepers_{0};
  std::atomic<bool> quit_{false};
  std::atomic<Fn> fn_{nullptr};
  std::atomic<const void*> ctx_{nullptr};
  std::atomic<int64_t> begin_{0}, end_{0}, chunk_{1};
  std::atomic<uint64_t> chunks_{0};  // generation << 32 | chunks
};
#endif

// at::parallel_for's contract (f(begin, end) over pieces of at least `grain`), on the pool
// where one is set up and the range is worth splitting, else ATen's.
template <typename F>
void parallel_for(int64_t begin, int64_t end, int64_t grain, const F& f) {
#if defined(SERVEBENCH_POOL)
  Pool& pool = Pool::get();
  const int threads = pool.threads();
  if (threads > 1 && end - begin > std::max<int64_t>(grain, 1)) {
    // About four chunks a thread: a late partner costs a quarter of its share at most.
    const int64_t chunk = std::max<int64_t>(
        std::max<int64_t>(grain, 1), (end - begin + 4 * threads - 1) / (4 * threads));
    const Fn call = [](const void* ctx, int64_t b, int64_t e) {
      (*static_cast<const F*>(ctx))(b, e);
    };
    if (pool.run(call, &f, begin, end, chunk)) return;
  }
#endif
  at::parallel_for(begin, end, grain, f);
}

}  // namespace servebench_pool
