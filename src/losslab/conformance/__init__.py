"""losslab.conformance."""
