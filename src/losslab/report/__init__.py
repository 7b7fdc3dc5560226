"""losslab.report."""
