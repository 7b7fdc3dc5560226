"""losslab.stats."""
