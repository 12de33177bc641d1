// decode 一步里矩阵乘之外的几个小算子，每个一次调用：RMSNorm（可带残差相加）、RoPE、写 KV、decode 注意力、SiLU 门控。
// 它们的计算量都很小，一步 decode 的时间花在"调用次数"上：PyTorch 里一个 RMSNorm 是五六个 ATen 算子，
// 每个都要分配输出、调度一次、把刚被权重挤出缓存的数据再读一遍。这里每个算子读一遍输入、写一遍输出。
// 算式和各层里前几章的 PyTorch 写法一样，只差浮点累加顺序（和 SiLU 里自己算的 exp，误差不到 1 ulp）；
// tests/ch6/test_kernel_ops.py 逐个核对。
#include <ATen/Dispatch.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "cpu_kernel.h"

namespace minisgl {
namespace {

// e^x，一次 kWidth 个（Cephes 的 expf）：x = n·ln2 + r，|r| ≤ ln2/2，e^r 用 6 项多项式，2^n 直接拼进指数位。
// 在 [-87, 88] 里误差不到 1 ulp，和 std::exp 一样准；更小的 x 给 1.2e-38（当 0 用），更大的给 inf，NaN 还是 NaN
inline vec exp_vec(vec x) {
  typedef int32_t ivec __attribute__((vector_size(kWidth * sizeof(int32_t))));
  const vec lo = vec{} - 87.33654f, hi = vec{} + 88.37626f, round = vec{} + 12582912.f;  // 1.5·2^23：加再减就是取整
  vec c = x < lo ? lo : x;
  c = c > hi ? hi : c;  // 夹住之后 2^n 不会溢出指数位
  const vec n = (c * 1.44269504f + round) - round;
  const vec r = (c - n * 0.693359375f) - n * -2.12194440e-4f;  // ln2 拆成两段，减的时候不丢精度
  vec p = vec{} + 1.9875691500e-4f;
  for (const float k : {1.3981999507e-3f, 8.3334519073e-3f, 4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f}) {
    p = p * r + k;
  }
  const ivec bits = (__builtin_convertvector(n, ivec) + 127) << 23;
  vec scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return x > hi ? vec{} + INFINITY : (p * r * r + r + 1.f) * scale;
}

inline float dot(const float* a, const float* b, int64_t n) {
  vec acc = {};
  int64_t i = 0;
  for (; i + kWidth <= n; i += kWidth) acc += load(a + i) * load(b + i);
  float s = hsum(acc);
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

// 和 HF 同一个顺序：先 x·rsqrt(mean(x²) + eps)，再乘 weight
inline void norm_row(const float* x, const float* w, float* y, int64_t d, float eps) {
  const float r = 1.f / std::sqrt(dot(x, x, d) / static_cast<float>(d) + eps);
  for (int64_t i = 0; i < d; ++i) y[i] = w[i] * (x[i] * r);
}

void check_f32(const torch::Tensor& t, const char* op, const char* name) {
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == at::kFloat, op, ": ", name, " must be a CPU fp32 tensor, got ",
              t.scalar_type(), " on ", t.device());
}

// int32 和 int64 的下标都直接读（positions、out_loc 是 int32，page table 取出来的是 int64），不先转一份
std::vector<int64_t> indices_of(const torch::Tensor& t, const char* op, const char* name) {
  TORCH_CHECK(t.device().is_cpu() && (t.scalar_type() == at::kInt || t.scalar_type() == at::kLong), op, ": ", name,
              " must be CPU int32 or int64, got ", t.scalar_type());
  const auto c = t.contiguous();
  if (c.scalar_type() == at::kLong) return {c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel()};
  return {c.data_ptr<int32_t>(), c.data_ptr<int32_t>() + c.numel()};
}

void check_index(int64_t i, int64_t size, const char* op, const char* name) {
  TORCH_CHECK(i >= 0 && i < size, op, ": ", name, " ", i, " is out of range [0, ", size, ")");
}

}  // namespace

// x: (..., d) -> 同形状
torch::Tensor rms_norm(const torch::Tensor& x_in, const torch::Tensor& w, double eps) {
  RECORD_FUNCTION("minisgl::rms_norm", std::vector<c10::IValue>());
  check_f32(x_in, "rms_norm", "x");
  check_f32(w, "rms_norm", "weight");
  const int64_t d = w.numel();
  TORCH_CHECK(x_in.dim() >= 1 && x_in.size(-1) == d, "rms_norm: x ", x_in.sizes(), " does not end in ", d);
  // Qwen3 的 q/k norm 拿到的是从 qkv 切出来的 (N, H, D)：头内连续、行间有间隔，按步长直接读，不先拷一份
  const bool heads = x_in.dim() == 3 && x_in.stride(2) == 1 && x_in.stride(1) == d;
  const auto x = heads ? x_in : x_in.contiguous();
  auto y = torch::empty(x.sizes(), x.options());
  const float* xp = x.data_ptr<float>();
  const auto wc = w.contiguous();  // 留一个名字：临时张量的内存在这一行结束时就释放了
  const float* wp = wc.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  const int64_t per_row = heads ? x.size(1) : 1, row_stride = heads ? x.stride(0) : per_row * d;
  for (int64_t r = 0, n = d ? x.numel() / d : 0; r < n; ++r) {
    norm_row(xp + r / per_row * row_stride + r % per_row * d, wp, yp + r * d, d, eps);
  }
  return y;
}

// 返回 (rms_norm(x + residual), x + residual)；不改输入
std::tuple<torch::Tensor, torch::Tensor> add_rms_norm(const torch::Tensor& x_in, const torch::Tensor& res_in,
                                                      const torch::Tensor& w, double eps) {
  RECORD_FUNCTION("minisgl::add_rms_norm", std::vector<c10::IValue>());
  check_f32(x_in, "add_rms_norm", "x");
  check_f32(res_in, "add_rms_norm", "residual");
  check_f32(w, "add_rms_norm", "weight");
  const int64_t d = w.numel();
  TORCH_CHECK(x_in.sizes() == res_in.sizes() && x_in.dim() >= 1 && x_in.size(-1) == d, "add_rms_norm: x ",
              x_in.sizes(), " and residual ", res_in.sizes(), " must match and end in ", d);
  const auto x = x_in.contiguous(), res = res_in.contiguous(), wc = w.contiguous();
  auto y = torch::empty_like(x), sum = torch::empty_like(x);
  const float *xp = x.data_ptr<float>(), *rp = res.data_ptr<float>(), *wp = wc.data_ptr<float>();
  float *yp = y.data_ptr<float>(), *sp = sum.data_ptr<float>();
  for (int64_t r = 0, n = d ? x.numel() / d : 0; r < n; ++r) {
    float* s = sp + r * d;
    for (int64_t i = 0; i < d; ++i) s[i] = xp[r * d + i] + rp[r * d + i];
    norm_row(s, wp, yp + r * d, d, eps);
  }
  return {y, sum};
}

// positions (N,)；query (N, H_q·D)、key (N, H_kv·D)（行内连续即可，行间可以有间隔：qkv 切出来的 view）；
// cos_sin (max_pos, 2D) fp32，每行 [cos, cos, -sin, sin] -> 旋转后的新 (query, key)。q、k 可以是别的浮点 dtype
// （和 FlashInfer 一样）：转成 float 算、写回原 dtype，同 PyTorch 写法的 x.float() … .to(x.dtype)
std::tuple<torch::Tensor, torch::Tensor> apply_rope(const torch::Tensor& pos_in, const torch::Tensor& query,
                                                    const torch::Tensor& key, const torch::Tensor& cos_sin,
                                                    int64_t head_dim) {
  RECORD_FUNCTION("minisgl::apply_rope", std::vector<c10::IValue>());
  check_f32(cos_sin, "apply_rope", "cos_sin_cache");
  const int64_t n = pos_in.numel(), d = head_dim, half = head_dim / 2;
  TORCH_CHECK(d > 0 && d % 2 == 0 && cos_sin.dim() == 2 && cos_sin.size(1) == 2 * d && cos_sin.is_contiguous(),
              "apply_rope: cos_sin_cache ", cos_sin.sizes(), " does not fit head_dim ", d);
  const std::vector<int64_t> pp = indices_of(pos_in, "apply_rope", "positions");
  for (const int64_t p : pp) check_index(p, cos_sin.size(0), "apply_rope", "position");  // query、key 共用，查一次
  const float* cs = cos_sin.data_ptr<float>();
  auto rotate = [&](const torch::Tensor& x_in) {
    TORCH_CHECK(x_in.device().is_cpu() && at::isFloatingType(x_in.scalar_type()), "apply_rope: query / key must be ",
                "CPU floating point, got ", x_in.scalar_type(), " on ", x_in.device());
    TORCH_CHECK(x_in.dim() >= 1 && x_in.size(0) == n && x_in.numel() % (n ? n * d : 1) == 0, "apply_rope: ",
                x_in.sizes(), " is not (", n, ", heads·", d, ")");
    // 每个 token 的一行连续就行（(N, H·D) 或 (N, H, D)），行间可以有间隔：按步长直接读，不先拷一份
    const bool rows = x_in.stride(-1) == 1 && (x_in.dim() == 2 || (x_in.dim() == 3 && x_in.stride(1) == d));
    const auto xc = rows ? x_in : x_in.contiguous();
    auto y = torch::empty(xc.sizes(), xc.options());
    const int64_t heads = n ? xc.numel() / (n * d) : 0;
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, xc.scalar_type(), "apply_rope", [&] {
      for (int64_t t = 0; t < n; ++t) {
        const float* c = cs + pp[t] * 2 * d;  // cos 在前 d 列，带符号的 sin 在后 d 列
        const float* s = c + d;
        for (int64_t h = 0; h < heads; ++h) {
          const scalar_t* xh = xc.data_ptr<scalar_t>() + t * xc.stride(0) + h * d;
          scalar_t* yh = y.data_ptr<scalar_t>() + (t * heads + h) * d;
          for (int64_t i = 0; i < half; ++i) {  // HF：x·cos + rotate_half(x)·sin，rotate_half(x) = [-x2, x1]
            const float x1 = static_cast<float>(xh[i]), x2 = static_cast<float>(xh[i + half]);
            yh[i] = static_cast<scalar_t>(x1 * c[i] + x2 * s[i]);
            yh[i + half] = static_cast<scalar_t>(x2 * c[i + half] + x1 * s[i + half]);
          }
        }
      }
    });
    return y;
  };
  return {rotate(query), rotate(key)};
}

// k_cache / v_cache (槽位数, ...)：把 k[i]、v[i] 拷进第 indices[i] 个槽位（官方 kernel.store_cache 的参数顺序）
void store_cache(torch::Tensor& k_cache, torch::Tensor& v_cache, const torch::Tensor& indices,
                 const torch::Tensor& k_in, const torch::Tensor& v_in) {
  RECORD_FUNCTION("minisgl::store_cache", std::vector<c10::IValue>());
  check_f32(k_cache, "store_cache", "k_cache");
  check_f32(v_cache, "store_cache", "v_cache");
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous() && k_cache.sizes() == v_cache.sizes(),
              "store_cache: k_cache and v_cache must be contiguous and of the same shape");
  const int64_t slots = k_cache.size(0), row = slots ? k_cache.numel() / slots : 0, n = indices.numel();
  const std::vector<int64_t> lp = indices_of(indices, "store_cache", "indices");
  if (n == 0) return;  // 没有要写的（reshape 也分不出 0 行每行多长）
  // 每行连续就行，行间可以有间隔（decode 时 v 是从 qkv 里切出来的一段，行间隔着 q、k）：按行的步长拷，不先拷一份
  auto rows_of = [n](const torch::Tensor& t) {
    const auto r = t.reshape({n, -1});
    return r.stride(1) == 1 ? r : r.contiguous();
  };
  const auto k = rows_of(k_in), v = rows_of(v_in);
  check_f32(k, "store_cache", "k");
  check_f32(v, "store_cache", "v");
  TORCH_CHECK(k.size(1) == row && v.size(1) == row, "store_cache: k ", k_in.sizes(), " / v ", v_in.sizes(),
              " do not fit slots of ", row, " floats");
  for (const int64_t i : lp) check_index(i, slots, "store_cache", "slot");  // 先全查一遍：出错时池子一个槽位也没动
  for (int64_t i = 0; i < n; ++i) {
    std::memcpy(k_cache.data_ptr<float>() + lp[i] * row, k.data_ptr<float>() + i * k.stride(0), row * sizeof(float));
    std::memcpy(v_cache.data_ptr<float>() + lp[i] * row, v.data_ptr<float>() + i * v.stride(0), row * sizeof(float));
  }
}

// --8<-- [start:decode_attention]
// q (bs, H_q, D)：每个请求 1 个新 token；k_cache / v_cache (槽位数, H_kv, D)；slots (bs, L) 每个请求的历史槽位；
// mask (bs, L) 或 (bs, 1, 1, L)，True = 真历史。直接按槽位读池子，不先拷成 (bs, L, H_kv, D) 的矩形
torch::Tensor decode_attention(const torch::Tensor& q_in, const torch::Tensor& k_cache, const torch::Tensor& v_cache,
                               const torch::Tensor& slots_in, const torch::Tensor& mask_in, double scale) {
  RECORD_FUNCTION("minisgl::decode_attention", std::vector<c10::IValue>());
  check_f32(q_in, "decode_attention", "q");
  check_f32(k_cache, "decode_attention", "k_cache");
  check_f32(v_cache, "decode_attention", "v_cache");
  TORCH_CHECK(q_in.dim() == 3 && k_cache.dim() == 3 && k_cache.sizes() == v_cache.sizes() &&
              k_cache.is_contiguous() && v_cache.is_contiguous() && q_in.size(2) == k_cache.size(2) &&
              k_cache.size(1) > 0 && q_in.size(1) % k_cache.size(1) == 0,
              "decode_attention: q ", q_in.sizes(), " does not fit the cache ", k_cache.sizes());
  TORCH_CHECK(mask_in.device().is_cpu(), "decode_attention: mask must be on the CPU, got ", mask_in.device());
  const auto q = q_in.contiguous();
  const int64_t bs = q.size(0), hq = q.size(1), d = q.size(2), hkv = k_cache.size(1), groups = hq / hkv;
  const auto mask = mask_in.to(at::kBool).reshape({bs, -1}).contiguous();
  const int64_t len = slots_in.dim() == 2 ? slots_in.size(1) : -1, num_slots = k_cache.size(0);
  TORCH_CHECK(slots_in.dim() == 2 && slots_in.size(0) == bs && mask.size(1) == len, "decode_attention: slots ",
              slots_in.sizes(), " and mask ", mask_in.sizes(), " do not fit ", bs, " requests");
  const std::vector<int64_t> slots = indices_of(slots_in, "decode_attention", "slots");
  auto out = torch::empty_like(q);
  const float *qp = q.data_ptr<float>(), *kp = k_cache.data_ptr<float>(), *vp = v_cache.data_ptr<float>();
  const int64_t* sp = slots.data();
  const bool* mp = mask.data_ptr<bool>();
  float* op = out.data_ptr<float>();
  // 一个任务 = 一个请求的一个 kv 头和共用它的 groups 个 q 头：每行 k、v 从内存读一次，给这几个 q 头都用上。
  // 每个线程至少分到约 16384 次 q·k 乘加（几微秒的活）：SmolLM2 的 4 个请求、30 个 token 时两个线程各算一半
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(1, groups * len * d));
  parallel_for(0, bs * hkv, grain, [&](int64_t lo, int64_t hi) {
    std::vector<float> p(groups * len), top(groups), z(groups);  // 每个线程一份，各个任务接着用
    for (int64_t task = lo; task < hi; ++task) {
      const int64_t b = task / hkv, h = task % hkv;
      const int64_t* sl = sp + b * len;
      const bool* ml = mp + b * len;
      // 每个任务查自己要读的槽位：在工作线程里抛出的错由 parallel_for 带回调用的线程
      for (int64_t l = 0; l < len; ++l) check_index(sl[l], num_slots, "decode_attention", "slot");
      const float* qh = qp + (b * hq + h * groups) * d;
      float* oh = op + (b * hq + h * groups) * d;
      std::fill(top.begin(), top.end(), -INFINITY);
      std::fill(z.begin(), z.end(), 0.f);
      std::fill(oh, oh + groups * d, 0.f);
      for (int64_t l = 0; l < len; ++l) {  // 分数 q·k·scale，同时记下每个 q 头的最大值；遮掉的位置记 -inf
        const float* kr = kp + (sl[l] * hkv + h) * d;
        for (int64_t g = 0; g < groups; ++g) {
          const float s = ml[l] ? dot(qh + g * d, kr, d) * static_cast<float>(scale) : -INFINITY;
          p[g * len + l] = s;
          top[g] = std::max(top[g], s);
        }
      }
      for (int64_t g = 0; g < groups; ++g) {  // softmax 的分子 e^(s - max)：和 silu_and_mul 一样用 exp_vec，一次 kWidth 个
        float* pg = p.data() + g * len;
        int64_t l = 0;
        for (; l + kWidth <= len; l += kWidth) store(pg + l, exp_vec(load(pg + l) - top[g]));
        for (; l < len; ++l) pg[l] = std::exp(pg[l] - top[g]);
      }
      for (int64_t l = 0; l < len; ++l) {  // 分母，和 Σ p·v（最后再除以分母）；遮掉的位置不读 v（池子里可能是没写过的数）
        if (!ml[l]) continue;
        const float* vr = vp + (sl[l] * hkv + h) * d;
        for (int64_t g = 0; g < groups; ++g) {
          const float e = p[g * len + l];
          z[g] += e;
          for (int64_t i = 0; i < d; ++i) oh[g * d + i] += e * vr[i];
        }
      }
      for (int64_t g = 0; g < groups; ++g) {
        const float inv = z[g] > 0.f ? 1.f / z[g] : 0.f;  // 整行都遮掉（不会发生）时输出 0，不出 NaN
        for (int64_t i = 0; i < d; ++i) oh[g * d + i] *= inv;
      }
    }
  });
  return out;
}
// --8<-- [end:decode_attention]

// x (N, 2I) -> (N, I)：前一半过 SiLU，乘以后一半。一遍读完 x、写完 y；exp 用上面的 exp_vec，一次算 kWidth 个
// （ATen 的 F.silu 也是向量化的 exp，但切片、silu、乘法是三次分派、一个临时张量）
torch::Tensor silu_and_mul(const torch::Tensor& x_in) {
  RECORD_FUNCTION("minisgl::silu_and_mul", std::vector<c10::IValue>());
  check_f32(x_in, "silu_and_mul", "x");
  TORCH_CHECK(x_in.dim() >= 1 && x_in.size(-1) % 2 == 0, "silu_and_mul: last dim of ", x_in.sizes(), " is not even");
  const auto x = x_in.contiguous();
  const int64_t half = x.size(-1) / 2, rows = half ? x.numel() / (2 * half) : 0;
  auto sizes = x.sizes().vec();
  sizes.back() = half;
  auto y = torch::empty(sizes, x.options());
  for (int64_t r = 0; r < rows; ++r) {
    const float* gate = x.data_ptr<float>() + r * 2 * half;
    const float* up = gate + half;
    float* out = y.data_ptr<float>() + r * half;
    int64_t i = 0;
    for (; i + kWidth <= half; i += kWidth) {
      const vec g = load(gate + i);
      store(out + i, g / (1.f + exp_vec(-g)) * load(up + i));
    }
    for (; i < half; ++i) out[i] = gate[i] / (1.f + std::exp(-gate[i])) * up[i];
  }
  return y;
}

}  // namespace minisgl
