"""python course.py test --arch aarch64（tools/arch/）在本机就能查的部分：用错了、这台机器跑不了时只说一行、退出码
非 0、什么也不动；摘要和本机的一样，没跑成的不算通过；根文件系统在仓库外面（tools/arch/cache.py），旧版本留在仓库里的
搬出去或者说出来，--clean 删掉它；拷进根里的只有普通文件和仓库里面的链接。真在 qemu 里跑要几分钟、要 root，这里不跑
（docs/testing.md）。"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tools.arch import cache as arch_cache, qemu as arch

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("argv,culprit", [(["--arch", "riscv64"], "riscv64"), (["--arch"], "--arch 只支持"),
                                          (["--arch", "aarch64", "--real"], "--real"),
                                          (["--arch=aarch64", "--no-docs"], "--no-docs"),
                                          (["--arch", "aarch64", "ch9"], "'ch9'"),
                                          (["--arch", "aarch64", "--clean", "ch6"], "--clean")])
def test_misuse_is_one_error_line(argv, culprit):
    """经由 course.py：命令行先查，查出错就停，不碰这台机器。"""
    res = subprocess.run([sys.executable, "course.py", "test", *argv], cwd=ROOT, capture_output=True, text=True,
                         timeout=120, check=False)
    out = (res.stdout + res.stderr).strip().splitlines()
    assert res.returncode == 2 and "Traceback" not in res.stdout + res.stderr, res.stdout + res.stderr
    assert len(out) == 1 and out[0].startswith("错误：") and culprit in out[0], out


@pytest.fixture
def host(monkeypatch, tmp_path):
    """一台假的 x86 Linux：不许跑任何命令，缓存和 binfmt_misc 都在 tmp_path 里；返回改它的函数。"""
    def refuse(*args, **kwargs):
        raise AssertionError(f"不该跑命令：{args}")

    monkeypatch.setattr(arch.subprocess, "run", refuse)
    monkeypatch.setattr(arch, "CACHE", tmp_path / "cache")
    monkeypatch.setattr(arch, "OLD", tmp_path / "repo" / ".cache" / "arch")
    monkeypatch.setattr(arch, "BINFMT", tmp_path / "binfmt_misc")
    monkeypatch.setattr(arch.platform, "system", lambda: "Linux")
    monkeypatch.setattr(arch.platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(arch.os, "geteuid", lambda: 0)
    monkeypatch.setattr(arch.shutil, "which", lambda exe: f"/usr/bin/{exe}")
    return monkeypatch


def _one_line(capsys, rc: int, *said: str) -> None:
    """最后一行是 错误：…，说出 said；之前只能有做到一半的那一步的进度行（以"…"结尾）。"""
    *steps, last = capsys.readouterr().out.strip().splitlines()
    assert last.startswith("错误：") and all(s in last for s in said) and all(s.endswith("…") for s in steps), last
    assert rc == 1


def test_not_root_is_one_line(host, capsys, tmp_path):
    host.setattr(arch.os, "geteuid", lambda: 1000)
    _one_line(capsys, arch.run_arch(["--arch", "aarch64"]), "要 root", "sudo")
    assert not (tmp_path / "cache").exists()


def test_no_qemu_and_no_apt_get_is_one_line(host, capsys):
    host.setattr(arch.shutil, "which", lambda exe: None)
    _one_line(capsys, arch.run_arch(["--arch", "aarch64"]), "qemu-user-static", "mmdebstrap", "apt-get")


@pytest.mark.parametrize("entry", [None, "disabled\nflags: F\n", "enabled\ninterpreter /usr/bin/qemu\nflags: P\n"])
def test_qemu_not_usable_from_a_chroot_is_one_line(host, capsys, tmp_path, entry):
    """binfmt_misc 挂着、命令都在，qemu-aarch64 却没登记、没启用或没有 F 标志（chroot 里找不到解释器）：不去建根。
    没登记时要登记一次：这里换成一个失败的命令，原因是它输出的最后一行。"""
    (tmp_path / "binfmt_misc").mkdir()
    (tmp_path / "binfmt_misc" / "register").write_text("")
    if entry is not None:
        (tmp_path / "binfmt_misc" / "qemu-aarch64").write_text(entry)
    host.setattr(arch, "_run", lambda cmd, **kw: (2, "update-binfmts: warning: qemu-aarch64 not in database"))
    said = "F 标志" if entry and entry.startswith("enabled") else "not in database"
    _one_line(capsys, arch.run_arch(["--arch", "aarch64"]), said)
    assert not (tmp_path / "cache").exists()


def test_on_an_aarch64_machine_it_says_run_natively(host, capsys):
    host.setattr(arch.platform, "machine", lambda: "aarch64")
    _one_line(capsys, arch.run_arch(["--arch", "aarch64"]), "本身就是 aarch64", "--no-real")


def test_a_run_that_did_not_happen_is_a_failure(host, capsys, tmp_path):
    """根里的 pytest 没跑起来（比如 chroot 报 Exec format error）：摘要是 0 passed, 1 failed，退出码 1，不算通过。
    摘要和 tools.run_tests 的一样，最后一行是 pytest 式的计数。"""
    for name in ("prepare_host", "ensure_root"):
        host.setattr(arch, name, lambda *a: Path("/nonexistent"))
    host.setattr(arch, "sync_src", lambda root: 3)
    fake = "import sys; print('chroot: failed to run command: Exec format error'); sys.exit(126)"
    host.setattr(arch, "jobs", lambda root, a, names: [("aarch64 · 假的", [sys.executable, "-c", fake], {})])
    assert arch.run_arch(["--arch", "aarch64"]) == 1
    out = capsys.readouterr().out.strip().splitlines()
    assert "0 passed, 1 failed, 0 skipped" in out and any(line.startswith("失败  aarch64 · 假的") for line in out), out
    assert out[-1].startswith("0 passed, 1 failed"), out
    where = out[out.index("0 passed, 1 failed, 0 skipped") - 1]  # 摘要前一行：根在哪、多大、怎么删
    assert str(tmp_path / "cache" / "aarch64") in where and "--arch aarch64 --clean" in where, where


def test_a_second_run_on_the_same_root_is_refused(host, capsys, tmp_path):
    """两次 --arch aarch64 同时跑：第二次会把第一次正在用的 /src 删掉重拷，所以它说一行就走，不碰根。"""
    host.setattr(arch, "prepare_host", lambda a: None)
    host.setattr(arch, "ensure_root", lambda a: (_ for _ in ()).throw(AssertionError("第二次不该去建根")))
    with arch._lock("aarch64"):
        _one_line(capsys, arch.run_arch(["--arch", "aarch64"]), "正在用同一个根")
    with arch._lock("aarch64"):  # 第一次跑完，锁就放开了
        pass


def test_default_is_the_whole_ch6_small_model_tier():
    """不点名时跑第 6 章的全部小模型一档（C++ 核只在第 6 章）：里面有每个小算子对退路、核开和关的逐 token 对齐。"""
    (name, cmd, _), = arch.jobs(Path("/r"), "aarch64", [])
    assert cmd[-3:] == ["tests", "--checkpoint", "ch6_engine_sampler"] and "ch6_engine_sampler" in name
    kernel = (ROOT / "tests/ch6/test_kernel.py").read_text(encoding="utf-8")
    assert "def test_engine_matches_hf_on_both_paths" in kernel and '["kernel", "F.linear"]' in kernel
    assert (ROOT / "tests/ch6/test_kernel_ops.py").is_file()
    (_, cmd, _), = arch.jobs(Path("/r"), "aarch64", ["ch4_kv_pool"])
    assert cmd[-3:] == ["tests", "--checkpoint", "ch4_kv_pool"]


def test_host_sys_is_never_mounted_into_the_root():
    """aarch64 的 torch 读到本机（x86）的 /sys 会在 import 时崩：只挂一个 tmpfs。"""
    script = arch.in_root(Path("/r"), ["true"])[6]
    assert not any(f"{how} /sys" in script for how in ("--bind", "--rbind", "-t sysfs")), script
    assert 'mount -t tmpfs sys "$R/sys"' in script


def test_the_root_gets_the_pinned_versions():
    """根里装的版本就是 requirements.txt 钉的：测试对齐的参考输出取决于版本。"""
    reqs = (ROOT / "requirements.txt").read_text(encoding="utf-8")
    pins = arch._pins()
    assert len(pins) == len(arch.WHEELS) and all(f"\n{p}" in f"\n{reqs}" for p in pins)


def test_the_root_lives_outside_the_repository(monkeypatch, tmp_path):
    """根（几个 GB，有设备文件）不在仓库里：在用户的缓存目录，按仓库的路径取名（两份克隆不共用 /src）。"""
    assert ROOT not in arch.CACHE.parents and arch.CACHE.parent.name == "minisgl-course"
    assert arch.CACHE.name.startswith(f"arch-{ROOT.name}-")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert arch_cache.cache_home() == tmp_path
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/dir")  # XDG 规范：相对路径不算
    assert arch_cache.cache_home() == Path.home() / ".cache"


def _old_root(tmp_path: Path) -> Path:
    """旧版本留在仓库 .cache/arch/aarch64 的根：一个文件、一个指向 /proc 的链接、和现在一样的键。"""
    old = tmp_path / "repo" / ".cache" / "arch" / "aarch64"
    (old / "root" / "dev").mkdir(parents=True)
    (old / "root" / "etc").mkdir()
    (old / "root" / "etc" / "os-release").write_text("bookworm\n")
    (old / "root" / "dev" / "fd").symlink_to("/proc/self/fd")
    (old / "ready").write_text(arch._key("aarch64"))
    return old


def test_an_old_root_in_the_repository_is_moved_out(host, capsys, tmp_path):
    """同一个文件系统：改名搬到缓存目录（不复制：复制会读设备文件），仓库里不留；搬过来的根直接用，不重建。"""
    _old_root(tmp_path)
    host.setattr(arch, "_build", lambda *a: (_ for _ in ()).throw(AssertionError("搬过来的根不该重建")))
    (tmp_path / "cache" / "aarch64").mkdir(parents=True)
    root = arch.ensure_root("aarch64")
    assert root == tmp_path / "cache" / "aarch64" / "root" and (root / "etc" / "os-release").is_file()
    assert not arch.OLD.exists() and (root / "dev" / "fd").is_symlink()
    out = capsys.readouterr().out
    assert "搬到了" in out and "用缓存的根文件系统" in out, out


def test_an_old_root_that_cannot_be_moved_is_named_with_how_to_remove_it(host, capsys, tmp_path):
    """另一个文件系统（rename 报 EXDEV）：不复制，说一行它在哪、多大、怎么删；--clean 把缓存目录里的和仓库里的
    都删掉（连同空下来的目录），再来一次说没有了。"""
    old = _old_root(tmp_path)
    new = tmp_path / "cache" / "aarch64"
    (new / "root").mkdir(parents=True)
    (new / "ready").write_text("旧的键")
    with host.context() as m:
        m.setattr(os, "rename", lambda *a: (_ for _ in ()).throw(OSError(errno.EXDEV, "Invalid cross-device link")))
        arch_cache.adopt_old("aarch64", tmp_path / "cache", arch.OLD)
    line, = capsys.readouterr().out.splitlines()
    assert str(old) in line and "--arch aarch64 --clean" in line and old.is_dir() and new.is_dir(), line
    assert arch.run_arch(["--arch", "aarch64", "--clean"]) == 0
    out = capsys.readouterr().out
    assert "删掉了" in out and str(old) in out and str(new / "root") in out, out
    assert not arch.OLD.exists() and not (tmp_path / "cache").exists()  # 仓库的 .cache 里还有别的：留着
    assert arch.run_arch(["--arch", "aarch64", "--clean"]) == 0
    assert "没有缓存的根文件系统" in capsys.readouterr().out


def test_disk_usage_reads_no_device_and_follows_no_link(tmp_path):
    """量根的大小只 lstat：指向设备、指向 /proc 和目录外面的链接、命名管道都不读不跟。"""
    (tmp_path / "r" / "dev").mkdir(parents=True)
    (tmp_path / "r" / "dev" / "zero").symlink_to("/dev/zero")
    (tmp_path / "r" / "dev" / "fd").symlink_to("/proc/self/fd")
    (tmp_path / "r" / "up").symlink_to(tmp_path)
    os.mkfifo(tmp_path / "r" / "pipe")
    (tmp_path / "r" / "data").write_bytes(b"x" * 100_000)
    assert 100_000 <= arch_cache.disk_usage(tmp_path / "r") < 200_000


def test_only_plain_files_and_links_inside_reach_src(monkeypatch, tmp_path):
    """拷进根里 /src 的：普通文件，指向仓库里面的链接（照样是链接）；指向仓库外面的链接（比如 models ->
    别处）不拷，根里没有它指的东西。"""
    repo = tmp_path / "repo"
    (repo / "pkg").mkdir(parents=True)
    (repo / "pkg" / "a.py").write_text("A = 1\n")
    (repo / "pkg" / "b.py").symlink_to("a.py")
    (repo / "models").symlink_to(tmp_path, target_is_directory=True)
    (repo / "gone.py").symlink_to(tmp_path / "nothing")
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    monkeypatch.setattr(arch_cache, "ROOT", repo)
    root = tmp_path / "root"
    root.mkdir()
    assert arch_cache.sync_src(root) == 2
    src = root / "src"
    assert (src / "pkg" / "a.py").read_text() == "A = 1\n" and os.readlink(src / "pkg" / "b.py") == "a.py"
    assert not os.path.lexists(src / "models") and not os.path.lexists(src / "gone.py")
