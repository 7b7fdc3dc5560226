"""Tests of losslab.losses."""
