// csrc 下几个 .cpp 共用的：向量类型和读写它的函数、矩阵乘的分块常量、各算子的声明（module.cpp 绑定它们）。
// 向量化用编译器的向量扩展（gcc / clang），-march=native 决定宽度：同一份源码在 AVX2、AVX-512 和 ARM 上都能编。
#pragma once

#include <torch/extension.h>

#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "parallel.h"  // 每个算子的并行循环都用它的 parallel_for

namespace minisgl {

#if defined(__AVX512F__)
constexpr int kWidth = 16;  // 一个向量 16 个 float
constexpr int kVecRegs = 32;
constexpr int kTileT = 4;   // 4 行权重 × 4 行输入 = 16 个累加器，再加 4 个权重、1 个输入，不溢出
constexpr int kGemmR = 4;   // prefill 的块：和 decode 一样 4 × 4
#elif defined(__AVX__)
constexpr int kWidth = 8;
constexpr int kVecRegs = 16;  // AVX2 只有 16 个向量寄存器：4 × 2 = 8 个累加器 + 4 + 1
constexpr int kTileT = 2;
constexpr int kGemmR = 3;   // prefill 的块：3 行权重 × 4 行输入 = 12 个累加器 + 3 + 1，正好 16 个
#else
constexpr int kWidth = 4;   // SSE / ARM NEON：128 位
#if defined(__aarch64__)
constexpr int kVecRegs = 32;  // NEON 有 32 个寄存器
constexpr int kTileT = 4;
constexpr int kGemmR = 4;
#else
constexpr int kVecRegs = 16;
constexpr int kTileT = 2;
constexpr int kGemmR = 3;
#endif
#endif
constexpr int kTileR = 4;     // 输入放不进 L1 时：一块读 4 行权重
constexpr int kRowT = 4;      // decode 一行一行读时最多 4 行输入，各种宽度都是（寄存器少时每次少走几个向量）
constexpr int kUnroll = 4;    // 一行一行读时一次最多走 4 个向量
constexpr int kRowAcc = kVecRegs / 2;  // 一行一行读的累加器上限：寄存器的一半，留下的装权重和输入
// T 行输入一次走几个向量：T × U 个累加器不超过 kRowAcc。32 个寄存器（AVX-512、NEON）都是 4；
// 16 个（AVX2、SSE）时 3、4 行是 2（8 + 2 + 1 个寄存器）
template <int T>
constexpr int kRowUnroll = kRowAcc / T < kUnroll ? kRowAcc / T : kUnroll;
constexpr int64_t kStreamInput = 16 * 1024;  // decode 的输入不超过 16 KB（32 KB 的 L1 的一半）才一行一行读
constexpr int kMaxRows = 8;   // 小批量矩阵乘最多管几行；更多行（prefill）是算力的活，走 gemm
constexpr int kGemmT = 4;     // prefill 一块的输入行数
constexpr int kGemmM = 24;    // prefill 时一个线程一次拿 24 行权重（kGemmR 的倍数），它们留在 L2 里给所有输入行用

typedef float vec __attribute__((vector_size(kWidth * sizeof(float))));

inline vec load(const float* p) {
  vec v;
  std::memcpy(&v, p, sizeof(v));  // 不要求对齐：编译成一条非对齐读
  return v;
}

inline void store(float* p, vec v) { std::memcpy(p, &v, sizeof(v)); }

inline float hsum(vec v) {
  float s = 0.f;
  for (int i = 0; i < kWidth; ++i) s += v[i];
  return s;
}

using torch::Tensor;

// small_linear.cpp
enum Variant : int { kTile = 0, kRow = 1, kVariants = 2 };  // 1~8 行的几种读法（small_linear.cpp 里 variants 那段）
constexpr const char* kVariantNames[kVariants] = {"tile", "row"};
constexpr int64_t kVariantRows[kVariants] = {kMaxRows, kRowT};  // 各读法最多管几行
Tensor small_linear(const Tensor& x, const Tensor& w, const c10::optional<Tensor>& b, int64_t variant);
void set_plan(const std::vector<int64_t>& table);
std::vector<int64_t> get_plan();
Tensor gemm(const Tensor& x, const Tensor& w, const c10::optional<Tensor>& b);
Tensor linear(const Tensor& x, const Tensor& w, const c10::optional<Tensor>& b);

// floors.cpp
double stream_read(const Tensor& x);
double fma_peak(int64_t iters);

// decode_ops.cpp
Tensor rms_norm(const Tensor& x, const Tensor& w, double eps);
std::tuple<Tensor, Tensor> add_rms_norm(const Tensor& x, const Tensor& residual, const Tensor& w, double eps);
std::tuple<Tensor, Tensor> apply_rope(const Tensor& positions, const Tensor& query, const Tensor& key,
                                      const Tensor& cos_sin, int64_t head_dim);
void store_cache(Tensor& k_cache, Tensor& v_cache, const Tensor& indices, const Tensor& k, const Tensor& v);
Tensor decode_attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const Tensor& slots,
                        const Tensor& mask, double scale);
Tensor silu_and_mul(const Tensor& x);

}  // namespace minisgl
