"""losslab.engine."""
