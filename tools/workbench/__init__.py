"""读者的工作台：course.py 的 start、check、progress、demo DIR 背后的代码，只有 course.py 和 run_tests.py 调用它。

course_start 建 my_chN（目录在 workspace，桩在 stubs，--from 搬运读者的函数在 carry_code）；course_record、
task_table 记下和排出按任务的进度；own_demo 在读者的引擎上跑里程碑；time_check 量 check 要多久（作者用）。
"""
