// 核的并行循环只有这一个入口：parallel_for(begin, end, grain, f)，f(lo, hi) 算 [lo, hi) 这一段，
// 和 at::parallel_for 一样切：最多 num_threads() 段，每段至少 grain 个。用几个线程跟着 torch.set_num_threads（Engine 设它）。
// 带 -fopenmp 编时就是 at::parallel_for（torch 的 OpenMP 线程池）。不带时 at::parallel_for 是头文件里的模板，
// 在调用它的线程上串行跑（Apple 的 clang、MINISGL_KERNEL_OPENMP=0），所以这里有一个自己的小线程池。
// 为什么不借 torch 现成的：at::intraop_launch 在 OpenMP 版的 libtorch（pip 的 wheel）里就在调用的线程上跑；
// at::launch（inter-op 池，c10::ThreadPool）每个任务是一个 std::function，靠互斥锁和条件变量叫醒线程。一步 decode
// 有约 200 个很小的并行区：在 2 核的 Xeon（torch 2.13）上量两段各几微秒的空转并行区，OpenMP 和这个池每个多花约 1 µs，
// at::launch 多花 10 µs 以上（机器忙时上百 µs），一步就是几毫秒。
// 任务抛出的异常（TORCH_CHECK）两种都带回调用的线程重新抛，不会结束进程。
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <exception>

#ifndef _OPENMP
#include <pthread.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>
#endif

namespace minisgl {

inline int64_t num_threads() { return at::get_num_threads(); }  // 两种编法都跟着 torch 的线程数

#ifdef _OPENMP

template <class F>
void parallel_for(int64_t begin, int64_t end, int64_t grain, const F& f) {
  at::parallel_for(begin, end, grain, f);
}

#else

namespace pool {

// 干完活的线程先空转这么久等下一个并行区（两个并行区之间是 Python 里几微秒到几十微秒的活），再睡到被叫醒：
// 睡着的线程被叫醒要几十微秒，一步 decode 200 次就是几毫秒；一直空转又会占着核，别的进程用不上
constexpr auto kSpin = std::chrono::microseconds(1000);

inline void relax() {
#if defined(__x86_64__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// 一个进程一个池：调用的线程跑第 0 段，第 i 个工作线程跑第 i 段。
class Pool {
 public:
  // 跑 fn(ctx, 0 .. tasks-1)，都跑完才返回；哪一段抛了异常，在这里重新抛（第一个）
  void run(int tasks, void (*fn)(void*, int), void* ctx) {
    std::unique_lock<std::mutex> busy(run_m_, std::defer_lock);
    if (in_region() || !busy.try_lock()) {  // 嵌套的并行区、或别的线程正在用池子：就在这个线程上跑
      for (int i = 0; i < tasks; ++i) fn(ctx, i);
      return;
    }
    while (static_cast<int>(workers_.size()) < tasks - 1) {
      const int index = static_cast<int>(workers_.size()) + 1;
      const uint64_t seen = job_.load(std::memory_order_relaxed);  // 新线程从下面这个并行区接活，不是从它起来时看到的那个
      workers_.emplace_back([this, index, seen] { work(index, seen); });
    }
    in_region() = true;
    fn_ = fn;
    ctx_ = ctx;
    error_ = nullptr;
    pending_.store(tasks - 1, std::memory_order_relaxed);
    {
      std::lock_guard<std::mutex> l(m_);  // 在锁里改：睡下之前在锁里看过一眼的线程不会错过
      publish(tasks);
    }
    cv_.notify_all();
    call(0);
    for (int spins = 0; pending_.load(std::memory_order_acquire) > 0; ++spins) {
      if (spins < 4096) relax();
      else std::this_thread::yield();  // 工作线程被换下去了（核被别的进程占着）：让出来
    }
    in_region() = false;
    if (error_) std::rethrow_exception(error_);
  }

  // fork 之前（pthread_atfork）：等正在跑的并行区跑完，叫所有工作线程退出并 join。子进程里没有这些线程，
  // 留着它们的话池子就会等一个不存在的线程；父进程下一个并行区再建
  void before_fork() {
    run_m_.lock();
    {
      std::lock_guard<std::mutex> l(m_);
      stop_ = true;
      publish(0);
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
    workers_.clear();
    stop_ = false;
  }
  void after_fork() { run_m_.unlock(); }

 private:
  // 这个线程是不是正在一个并行区里（工作线程一直是）
  static bool& in_region() {
    thread_local bool flag = false;
    return flag;
  }

  // 下一个并行区：序号加一，段数换成 tasks
  void publish(int tasks) {
    job_.store(((job_.load(std::memory_order_relaxed) >> 16) + 1) << 16 | static_cast<uint64_t>(tasks),
               std::memory_order_release);
  }

  void call(int i) {
    try {
      fn_(ctx_, i);
    } catch (...) {
      std::lock_guard<std::mutex> l(m_);
      if (!error_) error_ = std::current_exception();
    }
  }

  // job_ 的高位是第几个并行区，低 16 位是这一个有几段：一次读到，不会拿上一个的段数配这一个的序号
  void work(int index, uint64_t seen) {
    in_region() = true;
    for (;;) {
      uint64_t job = job_.load(std::memory_order_acquire);
      const auto t0 = std::chrono::steady_clock::now();
      for (int spins = 0; job == seen; ++spins) {
        relax();
        if ((spins & 255) == 255 && std::chrono::steady_clock::now() - t0 > kSpin) {
          std::unique_lock<std::mutex> l(m_);
          cv_.wait(l, [&] { return (job = job_.load(std::memory_order_acquire)) != seen; });
        }
        job = job_.load(std::memory_order_acquire);
      }
      seen = job;
      if (stop_) return;
      if (index < static_cast<int>(job & 0xffff)) {
        call(index);
        pending_.fetch_sub(1, std::memory_order_release);
      }
    }
  }

  std::mutex run_m_;  // 同一时间只有一个并行区
  std::mutex m_;      // 睡觉、叫醒、记异常
  std::condition_variable cv_;
  std::vector<std::thread> workers_;
  std::atomic<uint64_t> job_{0};
  std::atomic<int> pending_{0};
  void (*fn_)(void*, int) = nullptr;
  void* ctx_ = nullptr;
  std::exception_ptr error_;
  bool stop_ = false;
};

inline Pool& instance() {
  // 不析构：进程退出时工作线程还在等活，析构一个没 join 的 std::thread 会 std::terminate
  static Pool* p = [] {
    auto* q = new Pool();
    pthread_atfork([] { instance().before_fork(); }, [] { instance().after_fork(); },
                   [] { instance().after_fork(); });
    return q;
  }();
  return *p;
}

}  // namespace pool

template <class F>
void parallel_for(int64_t begin, int64_t end, int64_t grain, const F& f) {
  if (begin >= end) return;
  const int64_t n = end - begin;
  const int64_t tasks = std::min<int64_t>({num_threads(), at::divup(n, std::max<int64_t>(grain, 1)), 0xffff});
  if (tasks <= 1) {
    f(begin, end);
    return;
  }
  struct Ctx {
    const F& f;
    int64_t begin, end, chunk;
  } ctx{f, begin, end, at::divup(n, tasks)};
  pool::instance().run(static_cast<int>(tasks), [](void* p, int i) {
    const auto& c = *static_cast<Ctx*>(p);
    const int64_t lo = c.begin + i * c.chunk;
    if (lo < c.end) c.f(lo, std::min(c.end, lo + c.chunk));
  }, &ctx);
}

#endif

}  // namespace minisgl
