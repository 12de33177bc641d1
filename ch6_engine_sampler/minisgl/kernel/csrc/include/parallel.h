// 核的并行循环只有这一个入口：parallel_for(begin, end, grain, f)，f(lo, hi) 算 [lo, hi) 这一段，
// 和 at::parallel_for 一样切：最多 num_threads() 段，每段至少 grain 个。用几个线程跟着 torch.set_num_threads（Engine 设它）。
// 线程只有一套：torch 自己的。编译时二选一：
// - 带 -fopenmp 编（Linux 的 g++），或这份 torch 用自己的线程池（AT_PARALLEL_NATIVE）：就是 at::parallel_for；
// - 不带 -fopenmp（Apple 的 clang、MINISGL_KERNEL_OPENMP=0）而 torch 用 OpenMP（pip 的 wheel 都是）：at::parallel_for 是
//   头文件里的模板，#pragma omp 被忽略，会在调用的线程上串行跑。这时直接调 torch 已经载入的 OpenMP 运行库：
//   GOMP_parallel 就是编译器把 #pragma omp parallel 编成的那个调用，libgomp（Linux）和 LLVM 的 libomp（macOS 的 wheel）
//   都有。于是两种编法用的是同一个运行库、同一批线程，不会有两套线程抢核。
// 任务抛出的异常（TORCH_CHECK）带回调用的线程重新抛，不会结束进程。
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <exception>

#if !defined(_OPENMP) && AT_PARALLEL_OPENMP
#define MINISGL_OMP_ABI 1
#include <dlfcn.h>
#endif

namespace minisgl {

#ifndef MINISGL_OMP_ABI

inline int64_t num_threads() { return at::get_num_threads(); }

template <class F>
void parallel_for(int64_t begin, int64_t end, int64_t grain, const F& f) {
  at::parallel_for(begin, end, grain, f);
}

#else

namespace omp_abi {

// OpenMP 运行库的三个入口，第一次用时找一次。按调用者（这个扩展）的依赖去找：扩展链接了 libtorch_cpu，它又依赖
// torch 自带的 OpenMP 运行库，所以找到的就是 torch 用的那一份
struct Runtime {
  void (*parallel)(void (*)(void*), void*, unsigned, unsigned);  // GOMP_parallel(fn, data, 线程数 0=默认, flags)
  int (*thread_num)();
  int (*team_size)();
};

inline const Runtime& runtime() {
  static const Runtime r = [] {
    Runtime x{};
    x.parallel = reinterpret_cast<decltype(x.parallel)>(dlsym(RTLD_DEFAULT, "GOMP_parallel"));
    x.thread_num = reinterpret_cast<decltype(x.thread_num)>(dlsym(RTLD_DEFAULT, "omp_get_thread_num"));
    x.team_size = reinterpret_cast<decltype(x.team_size)>(dlsym(RTLD_DEFAULT, "omp_get_num_threads"));
    if (!x.thread_num || !x.team_size) x.parallel = nullptr;
    return x;
  }();
  return r;
}

}  // namespace omp_abi

// 找不到运行库时串行跑，num_threads() 也如实说 1
inline int64_t num_threads() { return omp_abi::runtime().parallel ? at::get_num_threads() : 1; }

template <class F>
void parallel_for(int64_t begin, int64_t end, int64_t grain, const F& f) {
  if (begin >= end) return;
  const int64_t n = end - begin;
  if (n <= grain || n == 1 || num_threads() == 1 || at::in_parallel_region()) {  // 和 at::parallel_for 一样的串行条件
    f(begin, end);
    return;
  }
  struct Ctx {
    const F& f;
    int64_t begin, end, grain;
    std::atomic_flag failed = ATOMIC_FLAG_INIT;
    std::exception_ptr error;
  } ctx{f, begin, end, grain};
  // 和 ATen/ParallelOpenMP.h 的 invoke_parallel 一样：线程数用默认（torch.set_num_threads 设的），在区里再按 grain 少切
  omp_abi::runtime().parallel([](void* p) {
    auto& c = *static_cast<Ctx*>(p);
    const auto& rt = omp_abi::runtime();
    int64_t tasks = rt.team_size();
    if (c.grain > 0) tasks = std::min<int64_t>(tasks, at::divup(c.end - c.begin, c.grain));
    const int64_t chunk = at::divup(c.end - c.begin, tasks);
    const int64_t lo = c.begin + rt.thread_num() * chunk;
    if (lo >= c.end) return;
    try {  // 异常不能穿过 C 的调用：记下第一个，回到调用的线程再抛
      c.f(lo, std::min(c.end, lo + chunk));
    } catch (...) {
      if (!c.failed.test_and_set()) c.error = std::current_exception();
    }
  }, &ctx, 0, 0);
  if (ctx.error) std::rethrow_exception(ctx.error);
}

#endif

}  // namespace minisgl
