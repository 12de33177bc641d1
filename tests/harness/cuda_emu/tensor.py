"""模拟的 cuda:0 上的张量：设备写着 cuda:0，里面是一个真的 CPU 张量，算子在 CPU 上照常算。

每个 aten 算子都经 run() 过一遍：先按 rules.py 查设备、给读回主存的记一笔，再拆出里面的 CPU 张量算，
结果按"这个算子在哪个设备上算"重新包好。工厂函数（device='cuda'）由 CudaMode 接住，同样走 run()。
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from .rules import ADVANCED_INDEXING, DATA_DEPENDENT, check_devices

aten = torch.ops.aten
CUDA0 = torch.device("cuda", 0)
CPU = torch.device("cpu")


@dataclass
class HostSyncs:
    """主机等设备的每一次：(种类, 算子)。种类是 item、tolist、to_host、to_device_blocking、data_dependent、synchronize
    之一。"""

    events: list[tuple[str, str]] = field(default_factory=list)

    def record(self, kind: str, what: str) -> None:
        self.events.append((kind, what))

    def __len__(self) -> int:
        return len(self.events)

    def since(self, start: int) -> list[tuple[str, str]]:
        return self.events[start:]


SYNCS = HostSyncs()


class Capture:
    """正在录的 CUDA 图（graph.py 的 CUDAGraph 替身）：run() 把每个在 cuda 上算的算子连同参数交给它。"""

    active = None  # 录图时是那张图的 ops 列表，平时 None

    @classmethod
    def add(cls, func, args, kwargs, out) -> None:
        if cls.active is not None:
            cls.active.append((func, args, kwargs, out))


CAPTURE_ERROR = "CUDA error: operation not permitted when stream is capturing"


def _sync(kind: str, what: str) -> None:
    """记一次读回主存；录 CUDA 图时这是 CUDA 的错误（rule graph-no-host-sync）。"""
    if Capture.active is not None:
        raise RuntimeError(f"{CAPTURE_ERROR}（{kind}：{what}；录 CUDA 图的区域里不能读回主存）")
    SYNCS.record(kind, what)


class EmulatedCudaTensor(torch.Tensor):
    """device 是 cuda:0、数据在 self.elem（CPU）里的张量。"""

    elem: torch.Tensor

    @staticmethod
    def __new__(cls, elem: torch.Tensor) -> "EmulatedCudaTensor":
        r = torch.Tensor._make_wrapper_subclass(cls, elem.size(), strides=elem.stride(),
                                                storage_offset=elem.storage_offset(), dtype=elem.dtype,
                                                layout=elem.layout, device=CUDA0, requires_grad=elem.requires_grad)
        r.elem = elem
        return r

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        return run(func, args, kwargs or {})

    def tolist(self):  # torch 的 tolist 不收张量子类；真 CUDA 上它是一次读回
        _sync("tolist", "Tensor.tolist")
        return self.elem.tolist()

    def numpy(self, *, force: bool = False):  # 真 CUDA 上 .numpy() 直接报错
        raise TypeError("can't convert cuda:0 device type tensor to numpy. Use Tensor.cpu() to copy the tensor "
                        "to host memory first.")

    def __repr__(self, *, tensor_contents=None) -> str:
        return f"{self.elem!r}（模拟的 cuda:0）"


class CudaMode(TorchDispatchMode):
    """接住 device='cuda' 的工厂函数（它们的参数里还没有 cuda 张量，子类的 __torch_dispatch__ 轮不到）。"""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False  # 不套 torch._dynamo.disable：每个算子都经过这里，那层包装比这里的活还贵；这里没有 torch.compile

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        on_cuda = any(issubclass(t, EmulatedCudaTensor) for t in types)  # types：参数里张量子类的类型
        if not on_cuda and not kwargs.get("pin_memory") and not _names_cuda(args, kwargs):
            return func(*args, **kwargs)  # 和 cuda 无关的算子（比如 HF 的参照在 CPU 上算）：原样放过
        return run(func, args, kwargs)


def _names_cuda(args, kwargs) -> bool:
    """参数里写着 device='cuda'（工厂函数、.to）。cuda 张量不用在这里找：types 里有它的类型就是碰到了。"""
    return _is_cuda(kwargs.get("device")) or any(isinstance(a, torch.device) and a.type == "cuda" for a in args)


def leaves(args, kwargs=None) -> list:
    """aten 算子的参数和结果最多嵌一层（Tensor[]、Tensor?[]、几个输出的 tuple）：每个算子都走这里，
    比 torch 的 pytree 快一个数量级。"""
    out = []
    for a in (*args, *(kwargs or {}).values()):
        if isinstance(a, (list, tuple)):
            out.extend(a)
        else:
            out.append(a)
    return out


def map_tensors(fn, x):
    """x（张量、一层 list / tuple、别的原样）里的每个张量换成 fn(张量)。"""
    if isinstance(x, torch.Tensor):
        return fn(x)
    if isinstance(x, (list, tuple)):
        items = [fn(a) if isinstance(a, torch.Tensor) else a for a in x]
        return type(x)(*items) if hasattr(x, "_fields") else type(x)(items)
    return x


def _device(t: torch.Tensor) -> torch.device:
    return CUDA0 if isinstance(t, EmulatedCudaTensor) else t.device


def _unwrap(t: torch.Tensor) -> torch.Tensor:
    return t.elem if isinstance(t, EmulatedCudaTensor) else t


def _is_cuda(d) -> bool:
    return d is not None and torch.device(d).type == "cuda"


_WRITES_FIRST: dict = {}  # 算子 -> 第一个参数是不是被原地改写的（schema 每个算子只看一次）


def _mutated_arg(func, args, kwargs):
    """原地算子（add_、copy_、index_put_…）和 out= 返回被改的那个参数本身，而不是新包一层。"""
    if "out" in kwargs:
        return kwargs["out"]
    writes = _WRITES_FIRST.get(func)
    if writes is None:
        first = func._schema.arguments[:1]
        writes = _WRITES_FIRST[func] = bool(first and first[0].alias_info is not None and first[0].alias_info.is_write)
    return args[0] if writes else None


def _on_gpu(t) -> bool:
    return isinstance(t, torch.Tensor) and _device(t).type == "cuda"


def record_sync(func, args, kwargs, flat: list | None = None) -> None:
    """这个算子在真 CUDA 上要不要读回主存（rule host-sync）：要就记进 SYNCS。模拟的和真的 cuda 张量一样判断。"""
    flat = leaves(args, kwargs) if flat is None else flat
    if not any(_on_gpu(t) for t in flat) and not _is_cuda(kwargs.get("device")):
        return
    if func is aten._local_scalar_dense.default:
        _sync("item", func.name())
    elif func in DATA_DEPENDENT:
        _sync("data_dependent", func.name())
    elif func in ADVANCED_INDEXING and any(i is not None and i.dtype == torch.bool for i in args[1]):
        _sync("data_dependent", f"{func.name()}（bool 下标）")
    elif func in ADVANCED_INDEXING and any(i is not None and not _on_gpu(i) for i in args[1]):
        _sync("to_device_blocking", f"{func.name()}（CPU 上的下标先拷上设备）")
    elif func in (aten._to_copy.default, aten.copy_.default):
        src_gpu, dst_gpu, non_blocking = _copy_ends(func, args, kwargs)
        if src_gpu and not dst_gpu:
            _sync("to_host", func.name())
        elif dst_gpu and not src_gpu and not non_blocking:  # 上传不带 non_blocking：拷完还要等流（memcpy_and_sync）
            _sync("to_device_blocking", func.name())


def _copy_ends(func, args, kwargs) -> tuple[bool, bool, bool]:
    """一次拷贝（_to_copy 或 copy_）：源在不在 GPU 上、目标在不在 GPU 上、带不带 non_blocking。"""
    if func is aten._to_copy.default:
        return _on_gpu(args[0]), _is_cuda(kwargs.get("device") or _device(args[0])), bool(kwargs.get("non_blocking"))
    return _on_gpu(args[1]), _on_gpu(args[0]), bool(args[2] if len(args) > 2 else kwargs.get("non_blocking"))


class SyncCounter(TorchDispatchMode):
    """真 GPU 上：不改任何算子，只按同样的规则记下读回主存的每一次。"""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        record_sync(func, args, kwargs)
        return func(*args, **kwargs)


def host_args(args, kwargs) -> tuple[tuple, dict]:
    """拆出里面的 CPU 张量、device='cuda' 换成 CPU：在 CPU 上真算用的参数（run 和 CUDA 图都用它）。"""
    u_args = tuple(map_tensors(_unwrap, a) for a in args)
    u_kwargs = {k: map_tensors(_unwrap, v) for k, v in kwargs.items()}
    if _is_cuda(u_kwargs.get("device")):
        u_kwargs["device"] = CPU
    if u_kwargs.get("pin_memory"):
        u_kwargs["pin_memory"] = False  # rule factory：CPU-only 的 torch 没有页锁定内存的分配器
    return u_args, u_kwargs


def call_on_host(func, args, kwargs):
    """在 CPU 上真算一遍。"""
    u_args, u_kwargs = host_args(args, kwargs)
    return func(*u_args, **u_kwargs)


def run(func, args, kwargs):
    if func.has_kernel_for_dispatch_key(torch._C.DispatchKey.CompositeImplicitAutograd):
        with CudaMode():  # inference_mode 下 aten.to.device 这类组合算子也会来：拆成基本算子，再各自走一遍
            out = func.decompose(*args, **kwargs)
        if out is not NotImplemented:
            return out
    index_devices = []
    plain_args = args
    if func in ADVANCED_INDEXING:  # 下标另算（rule index-cpu-indices）
        index_devices = [_device(i) for i in args[1] if i is not None]
        plain_args = (args[0], *args[2:])
    flat = leaves(args, kwargs)
    plain = flat if plain_args is args else leaves(plain_args, kwargs)
    check_devices(func, [(t, _device(t)) for t in plain if isinstance(t, torch.Tensor)], index_devices)

    record_sync(func, args, kwargs, flat)
    on_cuda = any(isinstance(t, EmulatedCudaTensor) for t in flat)
    if "device" in kwargs and kwargs["device"] is not None:
        on_cuda = _is_cuda(kwargs["device"])  # 工厂函数和 .to(device) 在目标设备上出结果
    if func is aten.copy_.default and isinstance(args[0], EmulatedCudaTensor):
        on_cuda = True

    out = call_on_host(func, args, kwargs)
    mutated = _mutated_arg(func, args, kwargs)
    if mutated is not None:
        out = mutated
    elif on_cuda:
        with torch.inference_mode(False):  # 包装本身不是 inference 张量：视图算子之后 autograd 还要给它设版本号
            out = map_tensors(EmulatedCudaTensor, out)
    if on_cuda:  # 设备上的算子进正在录的图（rule graph-capture）；主存里的活不进
        Capture.add(func, args, kwargs, out)
    return out
