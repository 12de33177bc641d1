"""Engine：把前五章的部件按官方的顺序装起来；给一个填好的 Batch，返回每个请求的下一个 token。"""

from __future__ import annotations

import dataclasses
import math
import os
from datetime import timedelta
from typing import NamedTuple

import torch
import torch.distributed as dist

from minisgl.attention import create_attention_backend
from minisgl.core import Batch, Context, Req, reset_global_ctx, set_global_ctx
from minisgl.distributed import reset_tp_info, set_tp_info
from minisgl.kernel import to_huge_pages
from minisgl.kvcache import create_kvcache_pool
from minisgl.models import create_model, load_weight
from minisgl.utils import div_ceil, div_even, torch_dtype

from .config import EngineConfig
from .graph import GraphRunner
from .sample import BatchSamplingArgs, Sampler


class _CopyDone:
    """CPU 上 token 已经在主存里了：给调用方一个和 torch.cuda.Event 一样能 synchronize() 的替身。"""

    def synchronize(self) -> None:
        pass


def available_memory(device: torch.device) -> int | None:
    """这台机器上还能放 KV 池的字节数（GPU：显存的空闲量；CPU：空闲的物理内存），查不到时 None。
    _determine_num_pages 只经这一个函数问内存：测试要控制"有多少内存"时，替换的就是它。"""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    if hasattr(os, "sysconf") and "SC_AVPHYS_PAGES" in os.sysconf_names:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return None


class ForwardOutput(NamedTuple):
    next_tokens_gpu: torch.Tensor  # (bs,) int32，在引擎的设备上
    next_tokens_cpu: torch.Tensor  # (bs,) int32，在 CPU 上
    copy_done_event: torch.cuda.Event | _CopyDone
    logits: torch.Tensor  # (bs, V)，交给采样器的那份；只多留一个引用，不拷贝也不同步（重放 CUDA 图时下一步会覆盖它）


def _adjust_config(config: EngineConfig) -> EngineConfig:
    """和官方一样，先定下配置再建东西：阶段一只有 torch 一个能用的后端。"""
    if config.attention_backend == "auto":
        return dataclasses.replace(config, attention_backend="torch")
    return config


class Engine:
    """按官方的顺序建好一切（check_tp、set_tp_info 在 __init__ 里，其余在 _init 里）；forward_batch 一步一个 token。"""

    def __init__(self, config: EngineConfig) -> None:
        config.check_tp()  # 切不开就在建进程组之前说清楚是哪一项
        set_tp_info(config.tp_info.rank, config.tp_info.size)
        self._saved_num_threads = torch.get_num_threads()  # 线程数是整个进程的：shutdown 时还回去
        try:
            self._init(_adjust_config(config))
        except BaseException:  # 初始化失败也要清掉全局状态，否则这个进程再也建不了 Engine
            self._release_globals(config.tp_info.size)
            raise

    def _init(self, config: EngineConfig) -> None:
        # ---------------- 设备、线程、Context、进程组
        self.config = config
        self.device = config.rank_device
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        elif "OMP_NUM_THREADS" not in os.environ:  # decode 读权重是访存密集的：用上能用的所有核，TP 的各进程平分
            cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
            torch.set_num_threads(max(1, cores // config.tp_info.size))
        torch.manual_seed(42)
        self.dtype = config.dtype
        self.ctx = Context(config.page_size)
        set_global_ctx(self.ctx)
        self.tp_cpu_group = self._init_communication(config)

        # ---------------- 模型：meta 上构造，流式加载（第 3 章）
        model_config = config.model_config
        if config.max_seq_len > model_config.rotary_config.max_position:
            raise ValueError(f"max_seq_len {config.max_seq_len} 超过了模型的 max_position_embeddings "
                             f"{model_config.rotary_config.max_position}")
        if config.page_size > config.max_seq_len:  # 多出来的槽位没有请求用得到，只白占内存
            raise ValueError(f"EngineConfig.page_size={config.page_size} 大于 max_seq_len={config.max_seq_len}")
        with torch.device("meta"), torch_dtype(config.dtype):
            self.model = create_model(model_config)
        self.model.load_state_dict(self._load_weight_state_dict(config))

        # ---------------- KV 池和页表：各多留一份给假请求（第 4 章）
        self.num_pages = self._determine_num_pages(config)
        self.kv_cache = create_kvcache_pool(model_config, num_pages=self.num_pages + 1, page_size=config.page_size,
                                            dtype=self.dtype, device=self.device)  # 最后一页留给假请求
        self.ctx.kv_cache = self.kv_cache
        num_tokens = self.num_pages * config.page_size
        self.max_seq_len = min(config.max_seq_len, num_tokens)
        align = math.lcm(32, config.page_size)
        self.page_table = torch.zeros((config.max_running_req + 1, div_ceil(self.max_seq_len, align) * align),
                                      dtype=torch.int32, device=self.device)  # 最后一行留给假请求
        self.ctx.page_table = self.page_table

        # ---------------- 注意力后端（要在 KV 池之后：构造时就拿 ctx.kv_cache）、采样器、假请求、GraphRunner
        self.attn_backend = create_attention_backend(config.attention_backend, model_config)
        self.ctx.attn_backend = self.attn_backend
        self.sampler = Sampler(self.device, model_config.vocab_size)
        self.dummy_req = Req(input_ids=torch.tensor([0], dtype=torch.int32), table_idx=config.max_running_req,
                             cached_len=0, output_len=1, uid=-1, sampling_params=None, cache_handle=None)
        self.page_table[config.max_running_req].fill_(num_tokens)  # 假请求的 KV 都写进假页
        self.graph_runner = GraphRunner(self.device, self.model, self.attn_backend, config.cuda_graph_bs,
                                        config.cuda_graph_max_bs, self.page_table.shape[1], model_config.vocab_size,
                                        self.dummy_req)  # GPU 上在这里录图（第 6 章"CUDA 图"一节）

    # --8<-- [start:init_communication]
    def _init_communication(self, config: EngineConfig) -> dist.ProcessGroup | None:
        """TP>1 才建进程组：dist.init_process_group(init_method=distributed_addr, timeout=…)，GPU 上另用
        dist.new_group(backend="gloo") 建 CPU 组。超时也用在之后的每次集合通信上：
        别的 rank 死了，这里等 distributed_timeout 秒后报错，而不是永远挂着。"""
        if config.tp_info.size == 1:
            return None
        timeout = timedelta(seconds=config.distributed_timeout)
        backend = "nccl" if self.device.type == "cuda" else "gloo"
        try:  # NCCL 的 init_process_group 不一定当场等齐各 rank，紧接着的 new_group 才等：两步一起算会合
            dist.init_process_group(backend, init_method=config.distributed_addr, rank=config.tp_info.rank,
                                    world_size=config.tp_info.size, timeout=timeout)
            return dist.new_group(backend="gloo", timeout=timeout) if backend == "nccl" else dist.group.WORLD
        except Exception as e:  # 原话往往只有一句 "Wait timeout"：补上是谁、在哪儿等
            raise RuntimeError(f"rank {config.tp_info.rank}（共 {config.tp_info.size} 个）在 {config.distributed_addr} "
                               f"会合（rendezvous）失败，进程组没建成"
                               f"（distributed_timeout={config.distributed_timeout} 秒）：{e}") from e
    # --8<-- [end:init_communication]

    def _load_weight_state_dict(self, config: EngineConfig) -> dict[str, torch.Tensor]:
        """load_weight 交出的每个张量先转成 self.dtype，再交给 to_huge_pages（CPU 上至少 2 MB 的放进 2 MB 大页：
        decode 每步把权重从头读到尾，见附录）。收一个放一个：收齐了再拷，峰值内存会多出最大的那个张量（词嵌入）。
        use_dummy_weight 时按 model.state_dict() 的形状随机生成。"""
        if config.use_dummy_weight:
            shapes = self.model.state_dict().items()
            return {k: to_huge_pages(torch.randn(v.shape, dtype=v.dtype, device=self.device)) for k, v in shapes}
        return {k: to_huge_pages(v.to(self.dtype)) for k, v in load_weight(config.model_path, self.model, self.device)}

    def _determine_num_pages(self, config: EngineConfig) -> int:
        """给了 num_page_override 就用它；否则按可用内存估算，但不超过 max_running_req 条满长序列用得到的页数。"""
        if config.num_page_override is not None:
            return config.num_page_override
        mc = config.model_config
        local_kv_heads = div_even(mc.num_kv_heads, config.tp_info.size, allow_replicate=True)  # 本 rank 的头数
        cache_per_page = 2 * mc.head_dim * local_kv_heads * config.page_size * self.dtype.itemsize * mc.num_layers
        useful = config.max_running_req * div_ceil(config.max_seq_len, config.page_size)  # 再多也用不上
        free = available_memory(self.device)
        if free is None:
            raise RuntimeError("这台机器上查不到可用内存：请设置 EngineConfig.num_page_override")
        num_pages = min(useful, int(config.memory_ratio * free) // cache_per_page)
        if num_pages < config.max_running_req:  # 每个同时在跑的请求至少要一页
            raise RuntimeError(f"KV 池只有 {num_pages} 页（每页 {cache_per_page} 字节），不够 max_running_req="
                               f"{config.max_running_req} 个请求每个一页：调小 max_running_req 或设 num_page_override")
        return num_pages

    def forward_batch(self, batch: Batch, args: BatchSamplingArgs) -> ForwardOutput:
        """查一次 batch → 前向 → 每个真请求 complete_one → 采样 → 拷回 CPU。假请求只参与前向，不采样。"""
        self.check_batch(batch)
        _to_device(batch, self.device)
        with self.ctx.forward_batch(batch):
            if self.graph_runner.can_use_cuda_graph(batch):
                logits = self.graph_runner.replay(batch)
            else:
                logits = self.model.forward()
        for req in batch.reqs:
            req.complete_one()
        logits = logits[:batch.size]
        next_tokens_gpu = self.sampler.sample(logits, args).to(torch.int32)
        next_tokens_cpu = next_tokens_gpu.to("cpu", non_blocking=self.device.type == "cuda")
        return ForwardOutput(next_tokens_gpu, next_tokens_cpu, self._copy_done_event(), logits)

    def _copy_done_event(self) -> torch.cuda.Event | _CopyDone:
        """GPU 上拷贝是异步的：torch.cuda.Event() 再 record()（记在当前流上、排在拷贝之后），
        调用方 synchronize() 之后才读 next_tokens_cpu。"""
        if self.device.type != "cuda":
            return _CopyDone()
        event = torch.cuda.Event()
        event.record()
        return event

    def check_batch(self, batch: Batch) -> None:
        """每个 batch 只在这里查一次（调度器填的、手工填的都一样）：只读主存里的整数，不引入同步。

        这些错误前向本身发现不了：只会悄悄给出错的 token，或者在设备上越界。"""
        if batch.phase not in ("prefill", "decode"):
            raise ValueError(f"batch.phase={batch.phase!r}：只能是 'prefill' 或 'decode'")
        if not batch.reqs:
            raise ValueError("batch.reqs 是空的：至少要有一个请求")
        rows = set()
        for r in batch.reqs:
            if not 0 <= r.table_idx < self.config.max_running_req:  # 最后一行留给假请求
                raise ValueError(f"{r}: table_idx 必须在 [0, max_running_req={self.config.max_running_req}) 里")
            if r.table_idx in rows:
                raise ValueError(f"{r}: 和同一个 batch 里的另一个请求共用 page table 第 {r.table_idx} 行，"
                                 f"KV 会写进同一批槽位")
            rows.add(r.table_idx)
            if not r.can_decode:
                raise ValueError(f"{r}: 已经生成完 output_len={r.output_len} 个 token（remain_len=0），不能再前向")
            if not 0 <= r.cached_len < r.device_len:
                raise ValueError(f"{r}: 需要 0 <= cached_len < device_len，这次前向才有新 token")
            if r.device_len > self.max_seq_len:
                raise ValueError(f"{r}: 有 {r.device_len} 个位置，超过了引擎的 max_seq_len={self.max_seq_len}")
            if batch.is_decode and r.extend_len != 1:
                raise ValueError(f"{r}: 标成 decode 的 batch 里每个请求只能有 1 个新 token，它有 {r.extend_len} 个"
                                 f"（这是 prefill）")
            _check_input_ids(r, self.sampler.vocab_size)
        _check_filled(batch)

    # --8<-- [start:shutdown]
    def shutdown(self) -> None:
        """释放图、拆掉进程组、清掉全局的 Context 和 TP 身份、还回线程数：之后同一个进程里可以再建 Engine。

        进程组拆掉时 TCP 端口随之释放；初始化中途失败时 __init__ 也调 _release_globals。"""
        self.graph_runner.destroy_cuda_graphs()
        self._release_globals(self.config.tp_info.size)

    def _release_globals(self, tp_size: int) -> None:
        """tp>1 且进程组建着时 dist.destroy_process_group()；清掉全局的 Context、TP 身份，还回线程数。"""
        if tp_size > 1 and dist.is_initialized():  # 只拆自己建的进程组
            dist.destroy_process_group()
        reset_global_ctx()
        reset_tp_info()
        torch.set_num_threads(self._saved_num_threads)
    # --8<-- [end:shutdown]


def _check_input_ids(req: Req, vocab_size: int) -> None:
    """这一步要前向的 token（主存里的 req.input_ids）都在词表里：越界的 id 在 CPU 上是一句 IndexError，
    在 GPU 上是设备端断言。调度器的 add_req 已经查过提示词、采样器只给出词表里的 id，这里挡的是手工填的 batch。"""
    new = req.input_ids[req.cached_len:req.device_len]
    if len(new) and not (0 <= int(new.min()) and int(new.max()) < vocab_size):
        bad = sorted({t for t in new.tolist() if not 0 <= t < vocab_size})
        raise ValueError(f"{req}: 这一步要前向的 token id {bad[:5]} 不在词表里（vocab_size={vocab_size}）")


def _to_device(batch: Batch, device: torch.device) -> None:
    """调用方可以在主存里填 input_ids、positions、out_loc（里程碑脚本就这样填）：前向之前在这里一次搬上引擎的设备，
    之后各层拿到的都已在设备上。CPU 上 .to 原样返回同一个张量，什么也不做。"""
    for name in ("input_ids", "positions", "out_loc"):
        setattr(batch, name, getattr(batch, name).to(device, non_blocking=True))


def _check_filled(batch: Batch) -> None:
    """调用方该填的字段都填了，长度对得上：len() 只读形状，不同步。"""
    missing = [f"batch.{n}" for n in ("padded_reqs", "input_ids", "positions", "out_loc", "attn_metadata")
               if not hasattr(batch, n)]
    if missing:
        raise RuntimeError(f"batch 还没准备好就前向了：缺少 {', '.join(missing)}"
                           f"（attn_metadata 由 attn_backend.prepare_metadata(batch) 设置）")
    if batch.padded_reqs[:batch.size] != batch.reqs:
        raise ValueError("batch.padded_reqs 必须以 batch.reqs 开头（假请求只能接在后面）")
    num_tokens = sum(r.extend_len for r in batch.padded_reqs)
    for name in ("input_ids", "positions", "out_loc"):
        if len(getattr(batch, name)) != num_tokens:
            raise ValueError(f"batch.{name} 有 {len(getattr(batch, name))} 个，"
                             f"padded_reqs 的 extend_len 之和是 {num_tokens}")
