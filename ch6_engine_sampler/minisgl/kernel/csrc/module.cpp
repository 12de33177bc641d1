// 把 small_linear.cpp、decode_ops.cpp 和 floors.cpp 的算子绑成一个 Python 扩展（minisgl/kernel/utils.py 的 load_jit 编它）。
#include "cpu_kernel.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  using namespace minisgl;
  using pybind11::arg;
  m.def("linear", &linear, arg("x"), arg("w"), arg("b") = py::none());  // 线性层绑定的是它
  m.def("small_linear", &small_linear, arg("x"), arg("w"), arg("b") = py::none(), arg("variant") = -1);
  m.def("set_plan", &set_plan, arg("table"));  // kernel/plan.py 按实测选好后写一次：1~8 行各用哪种读法
  m.def("get_plan", &get_plan);
  m.def("gemm", &gemm, arg("x"), arg("w"), arg("b") = py::none());
  m.def("stream_read", &stream_read, arg("x"));  // tools/bench 量两个下限用：读带宽、乘加的峰值
  m.def("fma_peak", &fma_peak, arg("iters"));
  m.def("rms_norm", &rms_norm, arg("x"), arg("weight"), arg("eps"));
  m.def("add_rms_norm", &add_rms_norm, arg("x"), arg("residual"), arg("weight"), arg("eps"));
  m.def("apply_rope", &apply_rope, arg("positions"), arg("query"), arg("key"), arg("cos_sin_cache"), arg("head_dim"));
  m.def("store_cache", &store_cache, arg("k_cache"), arg("v_cache"), arg("indices"), arg("k"), arg("v"));
  m.def("decode_attention", &decode_attention, arg("q"), arg("k_cache"), arg("v_cache"), arg("slots"), arg("mask"),
        arg("scale"));
  m.def("silu_and_mul", &silu_and_mul, arg("x"));
  // 核的并行区真用几个线程（parallel.h）：带不带 OpenMP 编，都跟着 torch 的线程数
  m.def("num_threads", &num_threads);
  m.attr("max_rows") = kMaxRows;
  m.attr("vector_width") = kWidth;
  m.attr("tile") = py::make_tuple(kTileR, kTileT);
  m.attr("row_inputs") = kRowT;
  // 读法的名字和各自最多管几行，下标就是 set_plan 里的编号
  m.attr("variants") = std::vector<std::string>(kVariantNames, kVariantNames + kVariants);
  m.attr("variant_rows") = std::vector<int64_t>(kVariantRows, kVariantRows + kVariants);
  m.attr("unroll") = kUnroll;
  m.attr("stream_input") = kStreamInput;
  m.attr("gemm_tile") = py::make_tuple(kGemmR, kGemmT);
}
