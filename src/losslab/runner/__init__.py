"""losslab.runner."""
