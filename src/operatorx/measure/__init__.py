"""How numbers are taken: timing strategies, their shared loop, statistics, telemetry, kernels."""

from operatorx.measure.host_clock import HostClockTiming
from operatorx.measure.host_time import HostTimeSettings, HostTiming
from operatorx.measure.measurement import Measurement, NotMeasurable
from operatorx.measure.settings import TimingSettings
from operatorx.measure.stats import summarize
from operatorx.measure.telemetry import Telemetry, TelemetrySampler

__all__ = ["HostClockTiming", "HostTimeSettings", "HostTiming", "Measurement", "NotMeasurable", "TimingSettings",
           "summarize", "Telemetry", "TelemetrySampler"]
