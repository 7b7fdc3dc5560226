"""losslab.tasks."""
