"""第 5 章测试的本地配置：登记 gpu 标记（CI 没有 GPU，带这个标记的测试会说明原因后跳过）。"""


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: 需要 CUDA GPU 的测试（没有 GPU 的机器上跳过）")
