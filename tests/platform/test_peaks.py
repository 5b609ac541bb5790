from operatorx.platform import compute_class, peaks_for


def test_h200_row_and_longest_match():
    assert peaks_for("NVIDIA H200").memory_gbps == 4800.0
    assert peaks_for("NVIDIA H100 PCIe").memory_gbps == 2000.0
    assert peaks_for("NVIDIA H100 80GB HBM3").memory_gbps == 3350.0
    assert peaks_for("Some CPU") is None


def test_compute_class():
    assert compute_class("e4m3", "e4m3") == "fp8"
    assert compute_class("bf16", "bf16") == "bf16"
    assert compute_class("fp32", "fp32") == "fp32"
