"""losslab: trustworthy post-training RL loss experiments.

One plan file answers four questions before GPU hours are spent: is my loss the paper's loss
(correctness preflight), are the arms comparable (restoration preflight), does the loss act in my
regime (activation gate), and which arm wins (paired evaluation and a pre-registered decision rule).
"""

__version__ = "0.1.0"
