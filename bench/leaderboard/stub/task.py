"""Stand-in for the leaderboard's task.py (amd-mixed-mla): the type aliases a submission
imports with `from task import input_t, output_t`. The harness puts this directory first on
sys.path of the process that imports the submission."""
from typing import TypeVar

import torch

input_t = TypeVar("input_t", bound=tuple[torch.Tensor, dict, torch.Tensor, torch.Tensor, dict])
output_t = TypeVar("output_t", bound=torch.Tensor)
