// 小批量（1~8 行）fp32 矩阵乘 y = x · wᵀ + b：decode 的线性层。
// 行很少时矩阵乘是在"读权重"：每个权重元素只做 2·行数 次运算。所以这里每个线程顺着读自己那几行权重，
// 一次读进寄存器就给所有输入行用——batch 4 和 batch 1 读的权重一样多。
#include <ATen/Parallel.h>

#include "cpu_kernel.h"

namespace minisgl {
namespace {

// --8<-- [start:tile]
// R 行权重（从 w 开始，每行 k 个）× T 行输入（从 x 开始）：结果写进 y 的 T 行、R 列
template <int R, int T>
void tile(const float* x, const float* w, int64_t k, float* y, int64_t ldy, const float* b) {
  vec acc[T][R] = {};
  int64_t i = 0;
  for (; i + kWidth <= k; i += kWidth) {
    vec wv[R];
    for (int r = 0; r < R; ++r) {
      wv[r] = load(w + r * k + i);
      // 下一块权重的同一列先从内存取来：输入多于 T 行、同一块要再算一遍时，内存也不闲着。
      // 最后的 0 是"不再用"（prefetchnta）：权重每步只读一次，别让它把缓存里接下来那些小算子要的代码和数据挤出去
      __builtin_prefetch(w + (r + R) * k + i, 0, 0);
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

}  // namespace

torch::Tensor small_linear(const torch::Tensor& x_in, const torch::Tensor& w_in, const c10::optional<torch::Tensor>& b_in) {
  TORCH_CHECK(x_in.dim() == 2 && w_in.dim() == 2 && x_in.size(1) == w_in.size(1), "small_linear: shapes ", x_in.sizes(),
              " and ", w_in.sizes(), " do not match");
  TORCH_CHECK(x_in.size(0) <= kMaxRows, "small_linear: at most ", kMaxRows, " rows, got ", x_in.size(0));
  TORCH_CHECK(x_in.is_cpu() && w_in.is_cpu() && x_in.scalar_type() == at::kFloat && w_in.scalar_type() == at::kFloat,
              "small_linear: CPU fp32 only, got ", x_in.scalar_type(), " and ", w_in.scalar_type());
  RECORD_FUNCTION("minisgl::small_linear", std::vector<c10::IValue>());  // 在 torch.profiler 里看得见；没开 profiler 时几乎不花时间
  const auto x = x_in.contiguous();
  const auto w = w_in.contiguous();
  const int64_t n = x.size(0), k = x.size(1), m = w.size(0);
  auto y = torch::empty({n, m}, x.options());
  const float* xp = x.data_ptr<float>();
  const float* wp = w.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  torch::Tensor b;
  const float* bp = nullptr;
  if (b_in.has_value()) {
    b = b_in->contiguous();
    TORCH_CHECK(b.is_cpu() && b.scalar_type() == at::kFloat && b.numel() == m,
                "small_linear: bias must be CPU fp32 of ", m);
    bp = b.data_ptr<float>();
  }
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
  return y;
}

// --8<-- [start:linear]
// 线性层调这个，和 F.linear 一样用：1~kMaxRows 行的二维输入（decode）走上面的核，更多行（prefill）交给 at::linear（MKL）
torch::Tensor linear(const torch::Tensor& x, const torch::Tensor& w, const c10::optional<torch::Tensor>& b) {
  if (x.dim() == 2 && x.size(0) <= kMaxRows) return small_linear(x, w, b);
  return at::linear(x, w, b);
}
// --8<-- [end:linear]

}  // namespace minisgl
