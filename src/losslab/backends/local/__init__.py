"""losslab.backends.local."""
