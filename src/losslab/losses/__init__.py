"""losslab.losses."""
