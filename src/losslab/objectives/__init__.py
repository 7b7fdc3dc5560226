"""losslab.objectives."""
