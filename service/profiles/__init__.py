"""Profile analysis: PyTorch profiler traces (one per rank) -> ``ProfileSummary``. Pure Python, no torch."""

from service.profiles.analyze import analyze_traces
from service.profiles.errors import TraceError
from service.profiles.models import HtaCompat, ProfileSummary, RankSummary

__all__ = ["HtaCompat", "ProfileSummary", "RankSummary", "TraceError", "analyze_traces"]
