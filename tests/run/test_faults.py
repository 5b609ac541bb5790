"""Reading a hung worker's Python stacks (run/faults.py hung_at)."""

from __future__ import annotations

from operatorx.run.faults import hung_at

DUMP = """some earlier log line
Thread 0x00007f0000000001 (most recent call first):
  File "/usr/lib/python3.12/threading.py", line 355 in wait
  File "/x/operatorx/run/worker.py", line 70 in _open
Current thread 0x00007f0000000002 (most recent call first):
  File "/x/vllm/model_executor/layers/fused.py", line 412 in forward
  File "/x/operatorx/measure/timer.py", line 88 in run
  File "/x/operatorx/run/worker.py", line 101 in _serve
  File "/x/operatorx/run/worker.py", line 140 in main
"""


def test_hung_at_names_the_innermost_frame_of_the_thread_in_the_case_loop():
    assert hung_at(DUMP) == "fused.py:412 in forward"


def test_without_a_stack_in_the_case_loop_there_is_no_answer():
    assert hung_at("no stacks here") is None
    assert hung_at(DUMP.replace("_serve", "other")) is None


def test_the_last_dump_in_the_log_is_the_one_read():
    later = DUMP.replace("fused.py\", line 412", "sparse.py\", line 9")
    assert hung_at(DUMP + later) == "sparse.py:9 in forward"
