"""losslab.backends."""
