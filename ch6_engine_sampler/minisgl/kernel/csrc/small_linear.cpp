// fp32 矩阵乘 y = x · wᵀ + b：线性层。
// decode（1~8 行）是在"读权重"：每个权重元素只做 2·行数 次运算。所以每个线程顺着读自己那几行权重，
// 一次读进寄存器就给所有输入行用——batch 4 和 batch 1 读的权重一样多。
// prefill（更多行）是在"算"：一块权重留在 L2、一组输入留在 L1，小块里每读一个数做好几次乘加（gemm）。
#include <vector>

#include "cpu_kernel.h"

namespace minisgl {
namespace {

// --8<-- [start:tile]
// 读一个向量，要它留在寄存器里。不这样的话 gcc 会把读并进乘加（带内存操作数的 vfmadd）：小块里每个权重向量
// 要给 T 行输入用，就从 L1 读 T 遍，每个输入向量读 R 遍。AVX2 的 3×4 块 12 次乘加要读 16 次，每周期只能读两次，
// 卡在读上；留在寄存器里只读 3 + 4 次。空的 asm 不生成指令，只对编译器说"这个值在寄存器里，别再从内存取"
inline vec load_reg(const float* p) {
  vec v = load(p);
#if defined(__x86_64__)
  asm("" : "+v"(v));
#elif defined(__aarch64__)
  asm("" : "+w"(v));
#endif
  return v;
}

// 软件预取提前多少个数：固定 2 KB。提前一整行的话，提前多少随 k 变（k = 576 时 2.3 KB，k = 3072 时 12 KB）；
// 1 KB、2 KB、4 KB、8 KB 几种轮流测，2 KB 在最快的一档（怎么测的见附录）
constexpr int64_t kAhead = 512;
constexpr int kLine = 64 / sizeof(float);  // 一条缓存行 16 个 float：每行发一条预取

// --8<-- [start:row]
// decode 的主力：一行权重（k 个）× T 行输入（从 x 开始，每行 k 个），结果写进 y 的 T 行（相隔 ldy）。
// 一次走 U 个向量：T × U 个累加器各自独立，乘加不用等上一次的结果。
// 一个线程的行一行接一行调它：整段权重是一条从头到尾的顺序读，硬件预取最认得的读法；
// 再让软件预取把 kAhead 个数之后的那条缓存行先取进 L1（最后的 3 是 prefetcht0），读到时它已经到了
template <int T>
void row_dot(const float* x, const float* w, int64_t k, float* y, int64_t ldy, const float* b) {
  constexpr int U = kRowUnroll<T>;
  vec acc[T][U] = {};
  int64_t i = 0;
  for (; i + U * kWidth <= k; i += U * kWidth) {
    for (int p = 0; p < U * kWidth; p += kLine) __builtin_prefetch(w + i + p + kAhead, 0, 3);
    vec wv[U];
    for (int u = 0; u < U; ++u) wv[u] = load_reg(w + i + u * kWidth);
    for (int t = 0; t < T; ++t) {
      for (int u = 0; u < U; ++u) acc[t][u] += load_reg(x + t * k + i + u * kWidth) * wv[u];
    }
  }
  for (; i + kWidth <= k; i += kWidth) {  // 不够 U 个向量的一截
    const vec wv = load(w + i);
    for (int t = 0; t < T; ++t) acc[t][0] += load(x + t * k + i) * wv;
  }
  for (int t = 0; t < T; ++t) {
    vec a = acc[t][0];
    for (int u = 1; u < U; ++u) a += acc[t][u];
    float s = hsum(a);
    for (int64_t j = i; j < k; ++j) s += x[t * k + j] * w[j];  // k 不是向量宽度的倍数时的尾巴
    y[t * ldy] = b ? s + *b : s;
  }
}

// 一个线程的第 r0 到 r1 行，一行接一行
void rows_stream(const float* x, int64_t n, const float* w, int64_t k, int64_t m, float* y, const float* b,
                 int64_t r0, int64_t r1) {
  for (int64_t r = r0; r < r1; ++r) {
    const float *wr = w + r * k, *br = b ? b + r : nullptr;
    switch (n) {  // n 不超过 kRowT（见 small_linear）
      case 1: row_dot<1>(x, wr, k, y + r, m, br); break;
      case 2: row_dot<2>(x, wr, k, y + r, m, br); break;
      case 3: row_dot<3>(x, wr, k, y + r, m, br); break;
      case 4: row_dot<4>(x, wr, k, y + r, m, br); break;
    }
  }
}
// --8<-- [end:row]

// 寄存器小块：R 行权重（第 r 行从 w + r·ldw 开始，每行 k 个）× T 行输入（从 x 开始），每读一个权重向量给 T 行用、
// 每读一个输入向量给 R 行用。结果写进 y 的 T 行，第 r 行权重的结果在第 r·ldr 列（bias 也按 ldr 取）。
// prefill 的小块里 R 行权重挨着（ldw = k，ldr = 1）；decode 输入放不进 L1 时 R 行各在一段里（见 rows_range）
template <int R, int T, bool Prefetch>
void tile(const float* x, const float* w, int64_t k, int64_t ldw, float* y, int64_t ldy, int64_t ldr, const float* b) {
  vec acc[T][R] = {};
  int64_t i = 0;
  for (; i + kWidth <= k; i += kWidth) {
    vec wv[R];
    for (int r = 0; r < R; ++r) {
      wv[r] = load_reg(w + r * ldw + i);
      // decode（Prefetch）：这条顺序读 kAhead 个数之后的权重先取进 L2（2 是 prefetcht1：L1 留给输入）。
      // 预取不是读：越过张量末尾也不出错、不取回数据
      if constexpr (Prefetch) __builtin_prefetch(w + r * ldw + i + kAhead, 0, 2);
    }
    for (int t = 0; t < T; ++t) {
      const vec xv = load_reg(x + t * k + i);
      for (int r = 0; r < R; ++r) acc[t][r] += xv * wv[r];
    }
  }
  for (int t = 0; t < T; ++t) {
    for (int r = 0; r < R; ++r) {
      float s = hsum(acc[t][r]);
      for (int64_t j = i; j < k; ++j) s += x[t * k + j] * w[r * ldw + j];  // k 不是向量宽度的倍数时的尾巴
      y[t * ldy + r * ldr] = b ? s + b[r * ldr] : s;
    }
  }
}

// R 行权重 × 全部 n 行输入，输入 G 行一组：同一块权重依次给每组用，第二组起它已经在 L1 里，从内存只读一次
template <int R, int G, bool Prefetch>
void rows_tile(const float* x, int64_t n, const float* w, int64_t k, int64_t ldw, float* y, int64_t ldy, int64_t ldr,
               const float* b) {
  for (int64_t t0 = 0; t0 < n; t0 += G) {
    const float* xt = x + t0 * k;
    float* yt = y + t0 * ldy;
    switch (std::min<int64_t>(G, n - t0)) {
      case 1: tile<R, 1, Prefetch>(xt, w, k, ldw, yt, ldy, ldr, b); break;
      case 2: if constexpr (G >= 2) tile<R, 2, Prefetch>(xt, w, k, ldw, yt, ldy, ldr, b); break;
      case 3: if constexpr (G >= 3) tile<R, 3, Prefetch>(xt, w, k, ldw, yt, ldy, ldr, b); break;
      case 4: if constexpr (G >= 4) tile<R, 4, Prefetch>(xt, w, k, ldw, yt, ldy, ldr, b); break;
    }
  }
}

// 一个线程的一段权重：第 r0 到 r1 行。切成 R 段，每个小块取每段里的下一行：内存里是 R 条长长的顺序读。
// 小块取 R 行挨着的权重时，每条顺序读只有一行长（k = 576 时 2.3 KB），硬件预取刚认出它就读完了。
// 每读一遍输入给 R 行权重用：输入大到放不进 L1 时，从 L2 重读它的次数少到 1/R
template <int R, int G, bool Prefetch>
void rows_range(const float* x, int64_t n, const float* w, int64_t k, int64_t m, float* y, const float* b,
                int64_t r0, int64_t r1) {
  const int64_t q = (r1 - r0) / R;  // 每段 q 行；除不尽的最后几行一行一块
  for (int64_t j = 0; j < q; ++j) {
    rows_tile<R, G, Prefetch>(x, n, w + (r0 + j) * k, k, q * k, y + r0 + j, m, q, b ? b + r0 + j : nullptr);
  }
  for (int64_t r = r0 + R * q; r < r1; ++r) rows_tile<1, G, false>(x, n, w + r * k, k, k, y + r, m, 1, b ? b + r : nullptr);
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
      case 4: if constexpr (kGemmR >= 4) tile<4, T, false>(x, w + r0 * k, k, k, y + r0, ldy, 1, br); break;
      case 3: tile<3, T, false>(x, w + r0 * k, k, k, y + r0, ldy, 1, br); break;
      case 2: tile<2, T, false>(x, w + r0 * k, k, k, y + r0, ldy, 1, br); break;
      case 1: tile<1, T, false>(x, w + r0 * k, k, k, y + r0, ldy, 1, br); break;
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
              ": CPU fp32 only, got x ", x.device(), " ", x.scalar_type(), " and w ", w.device(), " ", w.scalar_type());
  TORCH_CHECK(!b.has_value() || (b->is_cpu() && b->scalar_type() == at::kFloat && b->numel() == w.size(0)), op,
              ": bias must be CPU fp32 of ", w.size(0));
  return {x.contiguous(), w.contiguous(), b.has_value() ? b->contiguous() : torch::Tensor(),
          torch::empty({x.size(0), w.size(0)}, x.options()), x.size(0), x.size(1), w.size(0)};
}

}  // namespace

// --8<-- [start:variants]
// 1~8 行输入有几种读法（variant），哪种快因 CPU 而异：Zen 5 上 row 快，Zen 4 上 tile 快（附录"按实测选"）。
// 不写规则，载入扩展时在本机把几种轮流量一遍（kernel/plan.py），给每个行数挑最快的一种写进 plan；small_linear 每次只查表
// - tile：寄存器小块，R 段同时读、读一遍输入给 R 行权重用（不超过 kTileT 行 kTileR × kTileT，更多行 kGemmR × kGemmT；
//   2 行起预取后面的权重）；
// - row：一行一行顺着读（row_dot），一个线程的权重是一条顺序读；只管不超过 kRowT 行，输入超过 kStreamInput 时同 tile
int plan[kMaxRows + 1] = {};  // plan[n]：n 行输入用哪种读法；载入时 set_plan 写一次，之前都是 tile
// --8<-- [end:variants]

torch::Tensor small_linear(const torch::Tensor& x_in, const torch::Tensor& w_in, const c10::optional<torch::Tensor>& b_in,
                           int64_t variant) {
  TORCH_CHECK(x_in.dim() != 2 || x_in.size(0) <= kMaxRows, "small_linear: at most ", kMaxRows, " rows, got ",
              x_in.size(0));
  RECORD_FUNCTION("minisgl::small_linear", std::vector<c10::IValue>());  // 在 torch.profiler 里看得见；没开 profiler 时几乎不花时间
  Operands o = operands(x_in, w_in, b_in, "small_linear");
  const int64_t n = o.n, k = o.k, m = o.m;
  TORCH_CHECK(variant >= -1 && variant < kVariants && (variant < 0 || n <= kVariantRows[variant]),
              "small_linear: variant ", variant, " does not take ", n, " rows");
  const int v = variant < 0 ? plan[n] : int(variant);  // -1：查表（线性层都这样调）；别的：tools/bench 量某一种
  const float *xp = o.xp(), *wp = o.wp(), *bp = o.bp();
  float* yp = o.yp();
  // --8<-- [start:parallel]
  // 按读法和这次的形状定一次怎么切：row 每块 1 行权重；tile 不超过 kTileT 行时每块 kTileR 行、更多行每块 kGemmR 行
  const bool stream = v == kRow && n <= kRowT && n * k * int64_t(sizeof(float)) <= kStreamInput;
  const bool wide = !stream && n > kTileT, prefetch = v == kRow || n > 1;
  const int64_t rows = stream ? 1 : wide ? kGemmR : kTileR, blocks = (m + rows - 1) / rows;
  // 每个线程至少分到约 64 KB 权重：更小的矩阵开线程不划算
  const int64_t grain = k > 0 ? std::max<int64_t>(1, (16384 + rows * k - 1) / (rows * k)) : blocks;
  parallel_for(0, blocks, grain, [&](int64_t lo, int64_t hi) {
    const int64_t r0 = lo * rows, r1 = std::min(m, hi * rows);
    if (stream) rows_stream(xp, n, wp, k, m, yp, bp, r0, r1);
    else if (wide) rows_range<kGemmR, kGemmT, true>(xp, n, wp, k, m, yp, bp, r0, r1);
    else if (prefetch) rows_range<kTileR, kTileT, true>(xp, n, wp, k, m, yp, bp, r0, r1);
    else rows_range<kTileR, kTileT, false>(xp, n, wp, k, m, yp, bp, r0, r1);  // tile 的 1 行：R 条顺序读，硬件预取跟得上
  });
  // --8<-- [end:parallel]
  return o.y;
}

void set_plan(const std::vector<int64_t>& table) {
  TORCH_CHECK(int64_t(table.size()) == kMaxRows, "set_plan: need one variant for each of 1..", kMaxRows,
              " rows, got ", table.size());
  for (int n = 1; n <= kMaxRows; ++n) {
    const int64_t v = table[n - 1];
    TORCH_CHECK(v >= 0 && v < kVariants && n <= kVariantRows[v], "set_plan: variant ", v, " does not take ", n,
                " rows");
  }
  for (int n = 1; n <= kMaxRows; ++n) plan[n] = int(table[n - 1]);
}

std::vector<int64_t> get_plan() { return std::vector<int64_t>(plan + 1, plan + kMaxRows + 1); }

torch::Tensor gemm(const torch::Tensor& x_in, const torch::Tensor& w_in, const c10::optional<torch::Tensor>& b_in) {
  RECORD_FUNCTION("minisgl::gemm", std::vector<c10::IValue>());
  Operands o = operands(x_in, w_in, b_in, "gemm");
  const int64_t n = o.n, k = o.k, m = o.m;
  const float *xp = o.xp(), *wp = o.wp(), *bp = o.bp();
  float* yp = o.yp();
  const int64_t blocks = (m + kGemmM - 1) / kGemmM;
  parallel_for(0, blocks, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t blk = lo; blk < hi; ++blk) {
      const int64_t r0 = blk * kGemmM;
      gemm_block(xp, n, wp + r0 * k, std::min<int64_t>(kGemmM, m - r0), k, yp + r0, m, bp ? bp + r0 : nullptr);
    }
  });
  return o.y;
}

// --8<-- [start:linear]
// 线性层调这个，和 F.linear 一样用：二维输入，1~kMaxRows 行（decode）走 small_linear，更多行（prefill）走 gemm；
// 别的形状（比如三维）交给 at::linear
torch::Tensor linear(const torch::Tensor& x, const torch::Tensor& w, const c10::optional<torch::Tensor>& b) {
  if (x.dim() != 2) return at::linear(x, w, b);
  return x.size(0) <= kMaxRows ? small_linear(x, w, b, -1) : gemm(x, w, b);
}
// --8<-- [end:linear]

}  // namespace minisgl
