"""course.py demo 在忙的机器上说一声：别的程序（和宿主机的 steal）占了多少 CPU，上面打印的时间不准。"""

import os
import re
import subprocess
import sys
import time
import types

import pytest

from tools.bench import machine


def _fake(monkeypatch, busy: tuple[float, float], own: tuple[float, float], steal=(0.0, 0.0)) -> None:
    """全机忙着的 CPU 秒、自己（含子进程）用的 CPU 秒、steal 秒，各给前后两个读数；2 个核。"""
    ticks = iter(zip(busy, steal))
    times = iter(types.SimpleNamespace(user=u, system=0.0, children_user=0.0, children_system=0.0) for u in own)
    monkeypatch.setattr(machine, "_cpu_ticks", lambda: next(ticks))
    monkeypatch.setattr(os, "times", lambda: next(times))
    monkeypatch.setattr(os, "cpu_count", lambda: 2)


def test_own_cpu_is_not_counted_as_load(monkeypatch):
    """自己（和子进程）用的 CPU 不算"别的程序"：全机忙着的都是自己时不提醒。"""
    _fake(monkeypatch, busy=(100.0, 102.0), own=(0.0, 2.0))
    out, note = machine.call_noting_load(lambda: time.sleep(1.0) or 7)
    assert out == 7 and note is None, note
    _fake(monkeypatch, busy=(100.0, 102.0), own=(0.0, 0.5))  # 1.5 CPU 秒是别人的：约 1.5 / (1 s × 2 核) > 25%
    out, note = machine.call_noting_load(lambda: time.sleep(1.0))
    assert note is not None and "这台机器正忙" in note, note


def test_others_and_steal_are_named(monkeypatch):
    _fake(monkeypatch, busy=(0.0, 4.0), own=(0.0, 0.0), steal=(0.0, 1.0))
    _, note = machine.call_noting_load(lambda: time.sleep(1.0))
    steal = re.search(r"steal (\d+)%", note or "")
    assert steal and 30 <= int(steal.group(1)) <= 50 and "（2 核）" in note, note  # 1 steal 秒 / (≥ 1 s × 2 核)


@pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="读 /proc/stat（Linux）")
def test_a_real_burner_is_noticed():
    """真的另起几个进程把每个核都占满：提醒出现。"""
    burners = [subprocess.Popen([sys.executable, "-c", "import time\nt=time.time()+3\nwhile time.time()<t: pass"])
               for _ in range(os.cpu_count() or 1)]
    try:
        time.sleep(0.3)
        _, note = machine.call_noting_load(lambda: time.sleep(1.5))
    finally:
        for p in burners:
            p.wait()
    assert note and "这台机器正忙" in note, note
