from operatorx.report import rows_markdown
from tests.report.rows import make_row, ranked_row


def _row(status, latency=None, message=None, host=None):
    metrics = {}
    if latency is not None:
        metrics.update(latency_us=latency, tflops=1.0, gbps=2.0, pct_peak=3.0, clock="device")
    if host is not None:
        metrics["host"] = {"host_us_per_call": host, "host_bound": host > (latency or 0)}
    return make_row(status, message=message, **metrics)


def test_markdown_rows_and_reasons():
    text = rows_markdown([_row("ok", 9.5, host=20.0).to_json(), _row("unsupported", message="a | b <i>")])
    lines = text.splitlines()
    assert lines[0].startswith("| # | case | scheme | status | latency_us | host_us |")
    assert "| 9.50 | 20.00 |" in lines[2] and "host-bound" in lines[2]
    assert "a \\| b &lt;i&gt;" in lines[3]


def test_a_long_note_is_written_whole():
    long = "needs tp·dp = 8 GPUs of one host; " + "word " * 60 + "THE-LAST-FLAG"
    text = rows_markdown([_row("unsupported", message=long)])
    assert "THE-LAST-FLAG" in text and ("word " * 60).strip() in text


def test_a_multi_rank_row_has_world_and_skew_and_a_single_rank_row_leaves_them_blank():
    lines = rows_markdown([ranked_row(0).to_json(), _row("ok", 9.5)]).splitlines()
    assert lines[0] == ("| # | case | scheme | status | latency_us | world | skew_us | TFLOP/s | GB/s | % peak "
                        "| note |")
    assert lines[2].startswith("| 0 | gemm 64x7168x2048 tp2 | bf16 | ok | 43.00 | 2 | 1.80 | 43.7 |")
    assert lines[3].startswith("| 0 | gemm 1x2x3 | bf16 | ok | 9.50 |  |  | 1.0 |")
