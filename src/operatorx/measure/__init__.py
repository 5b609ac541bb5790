"""How numbers are taken: timing strategies, their shared loop, statistics, telemetry, kernels.

The names load on first use (`operatorx.lazy`): the run's settings import two light modules of this
package, and the parent of a sweep needs them before it spawns its workers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from operatorx.lazy import lazy_names

if TYPE_CHECKING:
    from operatorx.measure.host_clock import HostClockTiming
    from operatorx.measure.host_time import HostTimeSettings, HostTiming
    from operatorx.measure.measurement import Measurement, NotMeasurable
    from operatorx.measure.settings import TimingSettings
    from operatorx.measure.stats import summarize
    from operatorx.measure.telemetry import Telemetry, TelemetrySampler

__all__ = ["HostClockTiming", "HostTimeSettings", "HostTiming", "Measurement", "NotMeasurable", "TimingSettings",
           "summarize", "Telemetry", "TelemetrySampler"]

_HOME = {"HostClockTiming": "operatorx.measure.host_clock", "HostTimeSettings": "operatorx.measure.host_time",
         "HostTiming": "operatorx.measure.host_time", "Measurement": "operatorx.measure.measurement",
         "NotMeasurable": "operatorx.measure.measurement", "TimingSettings": "operatorx.measure.settings",
         "summarize": "operatorx.measure.stats", "Telemetry": "operatorx.measure.telemetry",
         "TelemetrySampler": "operatorx.measure.telemetry"}

__getattr__ = lazy_names(__name__, _HOME)
