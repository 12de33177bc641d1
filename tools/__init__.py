"""课程的工具：在仓库根目录下用 python -m tools.X 运行（例如 python -m tools.run_tests ch3）。"""
