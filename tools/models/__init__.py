"""模型：用哪个（find，演示、测试、书、trace、bench 都问它）、目录和命令的名字（names）、从 PyPI 做真的小模型
（make_smollm2）、离线的随机权重小模型（make_tiny_models，测试和没有网时用）。
"""
