"""别的机器：course.py test --arch aarch64 在 qemu-user 模拟的 arm64 Debian 里跑测试（qemu），
根文件系统放在仓库外面的缓存里（cache）。只有 course.py 调用它。
"""
