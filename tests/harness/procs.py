"""几个子进程同时跑、一起收：两个 2 核的 CPU 上串着跑太慢，而任何一个挂住都不能让别的留下来。"""

from __future__ import annotations

import subprocess


def collect(procs: dict[str, subprocess.Popen], timeout: float) -> dict[str, subprocess.CompletedProcess]:
    """等每个进程结束，返回 名字 -> CompletedProcess；超时或出错时把还活着的都杀掉再抛出。"""
    results = {}
    try:
        for name, proc in procs.items():
            out, err = proc.communicate(timeout=timeout)
            results[name] = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return results
