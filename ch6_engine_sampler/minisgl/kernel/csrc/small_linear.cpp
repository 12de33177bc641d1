// fp32 矩阵乘 y = x · wᵀ + b：线性层。两种行数，同一个寄存器小块（tile），换一种循环顺序。
// decode（1~8 行）是在"读权重"：每个权重元素只做 2·行数 次运算。所以每个线程顺着读自己那几行权重，
// 一次读进寄存器就给所有输入行用——batch 4 和 batch 1 读的权重一样多。
// prefill（更多行）是在"算"：一块权重留在 L2、一组输入留在 L1，小块里每读一个数做好几次乘加（gemm）。
#include <ATen/Parallel.h>

#include <numeric>
#include <vector>

#include "cpu_kernel.h"

namespace minisgl {
namespace {

// --8<-- [start:tile]
// R 行权重（从 w 开始，每行 k 个）× T 行输入（从 x 开始）：结果写进 y 的 T 行、R 列
template <int R, int T, bool Stream = true>
void tile(const float* x, const float* w, int64_t k, float* y, int64_t ldy, const float* b) {
  vec acc[T][R] = {};
  int64_t i = 0;
  for (; i + kWidth <= k; i += kWidth) {
    vec wv[R];
    for (int r = 0; r < R; ++r) {
      wv[r] = load(w + r * k + i);
      // decode：下一块权重的同一列先从内存取来：输入多于 T 行、同一块要再算一遍时，内存也不闲着。
      // 最后的 0 是"不再用"（prefetchnta）：权重每步只读一次，别让它把缓存里接下来那些小算子要的代码和数据挤出去。
      // prefill 的权重块要留在 L2 里反复用，不能这样预取（Stream = false）
      if constexpr (Stream) __builtin_prefetch(w + (r + R) * k + i, 0, 0);
    }
    for (int t = 0; t < T; ++t) {
      const vec xv = load(x + t * k + i);
      for (int r = 0; r < R; ++r) acc[t][r] += xv * wv[r];
    }
  }
  for (int t = 0; t < T; ++t) {
    for (int r = 0; r < R; ++r) {
      float s = hsum(acc[t][r]);
      for (int64_t j = i; j < k; ++j) s += x[t * k + j] * w[r * k + j];  // k 不是向量宽度的倍数时的尾巴
      y[t * ldy + r] = b ? s + b[r] : s;
    }
  }
}

template <int R>
void rows_tile(const float* x, int64_t n, const float* w, int64_t k, float* y, int64_t ldy, const float* b) {
  // 同一块权重依次给每组输入行用：第二组起它已经在 L1 / L2 里，从内存只读一次
  for (int64_t t0 = 0; t0 < n; t0 += kTileT) {
    const float* xt = x + t0 * k;
    float* yt = y + t0 * ldy;
    switch (std::min<int64_t>(kTileT, n - t0)) {
      case 1: tile<R, 1>(xt, w, k, yt, ldy, b); break;
      case 2: if constexpr (kTileT >= 2) tile<R, 2>(xt, w, k, yt, ldy, b); break;
      case 3: if constexpr (kTileT >= 3) tile<R, 3>(xt, w, k, yt, ldy, b); break;
      case 4: if constexpr (kTileT >= 4) tile<R, 4>(xt, w, k, yt, ldy, b); break;
    }
  }
}

// --8<-- [end:tile]

// --8<-- [start:gemm]
// prefill：一个线程的一块权重（最多 kGemmM 行，k = 1024 时约 100 KB，留在 L2）× 全部输入。输入 kGemmT 行一组（留在 L1），
// 依次和块里每 kGemmR 行权重算一个小块：小块里每读一个向量做 kGemmR·kGemmT / (kGemmR + kGemmT) 次乘加
template <int T>
void gemm_rows(const float* x, const float* w, int64_t rows, int64_t k, float* y, int64_t ldy, const float* b) {
  for (int64_t r0 = 0; r0 < rows; r0 += kGemmR) {
    const float* br = b ? b + r0 : nullptr;
    switch (std::min<int64_t>(kGemmR, rows - r0)) {
      case 4: if constexpr (kGemmR >= 4) tile<4, T, false>(x, w + r0 * k, k, y + r0, ldy, br); break;
      case 3: tile<3, T, false>(x, w + r0 * k, k, y + r0, ldy, br); break;
      case 2: tile<2, T, false>(x, w + r0 * k, k, y + r0, ldy, br); break;
      case 1: tile<1, T, false>(x, w + r0 * k, k, y + r0, ldy, br); break;
    }
  }
}

void gemm_block(const float* x, int64_t n, const float* w, int64_t rows, int64_t k, float* y, int64_t ldy,
                const float* b) {
  for (int64_t t0 = 0; t0 < n; t0 += kGemmT) {
    const float* xt = x + t0 * k;
    float* yt = y + t0 * ldy;
    switch (std::min<int64_t>(kGemmT, n - t0)) {
      case 4: gemm_rows<4>(xt, w, rows, k, yt, ldy, b); break;
      case 3: gemm_rows<3>(xt, w, rows, k, yt, ldy, b); break;
      case 2: gemm_rows<2>(xt, w, rows, k, yt, ldy, b); break;
      case 1: gemm_rows<1>(xt, w, rows, k, yt, ldy, b); break;
    }
  }
}
// --8<-- [end:gemm]

// 两个入口共用的：检查形状、设备、dtype（bias 是 (m,) 的 CPU fp32），取连续的输入，分配输出 y (n, m)
struct Operands {
  torch::Tensor x, w, b, y;
  int64_t n, k, m;
  const float* xp() const { return x.data_ptr<float>(); }
  const float* wp() const { return w.data_ptr<float>(); }
  const float* bp() const { return b.defined() ? b.data_ptr<float>() : nullptr; }
  float* yp() { return y.data_ptr<float>(); }
};

Operands operands(const torch::Tensor& x, const torch::Tensor& w, const c10::optional<torch::Tensor>& b,
                  const char* op) {
  TORCH_CHECK(x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(1), op, ": shapes ", x.sizes(), " and ", w.sizes(),
              " do not match");
  TORCH_CHECK(x.is_cpu() && w.is_cpu() && x.scalar_type() == at::kFloat && w.scalar_type() == at::kFloat, op,
              ": CPU fp32 only, got ", x.scalar_type(), " and ", w.scalar_type());
  TORCH_CHECK(!b.has_value() || (b->is_cpu() && b->scalar_type() == at::kFloat && b->numel() == w.size(0)), op,
              ": bias must be CPU fp32 of ", w.size(0));
  return {x.contiguous(), w.contiguous(), b.has_value() ? b->contiguous() : torch::Tensor(),
          torch::empty({x.size(0), w.size(0)}, x.options()), x.size(0), x.size(1), w.size(0)};
}

}  // namespace

torch::Tensor small_linear(const torch::Tensor& x_in, const torch::Tensor& w_in, const c10::optional<torch::Tensor>& b_in) {
  TORCH_CHECK(x_in.dim() != 2 || x_in.size(0) <= kMaxRows, "small_linear: at most ", kMaxRows, " rows, got ",
              x_in.size(0));
  RECORD_FUNCTION("minisgl::small_linear", std::vector<c10::IValue>());  // 在 torch.profiler 里看得见；没开 profiler 时几乎不花时间
  Operands o = operands(x_in, w_in, b_in, "small_linear");
  const int64_t n = o.n, k = o.k, m = o.m;
  const float *xp = o.xp(), *wp = o.wp(), *bp = o.bp();
  float* yp = o.yp();
  // --8<-- [start:parallel]
  const int64_t tiles = (m + kTileR - 1) / kTileR;
  // 每个线程至少分到约 64 KB 权重：更小的矩阵开线程不划算
  const int64_t grain = k > 0 ? std::max<int64_t>(1, (16384 + kTileR * k - 1) / (kTileR * k)) : tiles;
  at::parallel_for(0, tiles, grain, [&](int64_t lo, int64_t hi) {
    for (int64_t tt = lo; tt < hi; ++tt) {
      const int64_t r0 = tt * kTileR;
      const float* wr = wp + r0 * k;
      float* yr = yp + r0;
      const float* br = bp ? bp + r0 : nullptr;
      switch (std::min<int64_t>(kTileR, m - r0)) {
        case 4: rows_tile<4>(xp, n, wr, k, yr, m, br); break;
        case 3: rows_tile<3>(xp, n, wr, k, yr, m, br); break;
        case 2: rows_tile<2>(xp, n, wr, k, yr, m, br); break;
        case 1: rows_tile<1>(xp, n, wr, k, yr, m, br); break;
      }
    }
  });
  // --8<-- [end:parallel]
  return o.y;
}

torch::Tensor gemm(const torch::Tensor& x_in, const torch::Tensor& w_in, const c10::optional<torch::Tensor>& b_in) {
  RECORD_FUNCTION("minisgl::gemm", std::vector<c10::IValue>());
  Operands o = operands(x_in, w_in, b_in, "gemm");
  const int64_t n = o.n, k = o.k, m = o.m;
  const float *xp = o.xp(), *wp = o.wp(), *bp = o.bp();
  float* yp = o.yp();
  const int64_t blocks = (m + kGemmM - 1) / kGemmM;
  at::parallel_for(0, blocks, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t blk = lo; blk < hi; ++blk) {
      const int64_t r0 = blk * kGemmM;
      gemm_block(xp, n, wp + r0 * k, std::min<int64_t>(kGemmM, m - r0), k, yp + r0, m, bp ? bp + r0 : nullptr);
    }
  });
  return o.y;
}

// 只读不算：把 x 顺着读一遍、加起来（免得编译器把读省掉），线程和 small_linear 一样分。tools/bench 拿它和
// sum() 一起量内存读带宽、取快的那个当 decode 的下限：矩阵乘快不过把权重读一遍
double stream_read(const torch::Tensor& x) {
  TORCH_CHECK(x.is_cpu() && x.scalar_type() == at::kFloat && x.is_contiguous(), "stream_read: contiguous CPU fp32 only");
  constexpr int64_t kChunk = 1 << 16;  // 每块 256 KB
  const float* p = x.data_ptr<float>();
  const int64_t n = x.numel(), chunks = (n + kChunk - 1) / kChunk;
  std::vector<float> sums(chunks);
  at::parallel_for(0, chunks, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t c = lo; c < hi; ++c) {
      const int64_t i0 = c * kChunk, i1 = std::min(n, i0 + kChunk);
      vec acc[4] = {};
      int64_t i = i0;
      for (; i + 4 * kWidth <= i1; i += 4 * kWidth) {
        for (int u = 0; u < 4; ++u) acc[u] += load(p + i + u * kWidth);  // 四个累加器：读不用等上一次加完
      }
      float s = hsum(acc[0] + acc[1] + acc[2] + acc[3]);
      for (; i < i1; ++i) s += p[i];
      sums[c] = s;
    }
  });
  return std::accumulate(sums.begin(), sums.end(), 0.0);
}

// --8<-- [start:linear]
// 线性层调这个，和 F.linear 一样用：二维输入，1~kMaxRows 行（decode）走 small_linear，更多行（prefill）走 gemm；
// 别的形状（比如三维）交给 at::linear
torch::Tensor linear(const torch::Tensor& x, const torch::Tensor& w, const c10::optional<torch::Tensor>& b) {
  if (x.dim() != 2) return at::linear(x, w, b);
  return x.size(0) <= kMaxRows ? small_linear(x, w, b) : gemm(x, w, b);
}
// --8<-- [end:linear]

}  // namespace minisgl
