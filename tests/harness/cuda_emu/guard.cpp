// 只给没有 CUDA 的 torch 用：登记一个"CUDA 设备守卫"，让 cuda:0 上的张量（其实是 CPU 张量的包装）能被 Python 索引、
// 能建在 cuda 上。守卫只记着"当前设备是 0"，不碰任何硬件；真有 CUDA 的 torch 永远不加载它（会顶掉真的守卫）。
#include <c10/core/impl/DeviceGuardImplInterface.h>

namespace {

struct EmulatedCudaGuard final : c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return c10::DeviceType::CUDA; }
  c10::Device exchangeDevice(c10::Device) const override { return {c10::DeviceType::CUDA, 0}; }
  c10::Device getDevice() const override { return {c10::DeviceType::CUDA, 0}; }
  void setDevice(c10::Device) const override {}
  void uncheckedSetDevice(c10::Device) const noexcept override {}
  c10::Stream getStream(c10::Device d) const noexcept override { return c10::Stream(c10::Stream::DEFAULT, d); }
  c10::Stream exchangeStream(c10::Stream s) const noexcept override { return s; }
  c10::DeviceIndex deviceCount() const noexcept override { return 1; }
};

C10_REGISTER_GUARD_IMPL(CUDA, EmulatedCudaGuard);

}  // namespace
