"""losslab.plan."""
