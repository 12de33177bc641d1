"""C++ 核的并行循环（csrc/include/parallel.h）：带 OpenMP 编是 at::parallel_for，不带是直接调 torch 的 OpenMP
运行库（同一批线程）。两种都要做到：
- 工作线程里抛出的错（TORCH_CHECK）带回调用的线程，是一行 RuntimeError，进程不崩溃，之后的调用照常；
- fork 出来的子进程（--tp 在 CPU 上的 rank）里照常用几个线程算，结果和父进程逐位相同。
CI 在 MINISGL_KERNEL_OPENMP=0 下再跑一遍第 6 章的测试，两种都核对到。"""

from __future__ import annotations

import os
import signal

import pytest
import torch

from tests.ch6.test_kernel import _ext_or_skip


@pytest.fixture
def ext():
    return _ext_or_skip()


@pytest.fixture
def two_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def _attention_case(bad: int | None):
    """2 个请求、每个 256 个槽位，每个任务的活够大（grain = 1）：2 个线程时第二个请求在工作线程上算。"""
    g = torch.Generator().manual_seed(0)
    kc, vc = torch.randn(64, 1, 64, generator=g), torch.randn(64, 1, 64, generator=g)
    slots = torch.randint(0, 64, (2, 256), generator=g)
    if bad is not None:
        slots[1, -1] = bad
    return torch.randn(2, 1, 64, generator=g), kc, vc, slots, torch.ones(2, 256, dtype=torch.bool)


@pytest.mark.parametrize("threads", [2, 3])
def test_an_error_in_a_worker_thread_comes_back_in_one_line(ext, threads):
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        for _ in range(3):  # 出过错的池子照常接下一个并行区
            with pytest.raises(RuntimeError) as e:
                ext.decode_attention(*_attention_case(bad=64), 0.125)
            assert str(e.value).splitlines()[0] == "decode_attention: slot 64 is out of range [0, 64)"
        got = ext.decode_attention(*_attention_case(bad=None), 0.125)
        torch.set_num_threads(1)
        assert torch.equal(got, ext.decode_attention(*_attention_case(bad=None), 0.125))
    finally:
        torch.set_num_threads(before)


def test_the_kernel_threads_work_in_a_forked_child(ext, two_threads):
    """父进程先用几个线程算过（线程池已经起来了），再像 launch_tp 那样 fork（start_method() 先放掉 OpenMP 的池）：
    子进程里 2 个线程算出的结果和父进程的逐位相同，不卡住；fork 之后父进程也照常。"""
    from minisgl.server.launch import start_method

    x, w = torch.randn(4, 1000), torch.randn(3001, 1000)
    want = ext.small_linear(x, w)
    q, kc, vc, slots, mask = _attention_case(bad=None)
    want_attn = ext.decode_attention(q, kc, vc, slots, mask, 0.125)
    if start_method() != "fork":
        pytest.skip("有 GPU 的机器上 rank 用 spawn 起（fork 出来的进程里 CUDA 不能用）：fork 之后的线程池在这里用不上"
                    if torch.cuda.is_available() else
                    "这里的 rank 不用 fork 起（不是 Linux，或放不掉 OpenMP 的线程池）")
    pid = os.fork()
    if pid == 0:  # 子进程：只用 os._exit 出去，不回到 pytest
        code = 1
        try:
            signal.alarm(60)  # 卡住时被 SIGALRM 结束，父进程看得见
            ok = torch.equal(ext.small_linear(x, w), want) and torch.equal(
                ext.decode_attention(q, kc, vc, slots, mask, 0.125), want_attn)
            code = 0 if ok and ext.num_threads() == 2 else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, (
        f"子进程 {'被 signal ' + str(os.WTERMSIG(status)) + ' 结束' if os.WIFSIGNALED(status) else '的结果不对'}")
    assert torch.equal(ext.small_linear(x, w), want)
