"""Finished runs read back: tables side by side, a paper's table over seeds, costs, and a run reopened
from its checkpoints for analysis or evaluation."""
