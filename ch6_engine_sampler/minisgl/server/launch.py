"""--tp N 的进程管理：起 N 个进程，每个一个 rank，收齐各 rank 的结果；出错、被杀都不留下进程和临时文件。"""

from __future__ import annotations

import ctypes
import dataclasses
import os
import re
import signal
import socket
import sys
import threading
import time
from typing import Any, Callable, List

import torch
import torch.multiprocessing as mp

from minisgl.distributed import DistributedInfo
from minisgl.engine import EngineConfig

_PR_SET_PDEATHSIG = 1
_OMP_PAUSE_HARD = 2  # OpenMP 5.0 的 omp_pause_hard：线程池整个放掉，下一个并行区重新建


def free_addr() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"


def die_with_parent(parent_pid: int) -> None:
    """父进程（启动器）死了，rank 也退出：否则它们会一直跑到生成结束，甚至卡在集合通信上。"""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    else:  # 别的系统没有 prctl：后台线程盯着父进程号
        def watch() -> None:
            while os.getppid() == parent_pid:
                time.sleep(0.5)
            os._exit(1)

        threading.Thread(target=watch, daemon=True).start()
    if os.getppid() != parent_pid:  # 设好之前父进程就已经没了
        os._exit(1)


def start_method() -> str:
    """CPU（Linux）上 fork：spawn 出来的 rank 要重新 import 一遍 torch、transformers 和 minisgl，每个都要几秒，
    fork 直接继承。GPU 上仍然 spawn：CUDA 在 fork 出来的进程里不能用。fork 之前先放掉 OpenMP 的线程池：
    父进程算过东西，池里的线程不会跟到子进程里，子进程的第一个并行区就会一直等它们。
    放不掉（没找到运行库，或某一份没有这个函数、没放成）就 spawn。"""
    if torch.cuda.is_available() or not sys.platform.startswith("linux"):
        return "spawn"
    pauses = [getattr(ctypes.CDLL(path), "omp_pause_resource_all", None) for path in openmp_runtimes()]
    return "fork" if pauses and all(p is not None and p(_OMP_PAUSE_HARD) == 0 for p in pauses) else "spawn"


def openmp_runtimes() -> List[str]:
    """进程里载入的每个 OpenMP 运行库（libgomp、libiomp、libomp）的路径，按 /proc/self/maps。torch 的 aarch64
    wheel 把自带的 libgomp 载在局部作用域里，CDLL(None) 找不到它；别的扩展（如 sentencepiece）可能再带一份：都放掉。"""
    with open("/proc/self/maps") as f:
        paths = {cols[5].strip() for line in f if len(cols := line.split(maxsplit=5)) == 6}
    return sorted(p for p in paths if re.match(r"lib[gi]?omp[-.]", os.path.basename(p)))


def _worker(rank: int, run_rank: Callable[..., Any], config: EngineConfig, args: tuple, results,
            parent_pid: int) -> None:
    die_with_parent(parent_pid)
    config = dataclasses.replace(config, tp_info=DistributedInfo(rank, config.tp_info.size))
    results.put((rank, run_rank(config, *args)))


def launch_tp(config: EngineConfig, run_rank: Callable[..., Any], *args: Any) -> List[Any]:
    """起 tp 个进程（start_method()：CPU 上 fork，GPU 上 spawn），每个运行 run_rank(带上自己 rank 的 config, *args)，
    按 rank 返回结果。
    某个 rank 出错时抛 RuntimeError，只带那个 rank 的异常那一行（不是整段 traceback），并结束其余进程；
    卡在集合通信上的 rank 最多等 distributed_timeout 秒。"""
    size = config.tp_info.size
    if config.rank_device.type == "cuda" and size > torch.cuda.device_count():  # 每个 rank 一块卡：cuda:{rank}
        raise ValueError(f"每个 rank 要一块 GPU，这台机器只有 {torch.cuda.device_count()} 块；"
                         f"要在 CPU 上跑这 {size} 个 rank（gloo），加 --device cpu（EngineConfig.device='cpu'）")
    method = start_method()
    results = mp.get_context(method).Queue()
    ctx = mp.start_processes(_worker, args=(run_rank, config, args, results, os.getpid()), nprocs=size,
                             join=False, start_method=method)
    got = {}
    try:
        while not ctx.join(timeout=0.2):  # 边等边收，免得结果堵在管道里
            while not results.empty():
                rank, result = results.get()
                got[rank] = result
    except mp.ProcessRaisedException as e:  # e.msg 是 worker 的整段 traceback：读者要的是最后那一行
        last = [line for line in e.msg.strip().splitlines() if line.strip()][-1]
        raise RuntimeError(f"rank {e.error_index} 出错：{last}") from None
    finally:
        for p in ctx.processes:  # 正常结束时它们都已退出；出错或 Ctrl-C 时不留下孤儿
            if p.is_alive():
                p.terminate()
            p.join()
        for path in ctx.error_files:  # 出错的 rank 把 traceback 写在临时目录里；读过了就删掉
            if path and os.path.exists(path):
                os.remove(path)
    while len(got) < size:
        rank, result = results.get(timeout=config.distributed_timeout)
        got[rank] = result
    results.close()
    return [got[r] for r in range(size)]
