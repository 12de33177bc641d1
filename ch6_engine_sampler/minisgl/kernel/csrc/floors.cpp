// decode 一步的两个下限，各一个微基准（tools/bench 用）：
// - 读：权重从内存读一遍要多久（stream_read）；
// - 算：这么多乘加最快要多久（fma_peak），用核自己的向量宽度、核自己的线程。
// 一步快不过两者里大的那个；核把读和算叠起来时，一步接近大的那个，而不是两者之和
#include <chrono>
#include <mutex>

#include "cpu_kernel.h"

namespace minisgl {

// --8<-- [start:stream_read]
// 只读不算：把 x 顺着读一遍、加起来（免得编译器把读省掉）。每个线程一段，切成 4 段同时顺着读。
// tools/bench 拿它和 sum() 一起量内存读带宽、取快的那个：矩阵乘快不过把权重读一遍
double stream_read(const torch::Tensor& x) {
  TORCH_CHECK(x.is_cpu() && x.scalar_type() == at::kFloat && x.is_contiguous(), "stream_read: contiguous CPU fp32 only");
  constexpr int64_t kGrain = 1 << 16;  // 每个线程至少 256 KB
  const float* p = x.data_ptr<float>();
  const int64_t n = x.numel();
  double total = 0.0;
  std::mutex m;  // 每段加一次：不靠线程号分格子（那是 OpenMP 才有的）
  parallel_for(0, n, kGrain, [&](int64_t lo, int64_t hi) {
    const int64_t q = (hi - lo) / (4 * kWidth) * kWidth;  // 每段 q 个，向量宽度的倍数；剩下的一个一个加
    vec acc[4] = {};
    for (int64_t i = 0; i < q; i += kWidth) {
      for (int s = 0; s < 4; ++s) acc[s] += load(p + lo + s * q + i);
    }
    float t = hsum(acc[0] + acc[1] + acc[2] + acc[3]);
    for (int64_t i = lo + 4 * q; i < hi; ++i) t += p[i];
    std::lock_guard<std::mutex> l(m);
    total += t;
  });
  return total;
}
// --8<-- [end:stream_read]

// --8<-- [start:fma_peak]
// 只算不读：每个线程 kAcc 个累加器各做 iters 次向量乘加（acc = acc·a + c），全在寄存器里。kAcc 个互相独立，
// 乘加单元不用等上一次的结果：2 个单元 × 4~5 个周期的延迟，8~10 个就够，这里 12 或 16 个，和 a、c 一起装得进寄存器。
// 返回每秒多少次 float 乘加（所有线程加起来）；线程分法和 small_linear 一样，用的是同一批线程
double fma_peak(int64_t iters) {
  TORCH_CHECK(iters > 0, "fma_peak: iters must be positive, got ", iters);
  constexpr int kAcc = kVecRegs >= 32 ? 16 : 12;  // 32 个向量寄存器时 16 个，16 个时 12 个
  const int threads = static_cast<int>(num_threads());
  std::mutex m;
  double sink = 0.0;
  const auto t0 = std::chrono::steady_clock::now();
  parallel_for(0, threads, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t part = lo; part < hi; ++part) {
      vec acc[kAcc], a = vec{} + 0.5f, c = vec{} + 0.25f;  // 不动点 0.5：数一直是正常的浮点数，不会变成 inf 或非规格数
      for (int j = 0; j < kAcc; ++j) acc[j] = vec{} + float(j);
      for (int64_t i = 0; i < iters; ++i) {
        for (int j = 0; j < kAcc; ++j) acc[j] = acc[j] * a + c;
      }
      vec s = acc[0];
      for (int j = 1; j < kAcc; ++j) s += acc[j];
      std::lock_guard<std::mutex> l(m);
      sink += hsum(s);  // 用到结果：编译器不能把循环删掉
    }
  });
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  TORCH_CHECK(sink > 0.0, "fma_peak: lost the result");
  return double(threads) * iters * kAcc * kWidth / seconds;
}
// --8<-- [end:fma_peak]

}  // namespace minisgl
