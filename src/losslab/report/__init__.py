"""losslab.report: report.json and a self-contained report.html built from a run directory."""

from losslab.report.build import ReportPaths, build_report, collect

__all__ = ["ReportPaths", "build_report", "collect"]
